"""One frozen Settings object, read from the reference service's environment variables.

The names and defaults follow envoyproxy/ratelimit so that a deployment written for it runs
ferryman unchanged; command-line flags (see ``ferryman.cli``) override them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ferryman.connections.redis_target import address
from ferryman.durations import parse_duration
from ferryman.errors import SettingsError
from ferryman.logs import parse_level

__all__ = [
    "ACCEPTED_IGNORED",
    "EVENT_LOOPS",
    "Settings",
    "check_redis_url",
    "default_config_dir",
    "split_address",
]

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
#: The reference's pool-exhaustion settings: validated, but ferryman has no pool to exhaust.
POOL_ON_EMPTY = (
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
)
#: Durations among the accepted-and-ignored settings: a bad value is still an error.
DURATIONS_ACCEPTED = (
    "REDIS_POOL_ON_EMPTY_WAIT_DURATION",
    "REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION",
    "MEMCACHE_SRV_REFRESH",
)
#: The reference's variables that ferryman reads and accepts but that change nothing here
#: (the README's migration section says why, one by one); those set are logged once at start.
ACCEPTED_IGNORED = (
    "PROTO",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_ON_EMPTY_WAIT_DURATION",
    "REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION",
    "REDIS_USE_EXPLICIT_PIPELINE",
    "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
)
#: EVENT_LOOP's values (and ``serve --event-loop``'s), the default first.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
_RUNTIME_VARS = ("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean (use true or false)")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.strip().isdigit() or int(raw) > 65535:
        raise SettingsError(f"{name}={raw!r} is not a port number (0-65535; 0 picks a free one)")
    return int(raw)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None


def _duration(env: Mapping[str, str], name: str, default: float) -> float:
    """Read a Go-style duration (``10s``, ``500ms``, ``1m``) or a number of seconds."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = parse_duration(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a duration (e.g. 10s, 500ms)") from None
    if value < 0:
        raise SettingsError(f"{name}={raw!r} must not be negative")
    return value


def _tags(env: Mapping[str, str], name: str) -> tuple[tuple[str, str], ...]:
    """``key1:value1,key2:value2`` (the reference's map form) as pairs, in order."""
    raw = env.get(name, "")
    tags: list[tuple[str, str]] = []
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise SettingsError(f"{name}={raw!r}: give key:value pairs separated by commas")
        tags.append((key.strip(), value.strip()))
    return tuple(tags)


def split_address(address: str, name: str = "address") -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` -> (host, port); an empty host means every
    interface and port 0 a free one. Raises SettingsError naming ``name``."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingsError(f"{name}={address!r} is not host:port (e.g. :9090, 0.0.0.0:9090)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise SettingsError(f"{name}={address!r}: put an IPv6 host in brackets, [::1]:9090")
    return host, int(port)


def default_config_dir() -> Path:
    """The one default: ``descriptors/`` in the current directory, wherever ferryman is
    installed (``--config`` and the RUNTIME_* variables choose another)."""
    return Path.cwd() / "descriptors"


def check_redis_url(kind: str, url: str, socket_type: str, prefix: str) -> None:
    """Catch the usual mix-ups of the reference's REDIS_URL forms before connecting."""
    url_name, socket_name = f"{prefix}_URL", f"{prefix}_SOCKET_TYPE"
    if socket_type not in ("unix", "tcp"):
        raise SettingsError(f"{socket_name}={socket_type!r} must be unix or tcp")
    if "://" in url:
        raise SettingsError(
            f"{url_name}={url!r} is a URL, but {url_name} takes the reference's forms: "
            f"host:port with {socket_name}=tcp, or a socket path; "
            "to give a URL use --backend URL instead"
        )
    if kind == "single" and socket_type == "unix" and "/" not in url and ":" in url:
        raise SettingsError(
            f"{url_name}={url!r} looks like host:port, but {socket_name} is unix "
            f"(the default): set {socket_name}=tcp"
        )


def _check_tls(use_tls: bool, cert: str, key: str, client_ca: str, client_san: str) -> None:
    """The TLS variables make sense together (the files themselves are read at start)."""
    if not use_tls:
        if cert or key or client_ca or client_san:
            raise SettingsError(
                "GRPC_SERVER_TLS_* / GRPC_CLIENT_TLS_* are set but GRPC_SERVER_USE_TLS is not "
                "true: set GRPC_SERVER_USE_TLS=true to serve TLS, or unset them"
            )
        return
    for name, value in (("GRPC_SERVER_TLS_CERT", cert), ("GRPC_SERVER_TLS_KEY", key)):
        if not value:
            raise SettingsError(f"GRPC_SERVER_USE_TLS=true needs {name} (a PEM file)")
    if client_san and not client_ca:
        raise SettingsError(
            "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT: without client certificates "
            "there is no SAN to check"
        )


def _pairs(env: Mapping[str, str], name: str) -> tuple[tuple[str, str], ...]:
    """``key1=value1,key2=value2`` (the reference's node metadata form) as pairs."""
    raw = env.get(name, "")
    pairs: list[tuple[str, str]] = []
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"{name}={raw!r}: give key=value pairs separated by commas")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def _xds(env: Mapping[str, str], d: Settings) -> dict[str, Any]:
    """The CONFIG_GRPC_XDS_* and XDS_CLIENT_* variables (read whatever CONFIG_TYPE is, so
    that a bad value is an error before it matters)."""
    use_tls = _bool(env, "CONFIG_GRPC_XDS_SERVER_USE_TLS", d.xds_server_use_tls)
    cert = env.get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", d.xds_client_tls_cert)
    key = env.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", d.xds_client_tls_key)
    if bool(cert) != bool(key):
        raise SettingsError(
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together "
            "(a client certificate and its key, PEM files)"
        )
    factor = _float(env, "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", d.xds_backoff_random_factor)
    if not 0.0 <= factor <= 1.0:
        raise SettingsError(f"XDS_CLIENT_BACKOFF_RANDOM_FACTOR={factor} must be between 0 and 1")
    url = env.get("CONFIG_GRPC_XDS_SERVER_URL", "") or d.xds_server_url
    initial = _duration(env, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", d.xds_backoff_initial_interval)
    most = _duration(env, "XDS_CLIENT_BACKOFF_MAX_INTERVAL", d.xds_backoff_max_interval)
    if most < initial:
        raise SettingsError(
            f"XDS_CLIENT_BACKOFF_MAX_INTERVAL ({most:g}s) is shorter than "
            f"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL ({initial:g}s)"
        )
    return {
        "xds_server_url": url,
        "xds_node_id": env.get("CONFIG_GRPC_XDS_NODE_ID", "") or d.xds_node_id,
        "xds_node_metadata": _pairs(env, "CONFIG_GRPC_XDS_NODE_METADATA"),
        "xds_additional_headers": _tags(env, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"),
        "xds_connect_retry_interval": _duration(
            env,
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            d.xds_connect_retry_interval,
        ),
        "xds_server_use_tls": use_tls,
        "xds_client_tls_cert": cert,
        "xds_client_tls_key": key,
        "xds_server_tls_cacert": env.get(
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", d.xds_server_tls_cacert
        ),
        "xds_server_tls_san": env.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN", d.xds_server_tls_san),
        "xds_backoff_initial_interval": initial,
        "xds_backoff_max_interval": most,
        "xds_backoff_random_factor": factor,
        "xds_backoff_jitter": _bool(env, "XDS_CLIENT_BACKOFF_JITTER", d.xds_backoff_jitter),
        "xds_max_msg_size": _int(env, "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", d.xds_max_msg_size),
    }


_REDIS_STARTUP = (
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
)


def _redis_startup(env: Mapping[str, str], d: Settings) -> dict[str, Any]:
    """REDIS_STARTUP_*: setting any of them makes the service wait for Redis at start."""
    initial = _duration(env, "REDIS_STARTUP_INITIAL_INTERVAL", d.redis_startup_initial_interval)
    most = _duration(env, "REDIS_STARTUP_MAX_INTERVAL", d.redis_startup_max_interval)
    if initial <= 0:
        raise SettingsError("REDIS_STARTUP_INITIAL_INTERVAL must be more than 0")
    if most < initial:
        raise SettingsError(
            f"REDIS_STARTUP_MAX_INTERVAL ({most:g}s) is shorter than "
            f"REDIS_STARTUP_INITIAL_INTERVAL ({initial:g}s)"
        )
    return {
        "redis_startup_wait": any(env.get(name, "") != "" for name in _REDIS_STARTUP),
        "redis_startup_initial_interval": initial,
        "redis_startup_max_interval": most,
        "redis_startup_max_elapsed_time": _duration(
            env, "REDIS_STARTUP_MAX_ELAPSED_TIME", d.redis_startup_max_elapsed_time
        ),
    }


@dataclass(frozen=True)
class Settings:
    """Everything the service reads from its environment, validated once at startup."""

    host: str = "0.0.0.0"
    port: int = 8080
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 8081
    # Loopback by default (the reference binds every interface): the debug pages describe
    # the configuration and counters, which are nobody else's business.
    debug_host: str = "127.0.0.1"
    debug_port: int = 6070
    log_level: str = "info"
    log_format: str = "text"

    config_dir: Path = field(default_factory=default_config_dir)
    runtime_root: Path | None = None
    watch_root: bool = True
    ignore_dotfiles: bool = True
    merge_domain_config: bool = False

    backend: str = "memory"
    redis_socket_type: str = "unix"
    redis_type: str = "single"
    redis_url: str = "/var/run/nutcracker/ratelimit.sock"
    redis_auth: str = ""
    redis_tls: bool = False
    redis_pool_size: int = 10
    redis_timeout: float = 10.0
    redis_pipeline_window: float = 0.0
    redis_pipeline_limit: int = 0
    redis_persecond: bool = False
    redis_persecond_url: str = "/var/run/nutcracker/ratelimitpersecond.sock"
    redis_persecond_socket_type: str = "unix"
    redis_persecond_tls: bool = False
    redis_persecond_type: str = "single"
    redis_persecond_auth: str = ""
    redis_persecond_pool_size: int = 10
    redis_persecond_pipeline_window: float = 0.0
    redis_persecond_pipeline_limit: int = 0
    # BACKEND_TYPE=memcache: MEMCACHE_HOST_PORT's servers.
    memcache_servers: tuple[tuple[str, int], ...] = ()
    cache_key_prefix: str = ""
    expiration_jitter_max_seconds: int = 300
    local_cache_size_in_bytes: int = 0
    fail_open: bool = False
    # Fixed-window counters the memory backend keeps at most (0: no cap); see its store.
    memory_max_keys: int = 100_000
    # Health fails while the backend is down (by default it stays SERVING: the service
    # still answers, with its failure policy).
    health_requires_backend: bool = False

    near_limit_ratio: float = 0.8
    shadow_mode: bool = False
    quota_mode: bool = False
    stop_cache_key_increment_when_overlimit: bool = False
    limit_response_headers_enabled: bool = False
    limit_limit_header: str = "RateLimit-Limit"
    limit_remaining_header: str = "RateLimit-Remaining"
    limit_reset_header: str = "RateLimit-Reset"
    response_dynamic_metadata: bool = False

    use_prometheus: bool = False
    prometheus_addr: str = ":9090"
    prometheus_path: str = "/metrics"
    metrics_max_series: int = 10_000
    tracing_enabled: bool = False
    tracing_sampling_rate: float = 1.0
    # OpenTelemetry's standard OTEL_EXPORTER_OTLP_[METRICS_|TRACES_]ENDPOINT: push over OTLP/gRPC.
    otlp_metrics_endpoint: str = ""
    otlp_traces_endpoint: str = ""

    # The reference's settings that change what ferryman does (issue 17).
    # FILE (descriptor files) or GRPC_XDS_SOTW (RateLimitConfig resources over ADS).
    config_type: str = "FILE"
    force_start_without_initial_config: bool = False
    healthy_with_at_least_one_config_loaded: bool = False
    # CONFIG_TYPE=GRPC_XDS_SOTW: the management server and how ferryman reaches it.
    xds_server_url: str = "localhost:18000"
    xds_node_id: str = "default"
    xds_node_metadata: tuple[tuple[str, str], ...] = ()
    xds_additional_headers: tuple[tuple[str, str], ...] = ()
    xds_connect_retry_interval: float = 3.0
    xds_server_use_tls: bool = False
    xds_client_tls_cert: str = ""
    xds_client_tls_key: str = ""
    xds_server_tls_cacert: str = ""
    xds_server_tls_san: str = ""
    xds_backoff_initial_interval: float = 10.0
    xds_backoff_max_interval: float = 60.0
    xds_backoff_random_factor: float = 0.5
    xds_backoff_jitter: bool = True
    # 0: gRPC's default (4 MiB).
    xds_max_msg_size: int = 0

    # Wait for Redis at start (any REDIS_STARTUP_* set), retrying with exponential backoff
    # from the initial interval up to the maximum; give up after max elapsed (0: never).
    redis_startup_wait: bool = False
    redis_startup_initial_interval: float = 1.0
    redis_startup_max_interval: float = 30.0
    redis_startup_max_elapsed_time: float = 0.0

    grpc_uds: str = ""
    grpc_max_connection_age: float = 24 * 3600.0
    grpc_max_connection_age_grace: float = 3600.0

    use_statsd: bool = True
    statsd_host: str = "localhost"
    statsd_port: int = 8125
    # The reference's statsd library reads STATSD_PROTOCOL too: tcp (its default) or udp.
    statsd_protocol: str = "tcp"
    # Whether the StatsD sink was asked for (any of its variables set), or is only on by
    # default: an agent missing by default is not worth a WARNING.
    statsd_explicit: bool = False
    stats_flush_interval: float = 10.0
    extra_tags: tuple[tuple[str, str], ...] = ()
    disable_stats: bool = False
    use_dog_statsd: bool = False
    use_dog_statsd_mogrifiers: tuple[str, ...] = ()
    # The DOG_STATSD_MOGRIFIER_<NAME>_{PATTERN,NAME,TAGS} variables of those mogrifiers.
    dog_statsd_mogrifier_env: tuple[tuple[str, str], ...] = ()
    prometheus_mapper_yaml: str = ""
    prometheus_response_time_as_milliseconds: bool = False

    redis_tls_cacert: str = ""
    redis_tls_client_cert: str = ""
    redis_tls_client_key: str = ""
    redis_tls_skip_hostname_verification: bool = False
    redis_sentinel_auth: str = ""
    redis_persecond_sentinel_auth: str = ""
    # None: as REDIS_TIMEOUT (what ferryman did before the reference split them).
    redis_persecond_timeout: float | None = None

    # Empty: OTEL_SERVICE_NAME when set, else the reference's default, "RateLimit".
    tracing_service_name: str = ""
    tracing_service_namespace: str = ""
    tracing_service_instance_id: str = ""
    # How spans are pushed (OTLP over http or grpc). The reference's default, http, is what
    # from_env gives; a Settings built in code keeps gRPC, the transport of OTLP metrics.
    tracing_exporter_protocol: str = "grpc"

    # Set variables of the reference that ferryman accepts but cannot honour (logged once).
    ignored: tuple[str, ...] = ()

    shutdown_grace_seconds: float = 10.0
    hold_lease_seconds: float = 10.0
    # gRPC keepalive: a connection that does not answer a ping within the timeout is closed,
    # which ends its sessions (and frees their holds) when a client host dies silently.
    grpc_keepalive_time: float = 10.0
    grpc_keepalive_timeout: float = 5.0
    # Processes serving the same ports (SO_REUSEPORT); more than one needs a shared backend.
    workers: int = 1
    # The event loop: uvloop when importable (auto), or insisted on, or asyncio's own.
    event_loop: str = "auto"

    # Capacity leases (doorman.Capacity): a client is recomputed at most this often per
    # resource (0: always); the address replicas advertise as master (empty: the gRPC
    # listen address); the parent server (host:port; empty: this server is a root); the
    # term a master holds through Redis before it must renew.
    doorman_minimum_refresh_interval: float = 5.0
    doorman_advertise_address: str = ""
    doorman_parent: str = ""
    doorman_election_term: float = 10.0
    doorman_grant_unconfigured: bool = True

    # TLS on every port (the reference's names); mutual TLS when a client CA is given.
    grpc_server_use_tls: bool = False
    grpc_server_tls_cert: str = ""
    grpc_server_tls_key: str = ""
    grpc_client_tls_cacert: str = ""
    grpc_client_tls_san: str = ""

    # The config API: where versions live (files: the config directory, redis: the
    # backend's Redis), the bearer token file that turns it on, and how many versions stay.
    config_store: str = "files"
    admin_tokens_file: str = ""
    config_history: int = 100

    # Envoy or Istio files whose routes the debug port explains (/explain/envoy): read at
    # start; they need the ferryman[envoy] extra.
    envoy_config_files: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default: ``os.environ``); raises SettingsError."""
        env = os.environ if env is None else env
        d = cls()
        config_store = env.get("CONFIG_STORE", d.config_store).strip().lower() or d.config_store
        if config_store not in ("files", "redis"):
            raise SettingsError(f"CONFIG_STORE={config_store!r}: use files or redis")
        runtime_root: Path | None = None
        config_dir = d.config_dir
        if any(name in env for name in _RUNTIME_VARS):
            runtime_root = Path(env.get("RUNTIME_ROOT", "/srv/runtime_data/current"))
            config_dir = (
                runtime_root
                / env.get("RUNTIME_SUBDIRECTORY", "")
                / env.get("RUNTIME_APPDIRECTORY", "config")
            )
        backend_type = env.get("BACKEND_TYPE", "").strip().lower()
        if not backend_type and env.get("REDIS_URL"):
            # The reference defaults to Redis, and manifests written for it (Istio's guide
            # among them) set only REDIS_URL: honour that.
            backend = "redis"
        elif backend_type in ("", "memory"):
            backend = "memory"
        elif backend_type == "redis":
            backend = "redis"
        elif backend_type == "memcache":
            backend = "memcache"
            if not env.get("MEMCACHE_HOST_PORT"):
                raise SettingsError(
                    "BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT=host:port[,host:port...]"
                    + (
                        " (MEMCACHE_SRV discovery is not supported)"
                        if env.get("MEMCACHE_SRV")
                        else ""
                    )
                )
            if _bool(env, "MEMCACHE_TLS", False):
                raise SettingsError("MEMCACHE_TLS=true: ferryman speaks to memcached without TLS")
        else:
            raise SettingsError(
                f"BACKEND_TYPE={backend_type!r} is not supported (memory, redis, memcache)"
            )
        memcache_servers = tuple(
            address(item, "MEMCACHE_HOST_PORT")
            for item in env.get("MEMCACHE_HOST_PORT", "").split(",")
            if item.strip()
        )
        ratio = _float(env, "NEAR_LIMIT_RATIO", d.near_limit_ratio)
        if not 0.0 <= ratio <= 1.0:
            raise SettingsError(f"NEAR_LIMIT_RATIO={ratio} must be between 0 and 1")
        sampling = _float(env, "TRACING_SAMPLING_RATE", d.tracing_sampling_rate)
        if not 0.0 <= sampling <= 1.0:
            raise SettingsError(f"TRACING_SAMPLING_RATE={sampling} must be between 0 and 1")
        prometheus_addr = env.get("PROMETHEUS_ADDR", d.prometheus_addr)
        split_address(prometheus_addr, "PROMETHEUS_ADDR")
        prometheus_path = env.get("PROMETHEUS_PATH", d.prometheus_path)
        if not prometheus_path.startswith("/"):
            raise SettingsError(f"PROMETHEUS_PATH={prometheus_path!r} must start with '/'")
        otlp = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        log_format = env.get("LOG_FORMAT", d.log_format).lower()
        if log_format not in ("text", "json"):
            raise SettingsError(f"LOG_FORMAT={log_format!r} must be text or json")
        log_level = env.get("LOG_LEVEL", "") or d.log_level
        parse_level(log_level)
        parent = env.get("DOORMAN_PARENT", d.doorman_parent).strip()
        if parent:
            split_address(parent, "DOORMAN_PARENT")
        term = _duration(env, "DOORMAN_ELECTION_TERM", d.doorman_election_term)
        if term < 0.1:
            raise SettingsError(f"DOORMAN_ELECTION_TERM={term:g}s must be at least 100ms")
        use_tls = _bool(env, "GRPC_SERVER_USE_TLS", d.grpc_server_use_tls)
        tls_cert = env.get("GRPC_SERVER_TLS_CERT", d.grpc_server_tls_cert)
        tls_key = env.get("GRPC_SERVER_TLS_KEY", d.grpc_server_tls_key)
        client_ca = env.get("GRPC_CLIENT_TLS_CACERT", d.grpc_client_tls_cacert)
        client_san = env.get("GRPC_CLIENT_TLS_SAN", d.grpc_client_tls_san)
        _check_tls(use_tls, tls_cert, tls_key, client_ca, client_san)
        config_type = (env.get("CONFIG_TYPE", "") or d.config_type).upper()
        if config_type not in ("FILE", "GRPC_XDS_SOTW"):
            raise SettingsError(
                f"CONFIG_TYPE={config_type!r} must be FILE (descriptor files) or GRPC_XDS_SOTW "
                "(RateLimitConfig resources from an xDS management server)"
            )
        xds = _xds(env, d)
        startup = _redis_startup(env, d)
        protocol = (env.get("TRACING_EXPORTER_PROTOCOL", "") or "http").lower()
        if protocol not in ("http", "grpc"):
            raise SettingsError(f"TRACING_EXPORTER_PROTOCOL={protocol!r} must be http or grpc")
        for name in POOL_ON_EMPTY:
            behaviour = env.get(name, "").upper()
            if behaviour and behaviour not in ("WAIT", "CREATE", "ERROR"):
                raise SettingsError(f"{name}={behaviour!r} must be WAIT, CREATE or ERROR")
        for name in DURATIONS_ACCEPTED:
            _duration(env, name, 0.0)
        mogrifiers = tuple(
            m.strip() for m in env.get("USE_DOG_STATSD_MOGRIFIERS", "").split(",") if m.strip()
        )
        mogrifier_env = tuple(
            sorted((k, v) for k, v in env.items() if k.startswith("DOG_STATSD_MOGRIFIER_"))
        )
        use_dog_statsd = _bool(env, "USE_DOG_STATSD", d.use_dog_statsd)
        if use_dog_statsd:
            from ferryman.statsd import mogrifiers_from_env

            mogrifiers_from_env(mogrifiers, dict(mogrifier_env))
        statsd_protocol = (env.get("STATSD_PROTOCOL", "") or d.statsd_protocol).lower()
        if statsd_protocol not in ("tcp", "udp"):
            raise SettingsError(f"STATSD_PROTOCOL={statsd_protocol!r} must be tcp or udp")
        raw_loop = env.get("EVENT_LOOP", "")
        event_loop = raw_loop.strip().lower() or d.event_loop
        if event_loop not in EVENT_LOOPS:
            raise SettingsError(
                f"EVENT_LOOP={raw_loop!r} must be auto (uvloop when installed), uvloop or asyncio"
            )
        # DISABLE_STATS, as the reference: no stats sink of any kind.
        disable_stats = _bool(env, "DISABLE_STATS", d.disable_stats)
        return cls(
            config_type=config_type,
            **xds,
            **startup,
            force_start_without_initial_config=_bool(
                env, "FORCE_START_WITHOUT_INITIAL_CONFIG", d.force_start_without_initial_config
            ),
            healthy_with_at_least_one_config_loaded=_bool(
                env,
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
                d.healthy_with_at_least_one_config_loaded,
            ),
            grpc_uds=env.get("GRPC_UDS", d.grpc_uds),
            grpc_max_connection_age=_duration(
                env, "GRPC_MAX_CONNECTION_AGE", d.grpc_max_connection_age
            ),
            grpc_max_connection_age_grace=_duration(
                env, "GRPC_MAX_CONNECTION_AGE_GRACE", d.grpc_max_connection_age_grace
            ),
            use_statsd=_bool(env, "USE_STATSD", d.use_statsd),
            statsd_host=env.get("STATSD_HOST", d.statsd_host),
            statsd_port=_port(env, "STATSD_PORT", d.statsd_port),
            statsd_protocol=statsd_protocol,
            statsd_explicit=any(
                env.get(name, "") != ""
                for name in (
                    "USE_STATSD",
                    "STATSD_HOST",
                    "STATSD_PORT",
                    "STATSD_PROTOCOL",
                    "USE_DOG_STATSD",
                )
            ),
            stats_flush_interval=_duration(env, "STATS_FLUSH_INTERVAL", d.stats_flush_interval),
            extra_tags=_tags(env, "EXTRA_TAGS"),
            disable_stats=disable_stats,
            use_dog_statsd=use_dog_statsd,
            use_dog_statsd_mogrifiers=mogrifiers,
            dog_statsd_mogrifier_env=mogrifier_env,
            prometheus_mapper_yaml=env.get("PROMETHEUS_MAPPER_YAML", d.prometheus_mapper_yaml),
            prometheus_response_time_as_milliseconds=_bool(
                env,
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
                d.prometheus_response_time_as_milliseconds,
            ),
            redis_tls_cacert=env.get("REDIS_TLS_CACERT", d.redis_tls_cacert),
            redis_tls_client_cert=env.get("REDIS_TLS_CLIENT_CERT", d.redis_tls_client_cert),
            redis_tls_client_key=env.get("REDIS_TLS_CLIENT_KEY", d.redis_tls_client_key),
            redis_tls_skip_hostname_verification=_bool(
                env,
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                d.redis_tls_skip_hostname_verification,
            ),
            redis_sentinel_auth=env.get("REDIS_SENTINEL_AUTH", d.redis_sentinel_auth),
            redis_persecond_sentinel_auth=env.get(
                "REDIS_PERSECOND_SENTINEL_AUTH", d.redis_persecond_sentinel_auth
            ),
            redis_persecond_timeout=_duration(env, "REDIS_PERSECOND_TIMEOUT", 0.0)
            if env.get("REDIS_PERSECOND_TIMEOUT")
            else None,
            tracing_service_name=env.get("TRACING_SERVICE_NAME", d.tracing_service_name),
            tracing_service_namespace=env.get(
                "TRACING_SERVICE_NAMESPACE", d.tracing_service_namespace
            ),
            tracing_service_instance_id=env.get(
                "TRACING_SERVICE_INSTANCE_ID", d.tracing_service_instance_id
            ),
            tracing_exporter_protocol=protocol,
            ignored=tuple(name for name in ACCEPTED_IGNORED if env.get(name, "") != ""),
            memcache_servers=memcache_servers,
            host=env.get("HOST", d.host),
            port=_port(env, "PORT", d.port),
            grpc_host=env.get("GRPC_HOST", d.grpc_host),
            grpc_port=_port(env, "GRPC_PORT", d.grpc_port),
            debug_host=env.get("DEBUG_HOST", d.debug_host),
            debug_port=_port(env, "DEBUG_PORT", d.debug_port),
            log_level=log_level.lower(),
            log_format=log_format,
            config_dir=config_dir,
            runtime_root=runtime_root,
            watch_root=_bool(env, "RUNTIME_WATCH_ROOT", d.watch_root),
            ignore_dotfiles=_bool(env, "RUNTIME_IGNOREDOTFILES", d.ignore_dotfiles),
            merge_domain_config=_bool(env, "MERGE_DOMAIN_CONFIG", d.merge_domain_config),
            backend=backend,
            redis_socket_type=env.get("REDIS_SOCKET_TYPE", d.redis_socket_type).lower(),
            redis_type=env.get("REDIS_TYPE", d.redis_type).lower(),
            redis_url=env.get("REDIS_URL", d.redis_url),
            redis_auth=env.get("REDIS_AUTH", d.redis_auth),
            redis_tls=_bool(env, "REDIS_TLS", d.redis_tls),
            redis_pool_size=_int(env, "REDIS_POOL_SIZE", d.redis_pool_size, minimum=1),
            redis_timeout=_duration(env, "REDIS_TIMEOUT", d.redis_timeout),
            redis_pipeline_window=_duration(env, "REDIS_PIPELINE_WINDOW", d.redis_pipeline_window),
            redis_pipeline_limit=_int(env, "REDIS_PIPELINE_LIMIT", d.redis_pipeline_limit),
            redis_persecond=_bool(env, "REDIS_PERSECOND", d.redis_persecond),
            redis_persecond_url=env.get("REDIS_PERSECOND_URL", d.redis_persecond_url),
            redis_persecond_socket_type=env.get(
                "REDIS_PERSECOND_SOCKET_TYPE", d.redis_persecond_socket_type
            ).lower(),
            redis_persecond_tls=_bool(env, "REDIS_PERSECOND_TLS", d.redis_persecond_tls),
            redis_persecond_type=env.get("REDIS_PERSECOND_TYPE", d.redis_persecond_type).lower(),
            redis_persecond_auth=env.get("REDIS_PERSECOND_AUTH", d.redis_persecond_auth),
            redis_persecond_pool_size=_int(
                env, "REDIS_PERSECOND_POOL_SIZE", d.redis_persecond_pool_size, minimum=1
            ),
            redis_persecond_pipeline_window=_duration(
                env, "REDIS_PERSECOND_PIPELINE_WINDOW", d.redis_persecond_pipeline_window
            ),
            redis_persecond_pipeline_limit=_int(
                env, "REDIS_PERSECOND_PIPELINE_LIMIT", d.redis_persecond_pipeline_limit
            ),
            cache_key_prefix=env.get("CACHE_KEY_PREFIX", d.cache_key_prefix),
            expiration_jitter_max_seconds=_int(
                env, "EXPIRATION_JITTER_MAX_SECONDS", d.expiration_jitter_max_seconds
            ),
            local_cache_size_in_bytes=_int(
                env, "LOCAL_CACHE_SIZE_IN_BYTES", d.local_cache_size_in_bytes
            ),
            fail_open=_bool(env, "FAIL_OPEN", d.fail_open),
            memory_max_keys=_int(env, "MEMORY_MAX_KEYS", d.memory_max_keys),
            health_requires_backend=_bool(
                env, "FERRYMAN_HEALTH_REQUIRES_BACKEND", d.health_requires_backend
            )
            or _bool(env, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", False),
            near_limit_ratio=ratio,
            shadow_mode=_bool(env, "SHADOW_MODE", d.shadow_mode),
            quota_mode=_bool(env, "QUOTA_MODE", d.quota_mode),
            stop_cache_key_increment_when_overlimit=_bool(
                env,
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
                d.stop_cache_key_increment_when_overlimit,
            ),
            limit_response_headers_enabled=_bool(
                env, "LIMIT_RESPONSE_HEADERS_ENABLED", d.limit_response_headers_enabled
            ),
            limit_limit_header=env.get("LIMIT_LIMIT_HEADER", d.limit_limit_header),
            limit_remaining_header=env.get("LIMIT_REMAINING_HEADER", d.limit_remaining_header),
            limit_reset_header=env.get("LIMIT_RESET_HEADER", d.limit_reset_header),
            response_dynamic_metadata=_bool(
                env, "RESPONSE_DYNAMIC_METADATA", d.response_dynamic_metadata
            ),
            use_prometheus=_bool(env, "USE_PROMETHEUS", d.use_prometheus) and not disable_stats,
            prometheus_addr=prometheus_addr,
            prometheus_path=prometheus_path,
            metrics_max_series=_int(env, "METRICS_MAX_SERIES", d.metrics_max_series, minimum=1),
            tracing_enabled=_bool(env, "TRACING_ENABLED", d.tracing_enabled),
            tracing_sampling_rate=sampling,
            otlp_metrics_endpoint=""
            if disable_stats
            else env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "") or otlp,
            otlp_traces_endpoint=env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "") or otlp,
            hold_lease_seconds=_duration(env, "HOLD_LEASE_SECONDS", d.hold_lease_seconds),
            grpc_keepalive_time=_duration(env, "GRPC_KEEPALIVE_TIME", d.grpc_keepalive_time),
            grpc_keepalive_timeout=_duration(
                env, "GRPC_KEEPALIVE_TIMEOUT", d.grpc_keepalive_timeout
            ),
            shutdown_grace_seconds=_duration(
                env, "FERRYMAN_SHUTDOWN_GRACE", d.shutdown_grace_seconds
            ),
            workers=_int(env, "WORKERS", d.workers, minimum=1),
            event_loop=event_loop,
            doorman_minimum_refresh_interval=_duration(
                env, "DOORMAN_MINIMUM_REFRESH_INTERVAL", d.doorman_minimum_refresh_interval
            ),
            doorman_advertise_address=env.get(
                "DOORMAN_ADVERTISE_ADDRESS", d.doorman_advertise_address
            ),
            doorman_parent=parent,
            doorman_election_term=term,
            doorman_grant_unconfigured=_bool(
                env, "DOORMAN_GRANT_UNCONFIGURED", d.doorman_grant_unconfigured
            ),
            grpc_server_use_tls=use_tls,
            grpc_server_tls_cert=tls_cert,
            grpc_server_tls_key=tls_key,
            grpc_client_tls_cacert=client_ca,
            grpc_client_tls_san=client_san,
            config_store=config_store,
            admin_tokens_file=env.get("ADMIN_TOKENS_FILE", d.admin_tokens_file),
            config_history=_int(env, "CONFIG_HISTORY", d.config_history, minimum=1),
            envoy_config_files=tuple(
                f.strip() for f in env.get("ENVOY_CONFIG_FILES", "").split(",") if f.strip()
            ),
        )

    def with_overrides(self, **changes: object) -> Settings:
        """A copy with the given fields replaced (used for command-line flags)."""
        return replace(self, **changes)  # type: ignore[arg-type]
