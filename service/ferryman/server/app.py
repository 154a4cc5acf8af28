"""Wiring: configuration, backend, engine, the APIs of ``ferryman.apis.APIS``, the gRPC and
HTTP servers, and graceful shutdown.

What runs is started in the order of ``Service._lifespan`` and stopped in reverse, each
part an async context manager (as aiohttp's cleanup contexts): a start that fails part way
leaves the stack holding exactly what was started, and ``stop`` unwinds that.

A signalled process first drains (``Service.drain``: health reports not serving while
every API answers on), then stops: the gRPC server refuses new calls, the long streams
(Envoy's quota streams, Sessions, watch streams) are ended so that their clients move at
once, calls in flight get the grace period, and the parts stop in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc

from ferryman import heap
from ferryman.access import Access, LeaseLimits
from ferryman.access.signing import Signer
from ferryman.apis import APIS
from ferryman.apis.api import Parts, health_names, unary_methods, undecodable_stats
from ferryman.apis.capacity_service import CapacityService
from ferryman.apis.config_off import ConfigApiOff, config_api_on
from ferryman.apis.console import Console, LatencyRecorder
from ferryman.apis.console.buckets import BucketTable
from ferryman.apis.debug_door import DebugDoor
from ferryman.apis.envoy_routes import EnvoyRoutes, read_routes
from ferryman.apis.holds import HoldManager
from ferryman.apis.pages import Pages, domains_panel
from ferryman.apis.quota_http import QuotaHttp
from ferryman.apis.quota_hub import QuotaEventHub
from ferryman.apis.rlqs import QuotaShares, rlqs_limits
from ferryman.apis.rlqs_leases import BucketLeases, RlqsTemplates
from ferryman.backends.base import Backend, Synced, Watched
from ferryman.backends.memory import MemoryBackend
from ferryman.backends.startup import wait_until_up
from ferryman.clock import Clock, SystemClock
from ferryman.config.reloader import ConfigHolder, Reloader
from ferryman.edge.decoding import GuardedServer
from ferryman.edge.http import HttpLimits, HttpRequest, HttpResponse, HttpServer
from ferryman.edge.ports import PORT_NAMES, bind_grpc, listen, probe_port
from ferryman.edge.rpc import Edge
from ferryman.edge.tls import TlsFiles
from ferryman.engine import EngineOptions, RateLimitEngine
from ferryman.engine.validate import MAX_MESSAGE_BYTES
from ferryman.errors import SettingsError
from ferryman.prometheus_mapping import StatsdMapping
from ferryman.replay.decision_log import decision_log
from ferryman.server import event_loop
from ferryman.settings import Settings, check_redis_url, split_address
from ferryman.stats import Stats
from ferryman.statsd import StatsdSink, mogrifiers_from_env
from ferryman.tasks import wait_event
from ferryman.telemetry import Telemetry

if TYPE_CHECKING:
    from ferryman.apis.config_api import ConfigApi
    from ferryman.apis.leased import LeasedResources
    from ferryman.backends.redis import RedisBackend
    from ferryman.config.xds import XdsClient

__all__ = [
    "Service",
    "engine_options",
    "grpc_server_options",
    "make_backend",
    "run",
    "statsd_sink",
]

log = logging.getLogger("ferryman")

# The debug port's endpoints, at /help (the console is at /).
DEBUG_HELP = (
    "/: the console (a page for a browser)\n"
    "/rlconfig: the limits in force\n/stats: counters\n"
    "/status: configuration, backend and cache state (JSON)\n"
    "/explain?domain=D&descriptor=k=v[,k=v...]: why a request is limited (JSON)\n"
    "/explain/envoy[?route=NAME&header=NAME=VALUE&remote_address=IP]: the routes of the "
    "Envoy files of ENVOY_CONFIG_FILES, or what one route sends and reaches (JSON)\n"
    "/capacity: capacity leases: mastership, resources, clients and leases (JSON)\n"
    "/rlqs: Envoy's quota streams, and per bucket and Envoy the share, demand and usage (JSON)\n"
    "/rlqs/explain?domain=D&bucket=k=v[,k=v...]: the rule a quota bucket reaches, and its "
    "shares (JSON)\n"
    "/unconfigured[?top=N]: per domain with allow_unconfigured, the descriptors no rule "
    "covers, with counts and rates (JSON)\n"
    "/console/config, /console/data?since=T, /console/tenant?domain=D&descriptor=k=v[,...], "
    "/console/panels, /console/panel?id=ID, /console/simulate?domain=D&descriptor=k=v&rate=R"
    "&seconds=N[&on_off=ON:OFF&burst=AT:N]: what the console draws (JSON)\n"
    "/api/v1/config[/NAME], /api/v1/history[/N], /api/v1/diff?from=A&to=B, /api/v1/rollback, "
    "/api/v1/counters/reset: the config API (bearer tokens of ADMIN_TOKENS_FILE)\n"
)

# Why a Session ends when its server stops (its client reconnects, to another replica).
SHUTTING_DOWN = "the server is shutting down: this session's holds are released; open a new one"

# Clients may ping a quiet connection this often (the Python client: every 10 s by default).
CLIENT_PING_INTERVAL_MS = 1_000


def grpc_server_options(settings: Settings) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments: a port shared only between workers; keepalive
    pings on every
    connection, so that a client host that dies without closing its connection (power
    loss, partition) is noticed and its sessions end; client pings allowed."""
    options = [
        ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
        # Refused (RESOURCE_EXHAUSTED) before it is decoded; every limit is in engine/validate.
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.http2.min_ping_interval_without_data_ms", CLIENT_PING_INTERVAL_MS),
        # Calls gRPC holds before the server takes them (1,000 by default, all refused past
        # 3,000): a mesh's Envoys open their quota streams at once after a restart.
        ("grpc.server.max_pending_requests", max(1000, settings.rlqs_max_streams)),
        ("grpc.server.max_pending_requests_hard_limit", max(3000, 2 * settings.rlqs_max_streams)),
    ]
    if settings.grpc_max_connection_age > 0:
        # As the reference: a connection is sent GOAWAY after this age (gRPC adds +/-10%
        # jitter), so that clients spread over new replicas; in-flight calls get the grace.
        options.append(("grpc.max_connection_age_ms", _ms(settings.grpc_max_connection_age)))
        options.append(
            ("grpc.max_connection_age_grace_ms", _ms(settings.grpc_max_connection_age_grace))
        )
    if settings.grpc_keepalive_time > 0:
        every = max(1, round(settings.grpc_keepalive_time * 1000))
        wait = max(1, round(settings.grpc_keepalive_timeout * 1000))
        options += [
            ("grpc.keepalive_time_ms", every),
            ("grpc.keepalive_timeout_ms", wait),
            ("grpc.http2.ping_timeout_ms", wait),
            # A Session stream is quiet between operations: ping it all the same.
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.min_time_between_pings_ms", every),
        ]
    return options


def _ms(seconds: float) -> int:
    # gRPC's channel arguments are C ints: a longer age than ~24 days means "never".
    return min(2**31 - 1, max(1, round(seconds * 1000)))


def engine_options(settings: Settings) -> EngineOptions:
    return EngineOptions(
        near_limit_ratio=settings.near_limit_ratio,
        shadow_mode=settings.shadow_mode,
        quota_mode=settings.quota_mode,
        stop_when_over=settings.stop_cache_key_increment_when_overlimit,
        headers=settings.limit_response_headers_enabled,
        header_format=settings.limit_response_headers_format,
        limit_header=settings.limit_limit_header,
        remaining_header=settings.limit_remaining_header,
        reset_header=settings.limit_reset_header,
        dynamic_metadata=settings.response_dynamic_metadata,
        cache_key_prefix=settings.cache_key_prefix,
        local_cache_bytes=settings.local_cache_size_in_bytes,
        fail_open=settings.fail_open,
        sync_interval=settings.redis_sync_interval,
    )


def statsd_sink(settings: Settings, stats: Stats) -> StatsdSink | None:
    """The StatsD (or DogStatsD) sink the settings ask for: on by default, as in the
    reference; off with USE_STATSD=false (and USE_DOG_STATSD unset) or DISABLE_STATS."""
    s = settings
    if s.disable_stats or not (s.use_statsd or s.use_dog_statsd):
        return None
    mogrifiers = (
        mogrifiers_from_env(s.use_dog_statsd_mogrifiers, dict(s.dog_statsd_mogrifier_env))
        if s.use_dog_statsd
        else []
    )
    return StatsdSink(
        stats,
        s.statsd_host,
        s.statsd_port,
        s.stats_flush_interval,
        tags=s.extra_tags,
        dog=s.use_dog_statsd,
        mogrifiers=mogrifiers,
        # DogStatsD agents listen on UDP (the reference's dogstatsd client sends UDP).
        protocol="udp" if s.use_dog_statsd else s.statsd_protocol,
        quiet=not s.statsd_explicit,
    )


def make_backend(settings: Settings, clock: Clock) -> Backend:
    """The backend the settings ask for: memory, the REDIS_* variables, or a URL."""
    s = settings
    if s.backend == "memory":
        return MemoryBackend(clock, s.memory_max_keys)
    if s.backend == "memcache":
        from ferryman.backends.memcache import MemcacheBackend

        return MemcacheBackend(
            s.memcache_servers, jitter_max=s.expiration_jitter_max_seconds, clock=clock
        )
    if s.backend == "redis":
        return _redis_from_env(s)
    if s.backend.startswith(("redis", "rediss", "unix")):
        from ferryman.backends.redis import RedisBackend, parse_backend_url

        target = parse_backend_url(s.backend, s.redis_pool_size, s.redis_timeout)
        return RedisBackend(
            replace(
                target,
                pipeline_window=s.redis_pipeline_window,
                pipeline_limit=s.redis_pipeline_limit,
                auth_file=s.redis_auth_file,
                sentinel_auth_file=s.redis_sentinel_auth_file,
                **_redis_tls(s),
            ),
            jitter_max=s.expiration_jitter_max_seconds,
        )
    raise SettingsError(f"--backend {s.backend!r}: use memory or a redis:// URL")


def _redis_tls(s: Settings) -> dict[str, Any]:
    # As the reference: one set of TLS files for every Redis that uses TLS.
    return {
        "tls_ca_cert": s.redis_tls_cacert,
        "tls_client_cert": s.redis_tls_client_cert,
        "tls_client_key": s.redis_tls_client_key,
        "tls_check_hostname": not s.redis_tls_skip_hostname_verification,
    }


def _redis_from_env(s: Settings) -> Backend:
    """BACKEND_TYPE=redis: REDIS_* (and REDIS_PERSECOND_* for the per-second limits)."""
    from ferryman.backends.redis import RedisBackend, RoutedBackend, target_from_env_style

    check_redis_url(s.redis_type, s.redis_url, s.redis_socket_type, "REDIS")
    if s.redis_persecond:
        check_redis_url(
            s.redis_persecond_type,
            s.redis_persecond_url,
            s.redis_persecond_socket_type,
            "REDIS_PERSECOND",
        )
    main = target_from_env_style(
        s.redis_type,
        s.redis_url,
        s.redis_socket_type,
        s.redis_auth,
        s.redis_tls,
        s.redis_pool_size,
        s.redis_timeout,
    )
    if s.redis_username:
        main = replace(main, username=s.redis_username)
    backend = RedisBackend(
        replace(
            main,
            pipeline_window=s.redis_pipeline_window,
            pipeline_limit=s.redis_pipeline_limit,
            sentinel_password=s.redis_sentinel_auth or None,
            auth_file=s.redis_auth_file,
            sentinel_auth_file=s.redis_sentinel_auth_file,
            **_redis_tls(s),
        ),
        jitter_max=s.expiration_jitter_max_seconds,
    )
    if not s.redis_persecond:
        return backend
    return RoutedBackend(backend, _redis_per_second(s))


def _redis_per_second(s: Settings) -> RedisBackend:
    from ferryman.backends.redis import RedisBackend, target_from_env_style

    target = target_from_env_style(
        s.redis_persecond_type,
        s.redis_persecond_url,
        s.redis_persecond_socket_type,
        s.redis_persecond_auth,
        s.redis_persecond_tls,
        s.redis_persecond_pool_size,
        s.redis_timeout if s.redis_persecond_timeout is None else s.redis_persecond_timeout,
    )
    return RedisBackend(
        replace(
            target,
            pipeline_window=s.redis_persecond_pipeline_window,
            pipeline_limit=s.redis_persecond_pipeline_limit,
            sentinel_password=s.redis_persecond_sentinel_auth or None,
            auth_file=s.redis_persecond_auth_file,
            sentinel_auth_file=s.redis_persecond_sentinel_auth_file,
            variables="REDIS_PERSECOND",
            **_redis_tls(s),
        ),
        jitter_max=s.expiration_jitter_max_seconds,
    )


def config_source(settings: Settings, holder: ConfigHolder, stats: Stats) -> Reloader | XdsClient:
    """Where the configuration comes from: the directory, or an xDS management server."""
    if settings.config_type == "GRPC_XDS_SOTW":
        from ferryman.config.xds import XdsClient

        return XdsClient(settings, holder, stats)
    return Reloader(
        settings.config_dir,
        holder,
        stats,
        ignore_dotfiles=settings.ignore_dotfiles,
        merge_domains=settings.merge_domain_config,
        strict=settings.strict_config,
        watch_root=settings.runtime_root if settings.watch_root else None,
    )


@asynccontextmanager
async def paired(
    start: Callable[[], Awaitable[None]] | None, stop: Callable[[], Awaitable[None]]
) -> AsyncIterator[None]:
    """One part's start and stop as a context: stopped even when its start fails part way
    (the stops are safe to call on a part that did not start)."""
    try:
        if start is not None:
            await start()
        yield
    finally:
        await stop()


class Service:
    """One ferryman process: start() binds every port, stop() drains and closes.

    ``telemetry`` defaults to the pipelines the settings ask for; the Service shuts it down.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        backend: Backend | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        # The Envoy files to explain, first: a bad one stops the start (needs ferryman[envoy]).
        routes = read_routes(settings.envoy_config_files)
        self.clock = clock or SystemClock()
        self.stats = Stats(settings.metrics_max_series, settings.max_metric_series)
        self.telemetry = telemetry if telemetry is not None else Telemetry(settings)
        self.holder = ConfigHolder()
        self.backend = backend if backend is not None else make_backend(settings, self.clock)
        self._count_backend_events()
        self.reloader = config_source(settings, self.holder, self.stats)
        self.backend_latency = LatencyRecorder()
        self.engine = RateLimitEngine(
            self.holder,
            self.backend,
            self.clock,
            self.stats,
            engine_options(settings),
            timer=self.telemetry.backend_timer(self.backend),
            latency=self.backend_latency,
        )
        self.decision_log = decision_log(settings, self.stats)
        if self.decision_log is not None:
            self.engine.watchers.append(self.decision_log)
        self._edge = Edge(self.stats, self.telemetry)
        self.access = Access(
            lambda: self.holder.config,
            self.stats,
            LeaseLimits(settings.doorman_max_clients_per_server),
            sessions=settings.max_sessions_per_caller,
            streams=settings.max_streams_per_caller,
            buckets=settings.max_dynamic_buckets_per_caller,
        )
        self.telemetry.observe(self.stats, self.engine.local_cache, partial(unary_methods, APIS))
        self._make_stateful(settings)
        self.console = self._make_console(settings)
        if isinstance(self.backend, Watched):
            self.telemetry.observe_backend(self.backend)
        self.grpc_port = 0
        self.http_port = 0
        self.debug_port = 0
        self.prometheus_port: int | None = None
        # The loop start() ran on (uvloop or asyncio), for the start line and /status.
        self.event_loop = ""
        self.tls: TlsFiles | None = None
        self.statsd = statsd_sink(settings, self.stats)
        self._make_pages(settings, routes)
        self._grpc: grpc.aio.Server | None = None
        self._stack = AsyncExitStack()
        self._stopping_state()

    def _stopping_state(self) -> None:
        # The APIs' drain steps, the last registered first.
        self._drains: list[Callable[[], Awaitable[None]]] = []
        self._grace: float | None = None
        self._stopping = False
        # Set once by drain() (or stop()): health reports not serving from then on.
        self._draining = asyncio.Event()

    def _count_backend_events(self) -> None:
        """The memory backend's evictions and synced counters' flushes, counted in stats."""
        if isinstance(self.backend, MemoryBackend):
            self.backend.counters.report = self.stats.inc
        if isinstance(self.backend, Synced):
            for synced in self.backend.synced():
                synced.report = self.stats.inc

    def _make_stateful(self, settings: Settings) -> None:
        """The services that hold state for the APIs (and the console and pages)."""
        self.holds = HoldManager(
            self.engine,
            self.backend,
            self.clock,
            self.stats,
            lease_seconds=settings.hold_lease_seconds or 10.0,
            signer=Signer.from_settings(settings),
            queue_max_per_node=settings.hold_queue_max_per_node,
            queue_max=settings.hold_queue_max,
        )
        self.telemetry.observe_holds(self.holds, self.stats.max_series)
        self.quota_events = QuotaEventHub(self.stats)
        self.quota_events.observe(self.telemetry)
        self.quota_store = self.backend.quota_store(settings.cache_key_prefix, self.clock)
        self.capacity = CapacityService(settings, self.holder, self.clock, self.backend)
        self.telemetry.observe_capacity(self.capacity, self.stats.max_series)
        self.rlqs = QuotaShares(
            self.holder,
            self.clock,
            self.stats,
            shadow_mode=settings.shadow_mode,
            limits=rlqs_limits(settings),
        )
        self.rlqs.observe(self.telemetry)
        if getattr(self.backend, "target", None) is not None:
            # Replicas on one Redis: each leases its buckets' rates from the capacity master.
            self.rlqs.leases = BucketLeases()
            self.capacity.source = RlqsTemplates(self.capacity.source, self.rlqs.rate_of)
        self.leased: LeasedResources | None = None
        if settings.doorman_parent:
            from ferryman.apis.leased import LeasedResources

            self.leased = LeasedResources(
                settings.doorman_parent, self.holder, self.engine, self.clock
            )

    def _make_console(self, settings: Settings) -> Console:
        console = Console(
            self.stats,
            self.holder,
            self.holds,
            self.backend_latency,
            self.engine,
            self.backend,
            self.clock,
            directory=str(settings.config_dir),
            envoy_files=settings.envoy_config_files,
            help_text=DEBUG_HELP,
        )
        console.add_panel("capacity", "Capacity leases", self.capacity.panel)
        console.add_panel("leases", "Capacity clients", self.capacity.leases_table)
        buckets = BucketTable.of(self.quota_store, self.backend, self.clock)
        console.add_panel("buckets", "Token buckets", buckets.read)
        console.add_panel("rlqs", "Envoy quota buckets", self.rlqs.panel)
        console.add_panel("domains", "Domain switches and unconfigured traffic", self._domains)
        return console

    def _domains(self) -> dict[str, object]:
        """The console's table: each domain with a switch on, and its top unconfigured."""
        return domains_panel(self.holder.config, self.engine.unconfigured, self.clock.now())

    def _make_pages(self, settings: Settings, routes: Any) -> None:
        """The config API and the pages of the HTTP, debug and metrics ports."""
        self.pages = Pages(self)
        limits = HttpLimits.of(settings)
        self.envoy_routes = EnvoyRoutes(
            routes, self.holder, self.engine.options, self.backend, self.clock
        )
        self._http = HttpServer(
            {
                ("GET", "/healthcheck"): self._healthcheck,
                ("HEAD", "/healthcheck"): self._healthcheck,
                ("POST", "/json"): self.pages.json,
                ("POST", "/quota/allow"): QuotaHttp.of(self).allow,
            },
            "http",
            limits=limits,
        )
        self.config_api = self._make_config_api(settings)
        self._debug = HttpServer(
            {
                **self.console.routes(),
                **self.config_api.routes(),
                ("GET", "/rlconfig"): self.pages.rlconfig,
                ("GET", "/stats"): self.pages.stats_page,
                ("GET", "/status"): self.pages.status_page,
                ("GET", "/explain"): self.pages.explain,
                ("GET", "/explain/envoy"): self.envoy_routes.page,
                ("GET", "/capacity"): self.pages.capacity_page,
                ("GET", "/rlqs"): self.pages.rlqs_page,
                ("GET", "/rlqs/explain"): self.pages.rlqs_explain,
                ("GET", "/unconfigured"): self.pages.unconfigured,
            },
            "debug",
            guard=DebugDoor(self.access, settings.debug_allowed_hosts),
            limits=limits,
        )
        prometheus = self.telemetry.prometheus is not None
        self.mapping = (
            StatsdMapping.from_file(settings.prometheus_mapper_yaml)
            if settings.prometheus_mapper_yaml and prometheus
            else None
        )
        self._metrics: HttpServer | None = None
        if prometheus:
            self._metrics = HttpServer(
                {("GET", settings.prometheus_path): self.pages.prometheus},
                "prometheus",
                limits=limits,
            )

    def _make_config_api(self, settings: Settings) -> ConfigApi | ConfigApiOff:
        """The config API, imported only when the settings turn it on."""
        if not config_api_on(settings):
            return ConfigApiOff()
        from ferryman.apis.config_api import ConfigApi

        return ConfigApi(
            settings,
            self.holder,
            self.reloader if isinstance(self.reloader, Reloader) else None,
            self.stats,
            self.backend,
            self.engine,
            self.clock,
            self.quota_store,
            holds=self.holds,
        )

    @property
    def http_servers(self) -> dict[str, HttpServer]:
        """The HTTP port's server and the debug port's, by port name."""
        return {"http": self._http, "debug": self._debug}

    def healthy(self) -> bool:
        """Whether the service can answer. By default whatever the backend's state (its
        failure policy answers for it), unless health is asked to require the backend; with
        HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, also at least one domain in force (the
        reference's rule; without it, a service whose first configuration was rejected is
        healthy and answers every call with the "no configuration loaded" error)."""
        if self._stopping or self._draining.is_set():
            return False
        if self.settings.health_requires_backend and not self.backend.healthy():
            return False
        if self.settings.healthy_with_at_least_one_config_loaded:
            config = self.holder.config
            return config is not None and bool(config.domains)
        return True

    async def start(self) -> None:
        s = self.settings
        self.event_loop = event_loop.name()
        # Ports first: a port in use is the commonest mistake, and it should be reported
        # before anything else starts (and before gRPC's own resolver logs about it).
        if s.workers == 1:  # workers share their ports: each may bind what another holds
            for host, port, what in self._ports():
                probe_port(host, port, what)
        for name in s.ignored:
            log.warning(
                "%s is set: ferryman accepts it but it changes nothing here "
                "(see the README, Migrating from envoyproxy/ratelimit)",
                name,
            )
        self.tls = TlsFiles.from_settings(s)
        self.reloader.load(keep_serving=True, missing_ok=s.force_start_without_initial_config)
        if self.tls is not None and self.access.policy is None:
            log.warning(
                "TLS is on but the config directory has no access policy (access.yaml): "
                "every caller that completes the handshake may do everything"
            )
        for part in self._lifespan():
            await self._stack.enter_async_context(part)
        log.info(*self._serving_line())

    def _lifespan(self) -> Iterator[AbstractAsyncContextManager[None]]:
        """What start() enters, in order; stop() leaves them in reverse."""
        if self.statsd is not None:  # stopped late: the last flush carries every call
            yield paired(self.statsd.start, self.statsd.stop)
        yield self._backend_up()
        if self.decision_log is not None:  # stopped after the calls: it writes their lines
            yield paired(self.decision_log.start, self.decision_log.stop)
        yield paired(self.config_api.start, self.config_api.stop)
        yield paired(self._start_reloader, self.reloader.stop)
        yield paired(self.holds.start, self.holds.stop)
        yield paired(self._start_console, self.console.stop)
        yield self._apis()
        yield self._listening()
        yield self._serving()

    @asynccontextmanager
    async def _backend_up(self) -> AsyncIterator[None]:
        s = self.settings
        try:
            await self.backend.start()
            if s.redis_startup_wait and isinstance(self.backend, Watched):
                await wait_until_up(
                    self.backend,
                    s.redis_startup_initial_interval,
                    s.redis_startup_max_interval,
                    s.redis_startup_max_elapsed_time,
                )
            yield
        finally:
            await self.backend.close()

    async def _start_reloader(self) -> None:
        if not self.config_api.owns_config:  # CONFIG_STORE=redis: Redis decides, not files
            await self.reloader.start()

    async def _start_console(self) -> None:
        self.console.start()

    @asynccontextmanager
    async def _apis(self) -> AsyncIterator[None]:
        """The gRPC server, bound, with every API of the registry served on it."""
        s, tls = self.settings, self.tls
        server = grpc.aio.server(options=grpc_server_options(s))
        # Registered through the guard, so that a request that does not decode is counted
        # and refused with INVALID_ARGUMENT, not logged one traceback at a time.
        guarded = GuardedServer(
            server,
            self.stats,
            undecodable_stats(APIS),
            authorize=tls.authorize if tls is not None and tls.client_san else None,
        )
        self.undecodable = guarded.reporter
        self._grpc = server
        try:
            async with AsyncExitStack() as served:
                # Bound first: an API may need the port (capacity advertises its address).
                self.grpc_port = bind_grpc(server, s, tls)
                parts = self._parts()
                for api in APIS:
                    servicer = await served.enter_async_context(api.serve(parts))
                    api.add(servicer, guarded, self._edge)
                    if api.drain is not None:
                        self._drains.insert(0, partial(api.drain, servicer))
                yield
        finally:
            self._drains.clear()
            if self._grpc is not None:  # bound, never served
                await self._grpc.stop(self._grace)
                self._grpc = None

    def _parts(self) -> Parts:
        return Parts(
            settings=self.settings,
            clock=self.clock,
            stats=self.stats,
            holder=self.holder,
            engine=self.engine,
            holds=self.holds,
            quota_store=self.quota_store,
            quota_events=self.quota_events,
            capacity=self.capacity,
            leased=self.leased,
            rlqs=self.rlqs,
            healthy=self.healthy,
            health_names=health_names(APIS),
            draining=self._draining,
            grpc_port=self.grpc_port,
            access=self.access,
        )

    @asynccontextmanager
    async def _listening(self) -> AsyncIterator[None]:
        """The HTTP, debug and metrics ports: closed once the gRPC calls have drained."""
        s, tls = self.settings, self.tls
        shared = s.workers > 1
        context = tls.ssl_context() if tls is not None else None
        try:
            self.http_port = await listen(
                self._http, s.host, s.port, PORT_NAMES["http"], context, shared
            )
            self.debug_port = await listen(
                self._debug, s.debug_host, s.debug_port, PORT_NAMES["debug"], context, shared
            )
            if self._metrics is not None:
                host, port = split_address(s.prometheus_addr, "PROMETHEUS_ADDR")
                self.prometheus_port = await listen(
                    self._metrics, host, port, "PROMETHEUS_ADDR", context, shared
                )
            yield
        finally:
            await self._http.stop()
            await self._debug.stop()
            if self._metrics is not None:
                await self._metrics.stop()

    @asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        """The gRPC server serving; on the way out it refuses new calls, the long streams
        end (so that their clients move to another replica at once: this one accepts
        none), and the calls in flight get the grace period."""
        server = self._grpc
        assert server is not None
        try:
            await server.start()
            yield
        finally:
            # The server's first step refuses new calls; the streams end after it.
            stopping = asyncio.ensure_future(server.stop(self._grace))
            await asyncio.sleep(0)
            try:
                self.holds.end_all(SHUTTING_DOWN)
                for drain in self._drains:
                    await drain()
            finally:
                self._drains.clear()
                await stopping
                self._grpc = None

    def _serving_line(self) -> tuple[Any, ...]:
        s, tls = self.settings, self.tls
        extras = (
            self.telemetry.describe(),
            self.statsd.describe() if self.statsd is not None else "",
        )
        return (
            "ferryman serving%s: grpc %s, http :%d, debug :%d%s, backend %s, config %s, "
            "event loop %s; %s",
            "" if tls is None else " over TLS" + (" (mutual)" if tls.mutual else ""),
            f"unix:{s.grpc_uds}" if s.grpc_uds else f":{self.grpc_port}",
            self.http_port,
            self.debug_port,
            "" if self.prometheus_port is None else f", metrics :{self.prometheus_port}",
            self.backend.name,
            s.config_dir if isinstance(self.reloader, Reloader) else self.reloader.describe(),
            self.event_loop,
            "; ".join(part for part in extras if part),
        )

    def _ports(self) -> list[tuple[str, int, str]]:
        s = self.settings
        ports = [
            (s.host, s.port, PORT_NAMES["http"]),
            (s.debug_host, s.debug_port, PORT_NAMES["debug"]),
        ]
        if not s.grpc_uds:
            ports.insert(0, (s.grpc_host, s.grpc_port, PORT_NAMES["grpc"]))
        if self._metrics is not None:
            host, port = split_address(s.prometheus_addr, "PROMETHEUS_ADDR")
            ports.append((host, port, "PROMETHEUS_ADDR"))
        return ports

    async def drain(self, seconds: float, cut: asyncio.Event | None = None) -> None:
        """Report not serving (the health service under every name, ``/healthcheck``) at
        once, while every API answers as before, for ``seconds`` or until ``cut`` is set:
        the time for Kubernetes endpoints and Envoy's health checks to move traffic away."""
        self._draining.set()
        if seconds > 0 and not (cut is not None and cut.is_set()):
            log.info("draining for %gs: health reports not serving, every API answers", seconds)
            await wait_event(cut if cut is not None else asyncio.Event(), seconds)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, end the long streams, let in-flight calls finish (up to
        ``grace`` seconds), close."""
        self._grace = self.settings.shutdown_grace_seconds if grace is None else grace
        self._stopping = True
        self._draining.set()
        try:
            await self._stack.aclose()
        finally:
            # Last, so that the final push carries every call.
            await asyncio.to_thread(self.telemetry.shutdown)

    async def _healthcheck(self, request: HttpRequest) -> HttpResponse:
        if self._draining.is_set():
            return HttpResponse(503, b"draining: shutting down")
        if self.healthy():
            return HttpResponse(200, b"OK")
        return HttpResponse(500, b"unhealthy")


async def run(service: Service, stop: asyncio.Event, cut: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set, then drain (FERRYMAN_SHUTDOWN_DRAIN, or until ``cut``
    is set) and shut down gracefully. A start that fails part way releases what it had
    started before the error goes up."""
    starting = asyncio.ensure_future(service.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        # A start may wait (for Redis, for the first xDS version): a signal ends the wait.
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            log.info("stopped while starting")
        await starting
        heap.settle()
    except BaseException:
        # The start's own error is the one to report, not a failure to undo half of it.
        for task in (starting, stopping):
            task.cancel()
        with contextlib.suppress(BaseException):
            await starting  # a cancelled start unwinds first
        with contextlib.suppress(Exception):
            await service.stop(grace=0)
        if starting.cancelled() and stop.is_set():
            return
        raise
    await stopping
    await service.drain(service.settings.shutdown_drain_seconds, cut)
    log.info("shutting down: refusing new calls, ending streams, finishing calls in flight")
    await service.stop()
    log.info("stopped")
