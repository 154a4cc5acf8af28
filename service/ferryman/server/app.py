"""Wiring: configuration, backend, engine, gRPC and HTTP servers, and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from dataclasses import replace
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2, quota_service_pb2_grpc
from ferryman.apis.capacity import CapacityService, CapacityServicer
from ferryman.apis.config_api import ConfigApi
from ferryman.apis.console import Console, LatencyRecorder
from ferryman.apis.console.buckets import BucketTable
from ferryman.apis.envoy_routes import EnvoyRoutes, read_routes
from ferryman.apis.holds import HoldManager
from ferryman.apis.leased import LeasedResources
from ferryman.apis.limiter import METHODS as LIMITER_METHODS
from ferryman.apis.limiter import LimiterServicer
from ferryman.apis.pages import Pages
from ferryman.apis.quota import (
    QuotaEventHub,
    QuotaEventsServicer,
    QuotaServicer,
)
from ferryman.apis.rls import METHODS as RLS_METHODS
from ferryman.apis.rls import RateLimitServicer
from ferryman.backends.base import Backend, Watched
from ferryman.backends.memory import MemoryBackend
from ferryman.backends.startup import wait_until_up
from ferryman.clock import Clock, SystemClock
from ferryman.config.reloader import ConfigHolder, Reloader
from ferryman.config.xds import XdsClient
from ferryman.edge.decoding import GuardedServer
from ferryman.edge.http import HttpRequest, HttpResponse, HttpServer
from ferryman.edge.rpc import Edge, Method
from ferryman.edge.tls import TlsFiles
from ferryman.engine import EngineOptions, RateLimitEngine
from ferryman.engine.validate import MAX_MESSAGE_BYTES
from ferryman.errors import SettingsError
from ferryman.prometheus_mapping import StatsdMapping
from ferryman.server import event_loop
from ferryman.settings import Settings, check_redis_url, split_address
from ferryman.stats import CALL, TOTAL_REQUESTS, Stats
from ferryman.statsd import StatsdSink, mogrifiers_from_env
from ferryman.telemetry import Telemetry

__all__ = [
    "Service",
    "engine_options",
    "grpc_server_options",
    "make_backend",
    "statsd_sink",
]

log = logging.getLogger("ferryman")

RLS_SERVICE = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"]
LIMITER_SERVICE = limiter_pb2.DESCRIPTOR.services_by_name["Limiter"]
QUOTA_EVENTS_SERVICE = limiter_pb2.DESCRIPTOR.services_by_name["QuotaEvents"]
QUOTA_SERVICE = quota_service_pb2.DESCRIPTOR.services_by_name["QuotaService"]
# Allow answers every problem with a status of its own: nothing for the edge to map.
QUOTA_METHODS = {"Allow": Method("ratelimit.service.call.allow")}
CAPACITY_SERVICE = doorman_pb2.DESCRIPTOR.services_by_name["Capacity"]
CAPACITY_METHODS = {
    "Discovery": Method("ratelimit.service.call.discovery"),
    "GetCapacity": Method("ratelimit.service.call.get_capacity"),
    "GetServerCapacity": Method("ratelimit.service.call.get_server_capacity"),
    "ReleaseCapacity": Method("ratelimit.service.call.release_capacity"),
}
HEALTH_NAMES = (
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
    "ferryman.v1.Limiter",
    "quotaservice.QuotaService",
    "doorman.Capacity",
)


# The debug port's endpoints, at /help (the console is at /).
DEBUG_HELP = (
    "/: the console (a page for a browser)\n"
    "/rlconfig: the limits in force\n/stats: counters\n"
    "/status: configuration, backend and cache state (JSON)\n"
    "/explain?domain=D&descriptor=k=v[,k=v...]: why a request is limited (JSON)\n"
    "/explain/envoy[?route=NAME&header=NAME=VALUE&remote_address=IP]: the routes of the "
    "Envoy files of ENVOY_CONFIG_FILES, or what one route sends and reaches (JSON)\n"
    "/capacity: capacity leases: mastership, resources, clients and leases (JSON)\n"
    "/console/config, /console/data?since=T, /console/tenant?domain=D&descriptor=k=v[,...], "
    "/console/panels, /console/panel?id=ID: what the console draws (JSON)\n"
    "/api/v1/config[/NAME], /api/v1/history[/N], /api/v1/diff?from=A&to=B, /api/v1/rollback, "
    "/api/v1/counters/reset: the config API (bearer tokens of ADMIN_TOKENS_FILE)\n"
)

SHOULD_RATE_LIMIT = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

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
        limit_header=settings.limit_limit_header,
        remaining_header=settings.limit_remaining_header,
        reset_header=settings.limit_reset_header,
        dynamic_metadata=settings.response_dynamic_metadata,
        cache_key_prefix=settings.cache_key_prefix,
        local_cache_bytes=settings.local_cache_size_in_bytes,
        fail_open=settings.fail_open,
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
    from ferryman.backends.redis import (
        RedisBackend,
        RoutedBackend,
        parse_backend_url,
        target_from_env_style,
    )

    jitter = s.expiration_jitter_max_seconds
    window, limit = s.redis_pipeline_window, s.redis_pipeline_limit
    # As the reference: one set of TLS files for every Redis that uses TLS.
    tls: dict[str, Any] = {
        "tls_ca_cert": s.redis_tls_cacert,
        "tls_client_cert": s.redis_tls_client_cert,
        "tls_client_key": s.redis_tls_client_key,
        "tls_check_hostname": not s.redis_tls_skip_hostname_verification,
    }
    if s.backend == "redis":
        check_redis_url(s.redis_type, s.redis_url, s.redis_socket_type, "REDIS")
        if s.redis_persecond:
            check_redis_url(
                s.redis_persecond_type,
                s.redis_persecond_url,
                s.redis_persecond_socket_type,
                "REDIS_PERSECOND",
            )
        main = RedisBackend(
            replace(
                target_from_env_style(
                    s.redis_type,
                    s.redis_url,
                    s.redis_socket_type,
                    s.redis_auth,
                    s.redis_tls,
                    s.redis_pool_size,
                    s.redis_timeout,
                ),
                pipeline_window=window,
                pipeline_limit=limit,
                sentinel_password=s.redis_sentinel_auth or None,
                **tls,
            ),
            jitter_max=jitter,
        )
        if not s.redis_persecond:
            return main
        per_second = RedisBackend(
            replace(
                target_from_env_style(
                    s.redis_persecond_type,
                    s.redis_persecond_url,
                    s.redis_persecond_socket_type,
                    s.redis_persecond_auth,
                    s.redis_persecond_tls,
                    s.redis_persecond_pool_size,
                    s.redis_timeout
                    if s.redis_persecond_timeout is None
                    else s.redis_persecond_timeout,
                ),
                pipeline_window=s.redis_persecond_pipeline_window,
                pipeline_limit=s.redis_persecond_pipeline_limit,
                sentinel_password=s.redis_persecond_sentinel_auth or None,
                **tls,
            ),
            jitter_max=jitter,
        )
        return RoutedBackend(main, per_second)
    if s.backend.startswith(("redis", "rediss", "unix")):
        target = parse_backend_url(s.backend, s.redis_pool_size, s.redis_timeout)
        return RedisBackend(
            replace(target, pipeline_window=window, pipeline_limit=limit, **tls),
            jitter_max=jitter,
        )
    raise SettingsError(f"--backend {s.backend!r}: use memory or a redis:// URL")


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
        # The Envoy files to explain, read first (a bad one stops the start before anything
        # runs), and only when given: reading them needs the ferryman[envoy] extra.
        routes = read_routes(settings.envoy_config_files)
        self.clock = clock or SystemClock()
        self.stats = Stats(settings.metrics_max_series)
        self.telemetry = telemetry if telemetry is not None else Telemetry(settings)
        self.holder = ConfigHolder()
        self.backend = backend if backend is not None else make_backend(settings, self.clock)
        if isinstance(self.backend, MemoryBackend):
            self.backend.windows.report = self.stats.inc
        # Where the configuration comes from: the directory, or an xDS management server.
        self.reloader: Reloader | XdsClient = (
            XdsClient(settings, self.holder, self.stats)
            if settings.config_type == "GRPC_XDS_SOTW"
            else Reloader(
                settings.config_dir,
                self.holder,
                self.stats,
                ignore_dotfiles=settings.ignore_dotfiles,
                merge_domains=settings.merge_domain_config,
                watch_root=settings.runtime_root if settings.watch_root else None,
            )
        )
        self.backend_latency = LatencyRecorder()
        self.engine = RateLimitEngine(
            self.holder,
            self.backend,
            self.clock,
            self.stats,
            engine_options(settings),
            timer=self.backend_latency.wrap(self.telemetry.backend_timer(self.backend)),
        )
        self.rls = RateLimitServicer(self.engine)
        self._edge = Edge(self.stats, self.telemetry)
        self.telemetry.observe(
            self.stats,
            self.engine.local_cache,
            [*RLS_METHODS, *LIMITER_METHODS, *QUOTA_METHODS, *CAPACITY_METHODS],
        )
        self.holds = HoldManager(
            self.engine,
            self.backend,
            self.clock,
            self.stats,
            lease_seconds=settings.hold_lease_seconds or 10.0,
        )
        self.telemetry.observe_holds(self.holds, self.stats.max_series)
        self.quota_events = QuotaEventHub(self.stats)
        self.quota_events.observe(self.telemetry)
        self.quota = QuotaServicer(
            self.holder,
            self.backend.quota_store(settings.cache_key_prefix, self.clock),
            self.quota_events,
            self.stats,
            fail_open=settings.fail_open,
        )
        self.capacity = CapacityService(settings, self.holder, self.clock, self.backend)
        self.telemetry.observe_capacity(self.capacity, self.stats.max_series)
        self.leased: LeasedResources | None = None
        if settings.doorman_parent:
            self.leased = LeasedResources(
                settings.doorman_parent, self.holder, self.engine.leased, self.clock
            )
        self.console = Console(
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
        self.console.add_panel("capacity", "Capacity leases", self.capacity.panel)
        self.console.add_panel("leases", "Capacity clients", self.capacity.leases_table)
        buckets = BucketTable(self.quota.store, self.backend.buckets, self.clock)
        self.console.add_panel("buckets", "Token buckets", buckets.read)
        if isinstance(self.backend, Watched):
            self.telemetry.observe_backend(self.backend)
        self.grpc_port = 0
        self.http_port = 0
        self.debug_port = 0
        self.prometheus_port: int | None = None
        # The loop start() ran on (uvloop or asyncio), for the start line and /status.
        self.event_loop = ""
        self._grpc: grpc.aio.Server | None = None
        self._health = HealthServicer()
        self.pages = Pages(self)
        self.envoy_routes = EnvoyRoutes(
            routes,
            self.holder,
            self.engine.options,
            self.backend,
            self.clock,
        )
        self._http = HttpServer(
            {
                ("GET", "/healthcheck"): self._healthcheck,
                ("HEAD", "/healthcheck"): self._healthcheck,
                ("POST", "/json"): self.pages.json,
            },
            "http",
        )
        self.config_api = ConfigApi(
            settings,
            self.holder,
            self.reloader if isinstance(self.reloader, Reloader) else None,
            self.stats,
            self.backend,
            self.engine,
            self.clock,
            self.quota.store,
        )
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
            },
            "debug",
        )
        self._metrics: HttpServer | None = None
        self.mapping = (
            StatsdMapping.from_file(settings.prometheus_mapper_yaml)
            if settings.prometheus_mapper_yaml and self.telemetry.prometheus is not None
            else None
        )
        if self.telemetry.prometheus is not None:
            self._metrics = HttpServer(
                {("GET", settings.prometheus_path): self.pages.prometheus}, "prometheus"
            )
        self._stopping = False
        self._health_task: asyncio.Task[None] | None = None
        self.tls: TlsFiles | None = None
        self.statsd = statsd_sink(settings, self.stats)

    def healthy(self) -> bool:
        """Whether the service can answer. By default whatever the backend's state (its
        failure policy answers for it), unless health is asked to require the backend; with
        HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, also at least one domain in force (the
        reference's rule; without it, a service whose first configuration was rejected is
        healthy and answers every call with the "no configuration loaded" error)."""
        if self._stopping:
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
                _probe_port(host, port, what)
        for name in s.ignored:
            log.warning(
                "%s is set: ferryman accepts it but it changes nothing here "
                "(see the README, Migrating from envoyproxy/ratelimit)",
                name,
            )
        self.tls = tls = TlsFiles.from_settings(s)
        self.reloader.load(keep_serving=True, missing_ok=s.force_start_without_initial_config)
        await self.backend.start()
        if s.redis_startup_wait and isinstance(self.backend, Watched):
            await wait_until_up(
                self.backend,
                s.redis_startup_initial_interval,
                s.redis_startup_max_interval,
                s.redis_startup_max_elapsed_time,
            )
        await self.config_api.start()
        if not self.config_api.owns_config:  # CONFIG_STORE=redis: Redis decides, not files
            await self.reloader.start()
        await self.holds.start()
        self.console.start()
        if self.statsd is not None:
            await self.statsd.start()
        server = grpc.aio.server(options=grpc_server_options(s))
        # Registered through the guard, so that a request that does not decode is counted
        # and refused with INVALID_ARGUMENT, not logged one traceback at a time.
        guarded = GuardedServer(
            server,
            self.stats,
            {SHOULD_RATE_LIMIT: (TOTAL_REQUESTS, f"{CALL}.service_error")},
            authorize=tls.authorize if tls is not None and tls.client_san else None,
        )
        self.undecodable = guarded.reporter
        edge = self._edge
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(  # type: ignore[no-untyped-call]
            edge.wrap(self.rls, RLS_SERVICE, RLS_METHODS), guarded
        )
        limiter_pb2_grpc.add_LimiterServicer_to_server(  # type: ignore[no-untyped-call]
            edge.wrap(LimiterServicer(self.engine, self.holds), LIMITER_SERVICE, LIMITER_METHODS),
            guarded,
        )
        quota_service_pb2_grpc.add_QuotaServiceServicer_to_server(  # type: ignore[no-untyped-call]
            edge.wrap(self.quota, QUOTA_SERVICE, QUOTA_METHODS), guarded
        )
        limiter_pb2_grpc.add_QuotaEventsServicer_to_server(  # type: ignore[no-untyped-call]
            edge.wrap(QuotaEventsServicer(self.quota_events), QUOTA_EVENTS_SERVICE, {}), guarded
        )
        doorman_pb2_grpc.add_CapacityServicer_to_server(  # type: ignore[no-untyped-call]
            edge.wrap(CapacityServicer(self.capacity), CAPACITY_SERVICE, CAPACITY_METHODS),
            guarded,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, guarded)
        self._grpc = server
        # As the reference: GRPC_UDS replaces GRPC_HOST:GRPC_PORT (gRPC removes a socket file
        # left by a previous run).
        address = f"unix:{s.grpc_uds}" if s.grpc_uds else f"{_host(s.grpc_host)}:{s.grpc_port}"
        try:
            if tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, tls.grpc_credentials())
        except RuntimeError:
            if s.grpc_uds:
                raise SettingsError(
                    f"cannot listen on the unix socket GRPC_UDS={s.grpc_uds!r}: check that "
                    "its directory exists and is writable and that no file is in the way"
                ) from None
            raise SettingsError(
                _bind_problem(s.grpc_host, s.grpc_port, _PORT_NAMES["grpc"], "cannot listen")
            ) from None
        if not s.grpc_uds:
            self.grpc_port = port
        await self.capacity.start(self.grpc_port)
        if self.leased is not None:
            await self.leased.start(self.capacity.address)
        await server.start()
        self._health_task = asyncio.create_task(self._track_health(), name="ferryman-health")
        shared = s.workers > 1
        context = tls.ssl_context() if tls is not None else None
        self.http_port = await _listen(
            self._http, s.host, s.port, _PORT_NAMES["http"], context, shared
        )
        self.debug_port = await _listen(
            self._debug, s.debug_host, s.debug_port, _PORT_NAMES["debug"], context, shared
        )
        if self._metrics is not None:
            host, port = split_address(s.prometheus_addr, "PROMETHEUS_ADDR")
            self.prometheus_port = await _listen(
                self._metrics, host, port, "PROMETHEUS_ADDR", context, shared
            )
        log.info(
            "ferryman serving%s: grpc %s, http :%d, debug :%d%s, backend %s, config %s, "
            "event loop %s; %s",
            "" if tls is None else " over TLS" + (" (mutual)" if tls.mutual else ""),
            f"unix:{s.grpc_uds}" if s.grpc_uds else f":{self.grpc_port}",
            self.http_port,
            self.debug_port,
            "" if self.prometheus_port is None else f", metrics :{self.prometheus_port}",
            self.backend.name,
            self.reloader.describe() if isinstance(self.reloader, XdsClient) else s.config_dir,
            self.event_loop,
            "; ".join(
                part
                for part in (
                    self.telemetry.describe(),
                    self.statsd.describe() if self.statsd is not None else "",
                )
                if part
            ),
        )

    def _ports(self) -> list[tuple[str, int, str]]:
        s = self.settings
        ports = [
            (s.host, s.port, _PORT_NAMES["http"]),
            (s.debug_host, s.debug_port, _PORT_NAMES["debug"]),
        ]
        if not s.grpc_uds:
            ports.insert(0, (s.grpc_host, s.grpc_port, _PORT_NAMES["grpc"]))
        if self._metrics is not None:
            host, port = split_address(s.prometheus_addr, "PROMETHEUS_ADDR")
            ports.append((host, port, "PROMETHEUS_ADDR"))
        return ports

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, let in-flight ones finish (up to ``grace`` seconds), close."""
        grace = self.settings.shutdown_grace_seconds if grace is None else grace
        self._stopping = True
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.wait({self._health_task}, timeout=1)
            self._health_task = None
        await self._health.enter_graceful_shutdown()
        self.quota_events.close()
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        await self._http.stop()
        await self._debug.stop()
        if self._metrics is not None:
            await self._metrics.stop()
        if self.leased is not None:
            await self.leased.stop()
        await self.capacity.stop()
        await self.console.stop()
        await self.config_api.stop()
        await self.reloader.stop()
        await self.holds.stop()
        await self.backend.close()
        if self.statsd is not None:
            await self.statsd.stop()  # the last flush carries every call
        # Last, so that the final push carries every call.
        await asyncio.to_thread(self.telemetry.shutdown)

    async def _track_health(self) -> None:
        """Mirror healthy() into the gRPC health service as it changes."""
        serving = None
        while not self._stopping:
            now = self.healthy()
            if now != serving:
                status = (
                    health_pb2.HealthCheckResponse.SERVING
                    if now
                    else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                for name in HEALTH_NAMES:
                    await self._health.set(name, status)
                serving = now
            await asyncio.sleep(0.2)

    async def _healthcheck(self, request: HttpRequest) -> HttpResponse:
        if self.healthy():
            return HttpResponse(200, b"OK")
        return HttpResponse(500, b"unhealthy")


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# What an operator sets to move each port: the variable and the flag.
_PORT_NAMES = {
    "grpc": "GRPC_PORT / --grpc-port",
    "http": "PORT / --http-port",
    "debug": "DEBUG_PORT / --debug-port",
}
_BIND_HINTS = {
    errno.EADDRINUSE: "already in use: stop the process that holds it "
    "(`ss -ltnp` names it) or choose another port",
    errno.EACCES: "permission denied: ports below 1024 need privileges; choose a higher port",
    errno.EADDRNOTAVAIL: "this host has no such address: check the host setting",
}


def _bind_problem(host: str, port: int, what: str, reason: str) -> str:
    shown = f"{_host(host) or '*'}:{port}"
    return f"cannot listen on {shown} ({what}): {reason}"


def _bind_error(host: str, port: int, what: str, exc: OSError) -> SettingsError:
    if isinstance(exc, socket.gaierror):
        reason = f"unknown host {host!r}: check the host setting"
    else:
        reason = _BIND_HINTS.get(exc.errno or 0, exc.strerror or str(exc))
    return SettingsError(_bind_problem(host, port, what, reason))


def _probe_port(host: str, port: int, what: str) -> None:
    """Raise SettingsError when ``host:port`` cannot be listened on (port 0 always can)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as sock:
            # As the servers themselves bind: a port in TIME_WAIT is free to take.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        raise _bind_error(host, port, what, exc) from None


async def _listen(
    server: HttpServer,
    host: str,
    port: int,
    what: str,
    tls: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> int:
    try:
        return await server.start(host, port, tls, reuse_port)
    except OSError as exc:
        raise _bind_error(host, port, what, exc) from None


async def run(service: Service, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set, then shut down gracefully. A start that fails part way
    releases what it had started before the error goes up."""
    starting = asyncio.ensure_future(service.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        # A start may wait (for Redis, for the first xDS version): a signal ends the wait.
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            log.info("stopped while starting")
        await starting
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
    log.info("shutting down: draining in-flight calls")
    await service.stop()
    log.info("stopped")
