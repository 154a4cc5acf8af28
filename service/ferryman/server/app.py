"""Wiring: configuration, backend, engine, gRPC and HTTP servers, and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import ssl
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2, quota_service_pb2_grpc
from ferryman.algorithms.token_bucket.standing import BucketTable
from ferryman.backends.base import Backend, Watched
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import Clock, SystemClock
from ferryman.config.model import Unit
from ferryman.config.reloader import ConfigHolder, Reloader
from ferryman.engine import EngineOptions, RateLimitEngine
from ferryman.engine.explain import explain, parse_descriptor
from ferryman.engine.validate import MAX_MESSAGE_BYTES
from ferryman.errors import BackendError, FerrymanError, RequestError, SettingsError, status_of
from ferryman.prometheus_mapping import StatsdMapping
from ferryman.server.capacity import CapacityService, CapacityServicer
from ferryman.server.console import Console, LatencyRecorder
from ferryman.server.decoding import GuardedServer
from ferryman.server.edge import Edge, Method
from ferryman.server.holds import HoldManager
from ferryman.server.http import HttpRequest, HttpResponse, HttpServer
from ferryman.server.leased import LeasedResources
from ferryman.server.limiter import METHODS as LIMITER_METHODS
from ferryman.server.limiter import LimiterServicer
from ferryman.server.quota import (
    QuotaEventHub,
    QuotaEventsServicer,
    QuotaServicer,
    make_bucket_store,
)
from ferryman.server.rls import METHODS as RLS_METHODS
from ferryman.server.rls import RateLimitServicer
from ferryman.server.tls import TlsFiles
from ferryman.settings import Settings, check_redis_url, split_address
from ferryman.stats import CALL, TOTAL_REQUESTS, Stats
from ferryman.statsd import StatsdSink, mogrifiers_from_env
from ferryman.telemetry import PROMETHEUS_CONTENT_TYPE, STATS_COUNTER_FAMILIES, Telemetry

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
    "/capacity: capacity leases: mastership, resources, clients and leases (JSON)\n"
    "/console/config, /console/data?since=T, /console/tenant?domain=D&descriptor=k=v[,...], "
    "/console/panels, /console/panel?id=ID: what the console draws (JSON)\n"
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
        self.clock = clock or SystemClock()
        self.stats = Stats(settings.metrics_max_series)
        self.telemetry = telemetry if telemetry is not None else Telemetry(settings)
        self.holder = ConfigHolder()
        self.backend = backend if backend is not None else make_backend(settings, self.clock)
        if isinstance(self.backend, MemoryBackend):
            self.backend.windows.report = self.stats.inc
        self.reloader = Reloader(
            settings.config_dir,
            self.holder,
            self.stats,
            ignore_dotfiles=settings.ignore_dotfiles,
            merge_domains=settings.merge_domain_config,
            watch_root=settings.runtime_root if settings.watch_root else None,
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
            make_bucket_store(self.backend, self.clock, settings.cache_key_prefix),
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
            help_text=DEBUG_HELP,
        )
        self.console.add_panel("capacity", "Capacity leases", self._capacity_panel)
        self.console.add_panel("leases", "Capacity clients", self.capacity.leases_table)
        buckets = BucketTable(self.quota.store, self.backend.buckets, self.clock)
        self.console.add_panel("buckets", "Token buckets", buckets.read)
        if isinstance(self.backend, Watched):
            self.telemetry.observe_backend(self.backend)
        self.grpc_port = 0
        self.http_port = 0
        self.debug_port = 0
        self.prometheus_port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._health = HealthServicer()
        self._http = HttpServer(
            {
                ("GET", "/healthcheck"): self._healthcheck,
                ("HEAD", "/healthcheck"): self._healthcheck,
                ("POST", "/json"): self._json,
            },
            "http",
        )
        self._debug = HttpServer(
            {
                **self.console.routes(),
                ("GET", "/rlconfig"): self._rlconfig,
                ("GET", "/stats"): self._stats_page,
                ("GET", "/status"): self._status_page,
                ("GET", "/explain"): self._explain,
                ("GET", "/capacity"): self._capacity_page,
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
                {("GET", settings.prometheus_path): self._prometheus}, "prometheus"
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
            "ferryman serving%s: grpc %s, http :%d, debug :%d%s, backend %s, config %s; %s",
            "" if tls is None else " over TLS" + (" (mutual)" if tls.mutual else ""),
            f"unix:{s.grpc_uds}" if s.grpc_uds else f":{self.grpc_port}",
            self.http_port,
            self.debug_port,
            "" if self.prometheus_port is None else f", metrics :{self.prometheus_port}",
            self.backend.name,
            s.config_dir,
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

    async def _json(self, request: HttpRequest) -> HttpResponse:
        """ShouldRateLimit with the protojson of its request and response, counted with the
        gRPC calls. Under mutual TLS it needs a verified client certificate (it counts hits)."""
        self.stats.inc(TOTAL_REQUESTS)
        denied = self.tls.http_denied(request.peercert) if self.tls is not None else None
        if denied is not None:
            self.stats.inc(f"{CALL}.service_error")
            return HttpResponse(403, f"forbidden: {denied}\n".encode())
        message = rls_pb2.RateLimitRequest()
        try:
            json_format.Parse(request.body.decode("utf-8"), message)
        except (json_format.ParseError, UnicodeDecodeError) as exc:
            self.stats.inc(f"{CALL}.service_error")
            return HttpResponse(400, f"bad request: {exc}\n".encode())
        try:
            response = await self.rls.respond(message)
        except FerrymanError as exc:
            status = status_of(exc)
            self.stats.inc(f"{CALL}.{status.counter}")
            what = "backend error" if isinstance(exc, BackendError) else "bad request"
            return HttpResponse(status.http, f"{what}: {exc}\n".encode())
        code = {
            rls_pb2.RateLimitResponse.OK: 200,
            rls_pb2.RateLimitResponse.OVER_LIMIT: 429,
        }.get(response.overall_code, 500)
        # As the reference's protojson.Marshal: fields at their zero value are left out
        # (an over-limit status has no limitRemaining).
        body = json_format.MessageToJson(response, indent=None)
        return HttpResponse(code, body.encode(), "application/json")

    async def _rlconfig(self, request: HttpRequest) -> HttpResponse:
        config = self.holder.config
        lines = []
        for _domain, rule in config.iter_limits() if config is not None else []:
            modes = (
                f"shadow_mode: {str(rule.shadow_mode).lower()}, "
                f"quota_mode: {str(rule.quota_mode).lower()}"
            )
            if rule.burst is not None:
                lines.append(f"{rule.stats_key}: {rule.burst.describe()}, {modes}")
                continue
            if rule.copies is not None:
                lines.append(f"{rule.stats_key}: {rule.copies.describe()}, {modes}")
                continue
            limit = rule.rate_limit
            assert limit is not None
            unit = "UNKNOWN" if limit.unit is None else Unit(limit.unit).name
            line = (
                f"{rule.stats_key}: unit={unit} requests_per_unit={limit.requests_per_unit}, "
                f"shadow_mode: {str(rule.shadow_mode).lower()}, "
                f"quota_mode: {str(rule.quota_mode).lower()}"
            )
            if limit.unlimited:
                line += ", unlimited: true"
            lines.append(line)
        return HttpResponse(200, ("\n".join(lines) + "\n").encode() if lines else b"")

    async def _explain(self, request: HttpRequest) -> HttpResponse:
        """/explain?domain=D&descriptor=k=v[,k=v...] (repeatable): why a request is limited,
        with the current counts, counting nothing (JSON)."""
        params = parse_qs(request.query)
        domain = params.get("domain", [""])[0]
        try:
            requests = [parse_descriptor(text) for text in params.get("descriptor", [])]
            if not requests:
                raise RequestError("descriptor", "give one or more descriptor=k=v[,k=v...]")
            config = self.holder.config
            if config is None:
                raise RequestError("domain", "no rate limit configuration is loaded")
            now = self.clock.now()
            answer = explain(config, domain, requests, self.engine.options, now)
            if answer.ops:
                values = await self.backend.windows.peek(list(answer.ops.values()))
                answer.add_counts(values, now)
        except FerrymanError as exc:
            body = json.dumps({"error": str(exc)}) + "\n"
            return HttpResponse(status_of(exc).http, body.encode(), "application/json")
        body = json.dumps(answer.as_dict(), indent=2) + "\n"
        return HttpResponse(200, body.encode(), "application/json")

    async def _stats_page(self, request: HttpRequest) -> HttpResponse:
        body = "".join(f"{name}: {value}\n" for name, value in self.stats)
        return HttpResponse(200, body.encode())

    def _capacity_panel(self) -> dict[str, object]:
        """The console's table of leased resources (the 30 with the most clients)."""
        status = self.capacity.status()
        resources = status.get("resources")
        rows: list[list[object]] = []
        for r in sorted(
            resources if isinstance(resources, list) else [], key=lambda r: -r["client_count"]
        )[:30]:
            rows.append(
                [
                    r["resource_id"],
                    r["algorithm"],
                    r["capacity"],
                    r["sum_leases"],
                    r["sum_wants"],
                    r["client_count"],
                    "learning" if r["learning"] else "",
                ]
            )
        master = (
            "master" if status.get("is_master") else f"master is {status.get('master_address')}"
        )
        return {
            "columns": ["resource", "algorithm", "capacity", "leased", "wanted", "clients", ""],
            "rows": rows,
            "note": f"this server: {master}",
        }

    async def _capacity_page(self, request: HttpRequest) -> HttpResponse:
        status = self.capacity.status()
        if self.leased is not None:
            status["leased"] = self.leased.status()
        body = json.dumps(status, indent=2) + "\n"
        return HttpResponse(200, body.encode(), "application/json")

    async def _status_page(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(
            200, (json.dumps(self.status(), indent=2) + "\n").encode(), "application/json"
        )

    def status(self) -> dict[str, object]:
        """What /status reports: the state an operator asks about first."""
        holder = self.holder
        config = holder.config
        cache = self.engine.local_cache
        return {
            "healthy": self.healthy(),
            "config": {
                "version": holder.version,
                "loaded_at": _iso(holder.loaded_at) if config is not None else None,
                "directory": str(self.settings.config_dir),
                "files": list(config.files) if config is not None else [],
                "domains": len(config.domains) if config is not None else 0,
                "limits": len(config.iter_limits()) if config is not None else 0,
                "last_error": holder.last_error,
                "last_error_at": _iso(holder.last_error_at) if holder.last_error else None,
            },
            "backend": {
                "name": self.backend.name,
                "healthy": self.backend.healthy(),
                "connections": [c.describe_state() for c in self.backend.connections()]
                if isinstance(self.backend, Watched)
                else [],
            },
            "tls": None
            if self.tls is None
            else {
                "cert": str(self.tls.cert),
                "mutual": self.tls.mutual,
                "client_san": self.tls.client_san or None,
                "reloads": self.tls.reloads,
            },
            "memory": None
            if not isinstance(self.backend, MemoryBackend)
            else {
                "keys": len(self.backend.windows),
                "max_keys": self.backend.windows.max_keys,
                "evicted": self.backend.windows.evicted,
                "refused": self.backend.windows.refused,
            },
            "holds": self.holds.status(),
            "local_cache": None
            if cache is None
            else {"entries": len(cache), "bytes": cache.size_bytes, "max_bytes": cache.max_bytes},
            "stats": {"series": self.stats.series, "max_series": self.stats.max_series},
        }

    async def _prometheus(self, request: HttpRequest) -> HttpResponse:
        reader = self.telemetry.prometheus
        assert reader is not None
        mapping = self.mapping
        if mapping is None:
            # Collection reads every series; keep it off the event loop.
            body = await asyncio.to_thread(reader.render)
        else:
            # PROMETHEUS_MAPPER_YAML: the counters under the file's names, the rest as usual.
            body = await asyncio.to_thread(reader.render, STATS_COUNTER_FAMILIES)
            body = mapping.render(self.stats) + body
        return HttpResponse(200, body.encode(), PROMETHEUS_CONTENT_TYPE)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


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
    try:
        await service.start()
    except BaseException:
        # The start's own error is the one to report, not a failure to undo half of it.
        with contextlib.suppress(Exception):
            await service.stop(grace=0)
        raise
    await stop.wait()
    log.info("shutting down: draining in-flight calls")
    await service.stop()
    log.info("stopped")
