"""Every setting, declared once: the :class:`Settings` fields (each with its variable, kind,
default, help and flag) and the variables that feed them or that ferryman accepts and ignores.

The names and defaults follow envoyproxy/ratelimit so that a deployment written for it runs
ferryman unchanged; ``ferryman serve``'s flags override them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ferryman.settings.declare import METADATA, Flag, Setting, Topic
from ferryman.settings.kinds import (
    Address,
    Boolean,
    Choice,
    Duration,
    HttpPath,
    Integer,
    Items,
    LogLevel,
    Number,
    Pairs,
    PathText,
    Port,
    Servers,
    Text,
)

__all__ = [
    "ACCEPTED",
    "ACCEPTED_IGNORED",
    "EVENT_LOOPS",
    "TOPICS",
    "VARIABLES",
    "Settings",
    "declared",
    "default_config_dir",
    "every_setting",
]

LISTEN = Topic("Ports and listeners")
LOGS = Topic("Logs")
CONFIG = Topic(
    "Descriptor configuration",
    "Where the descriptor files are, or the xDS management server that sends them.",
)
XDS = Topic(
    "xDS management server",
    "Read whatever `CONFIG_TYPE` is, so that a bad value stops the start before it matters; "
    "used with `CONFIG_TYPE=GRPC_XDS_SOTW`.",
)
CONFIG_API = Topic("Config API")
LIMITS = Topic("Limits and answers")
BACKEND = Topic("Backend")
REDIS = Topic(
    "Redis",
    "`REDIS_URL` takes the reference's forms: `host:port` with `REDIS_SOCKET_TYPE=tcp`, a "
    "socket path, `host:port,host:port` for a cluster, `master,host:port,...` for Sentinel "
    "(a URL goes to `serve --backend`).",
)
PERSECOND = Topic(
    "Redis for per-second limits",
    "With `REDIS_PERSECOND=true`, limits of unit second go to a second Redis.",
)
TLS = Topic("Transport security", "TLS on every port; mutual TLS when a client CA is given.")
STATSD = Topic("StatsD")
METRICS = Topic("Prometheus and OpenTelemetry metrics")
TRACING = Topic("Tracing")
CAPACITY = Topic("Capacity leases (doorman.Capacity)")
RLQS = Topic(
    "Envoy's rate limit quota service",
    "What one process holds at most of Envoys' quota streams, and how often a bucket's "
    "shares are divided again.",
)
ACCESS = Topic(
    "Access and caps",
    "What one caller may open, and the key that signs transfer ids "
    "(see Security and access policy).",
)
PROCESS = Topic("Processes and shutdown")
IGNORED = Topic(
    "Accepted and ignored",
    "The reference's variables that ferryman reads but that change nothing here. Each one "
    "that is set is named in one WARNING line at start; a value that cannot be valid (a "
    "duration that does not parse, an unknown pool behaviour) is still refused.",
)
TOPICS = (
    LISTEN,
    LOGS,
    CONFIG,
    XDS,
    CONFIG_API,
    LIMITS,
    BACKEND,
    REDIS,
    PERSECOND,
    TLS,
    STATSD,
    METRICS,
    TRACING,
    CAPACITY,
    RLQS,
    ACCESS,
    PROCESS,
    IGNORED,
)

EVENT_LOOP_KIND = Choice((("auto", "uvloop when installed"), ("uvloop", ""), ("asyncio", "")))
#: EVENT_LOOP's values (and ``serve --event-loop``'s), the default first.
EVENT_LOOPS = EVENT_LOOP_KIND.choices()
_HOST = "address to listen on (empty or `0.0.0.0`: every IPv4 interface, `::` every one)"
_DURATION = Duration()
_TEXT = Text()
_BOOL = Boolean()
_COUNT = Integer()
_HEADER_FORMAT = Choice(
    (
        ("draft", "RateLimit-Limit, -Remaining and -Reset, as the reference sends them"),
        ("ietf", "the IETF RateLimit-Policy and RateLimit structured fields"),
    )
)
_POOL_ON_EMPTY = Choice((("WAIT", ""), ("CREATE", ""), ("ERROR", "")), fold="upper")
_NO_POOL = (
    "a single Redis (or Sentinel's master) is one pipelined connection that every request "
    "shares, and a Cluster one per node: there is no pool to run empty. Every call is still "
    "bounded by `REDIS_TIMEOUT` (the reference's `WAIT` with a deadline); `CREATE` and "
    "`ERROR` have nothing to create or refuse"
)
_ONE_SCRIPT = (
    "each request is already one script call per Redis (per slot on a Cluster, all slots in "
    "parallel), written in batches; a `READONLY` reply already makes the connection find the "
    "master again"
)
_MEMCACHE_TLS = (
    "memcached is reached without TLS (`MEMCACHE_TLS=true` with `BACKEND_TYPE=memcache` is "
    "refused); the files are only used with it"
)


def default_config_dir() -> Path:
    """The one default: ``descriptors/`` in the current directory, wherever ferryman is
    installed (``--config`` and the RUNTIME_* variables choose another)."""
    return Path.cwd() / "descriptors"


#: Variables that are no field of their own: they feed fields, or another part reads them.
FEEDING = (
    CONFIG.variable(
        "RUNTIME_ROOT",
        "/srv/runtime_data/current",
        _TEXT,
        "the descriptor directory is `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`"
        " when any of the three is set (even empty); else `descriptors/` here",
    ),
    CONFIG.variable("RUNTIME_SUBDIRECTORY", "", _TEXT, "see `RUNTIME_ROOT`"),
    CONFIG.variable("RUNTIME_APPDIRECTORY", "config", _TEXT, "see `RUNTIME_ROOT`"),
    BACKEND.variable(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        False,
        _BOOL,
        "the reference's name for `FERRYMAN_HEALTH_REQUIRES_BACKEND`: either one true turns it on",
    ),
    STATSD.variable(
        "DOG_STATSD_MOGRIFIER_<NAME>_PATTERN",
        "",
        _TEXT,
        "a regular expression on stat names, for the mogrifier `<NAME>` that "
        "`USE_DOG_STATSD_MOGRIFIERS` lists (needed)",
    ),
    STATSD.variable(
        "DOG_STATSD_MOGRIFIER_<NAME>_NAME",
        "",
        _TEXT,
        "the new name, with `$1`-style groups of the pattern (needed)",
    ),
    STATSD.variable(
        "DOG_STATSD_MOGRIFIER_<NAME>_TAGS",
        (),
        Pairs(":"),
        "tags to add, with groups of the pattern",
    ),
    METRICS.variable(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "",
        _TEXT,
        "OpenTelemetry's endpoint for metrics and spans alike, where the `METRICS_` and "
        "`TRACES_` variables name none of their own",
    ),
    TRACING.variable(
        "OTEL_SERVICE_NAME",
        "",
        _TEXT,
        "the service's name in spans and OTLP metrics when `TRACING_SERVICE_NAME` is empty",
        read_by="OpenTelemetry's SDK",
    ),
    TRACING.variable(
        "OTEL_RESOURCE_ATTRIBUTES",
        "",
        Pairs("="),
        "more attributes of the service in spans and OTLP metrics",
        read_by="OpenTelemetry's SDK",
    ),
    PROCESS.variable(
        "FERRYMAN_WORKER",
        "",
        _TEXT,
        "set by `serve --workers N` in each worker it starts (the worker's index), which "
        "then serves instead of supervising; not for operators",
        read_by="`ferryman serve`",
    ),
)

#: The reference's variables that ferryman reads and accepts but that change nothing here;
#: those set are logged once at start.
ACCEPTED = (
    IGNORED.accepted(
        "PROTO",
        _TEXT,
        "the reference's listener protocol; ferryman listens on TCP, or on `GRPC_UDS`",
    ),
    IGNORED.accepted("REDIS_POOL_ON_EMPTY_BEHAVIOR", _POOL_ON_EMPTY, _NO_POOL),
    IGNORED.accepted("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", _POOL_ON_EMPTY, _NO_POOL),
    IGNORED.accepted("REDIS_POOL_ON_EMPTY_WAIT_DURATION", _DURATION, _NO_POOL),
    IGNORED.accepted("REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION", _DURATION, _NO_POOL),
    IGNORED.accepted("REDIS_USE_EXPLICIT_PIPELINE", _BOOL, _ONE_SCRIPT),
    IGNORED.accepted("REDIS_PERSECOND_USE_EXPLICIT_PIPELINE", _BOOL, _ONE_SCRIPT),
    IGNORED.accepted("REDIS_CLUSTER_PIPELINE_PARALLELISM", _COUNT, _ONE_SCRIPT),
    IGNORED.accepted("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", _COUNT, _ONE_SCRIPT),
    IGNORED.accepted("REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR", _BOOL, _ONE_SCRIPT),
    IGNORED.accepted(
        "MEMCACHE_MAX_IDLE_CONNS",
        _COUNT,
        "ferryman keeps one connection to each memcached server, shared by every request",
    ),
    IGNORED.accepted(
        "MEMCACHE_SRV",
        _TEXT,
        "servers are found only from `MEMCACHE_HOST_PORT` (with `MEMCACHE_SRV` alone, "
        "`BACKEND_TYPE=memcache` is refused)",
    ),
    IGNORED.accepted(
        "MEMCACHE_SRV_REFRESH", _DURATION, "servers are found only from `MEMCACHE_HOST_PORT`"
    ),
    IGNORED.accepted("MEMCACHE_TLS", _BOOL, _MEMCACHE_TLS, default=False),
    IGNORED.accepted("MEMCACHE_TLS_CLIENT_CERT", _TEXT, _MEMCACHE_TLS),
    IGNORED.accepted("MEMCACHE_TLS_CLIENT_KEY", _TEXT, _MEMCACHE_TLS),
    IGNORED.accepted("MEMCACHE_TLS_CACERT", _TEXT, _MEMCACHE_TLS),
    IGNORED.accepted("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", _BOOL, _MEMCACHE_TLS),
)
ACCEPTED_IGNORED = tuple(setting.env for setting in ACCEPTED)


@dataclass(frozen=True)
class Settings:
    """Everything the service reads from its environment, validated once at startup.

    A field declared with a Topic is read from its variable; the few others (``runtime_root``,
    ``redis_startup_wait``, ``statsd_explicit``, ``dog_statsd_mogrifier_env``, ``ignored``)
    are derived from several variables by ``from_env``."""

    # A dataclasses.field with a default_factory, as every declaration here is a field.
    config_dir: Path = CONFIG.factory(  # noqa: RUF009
        default_config_dir,
        PathText(),
        "descriptor directory",
        flag=Flag("--config"),
        shown="`descriptors/` in the current directory",
    )
    runtime_root: Path | None = None

    host: str = LISTEN.setting("HOST", "0.0.0.0", _TEXT, "HTTP port's " + _HOST)
    port: int = LISTEN.setting(
        "PORT", 8080, Port(), "HTTP port (`/json`, `/healthcheck`)", flag=Flag("--http-port")
    )
    grpc_host: str = LISTEN.setting("GRPC_HOST", "0.0.0.0", _TEXT, "gRPC port's " + _HOST)
    grpc_port: int = LISTEN.setting(
        "GRPC_PORT", 8081, Port(), "gRPC port", flag=Flag("--grpc-port")
    )
    # Loopback by default (the reference binds every interface): the debug pages describe
    # the configuration and counters, which are nobody else's business.
    debug_host: str = LISTEN.setting(
        "DEBUG_HOST",
        "127.0.0.1",
        _TEXT,
        "debug port's " + _HOST + "; loopback by default, where the reference's is every one",
    )
    debug_allowed_hosts: tuple[str, ...] = LISTEN.setting(
        "DEBUG_ALLOWED_HOSTS",
        (),
        Items(),
        "names (globs) the debug port answers to in Host, besides IP addresses and localhost",
    )
    debug_port: int = LISTEN.setting(
        "DEBUG_PORT", 6070, Port(), "debug HTTP port", flag=Flag("--debug-port")
    )
    grpc_uds: str = LISTEN.setting(
        "GRPC_UDS", "", _TEXT, "a Unix socket path to serve gRPC on instead of the gRPC port"
    )
    grpc_max_connection_age: float = LISTEN.setting(
        "GRPC_MAX_CONNECTION_AGE",
        24 * 3600.0,
        _DURATION,
        "connections older get a GOAWAY (gRPC adds ±10% jitter), so clients spread over new "
        "replicas",
    )
    grpc_max_connection_age_grace: float = LISTEN.setting(
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        3600.0,
        _DURATION,
        "time left to calls in flight on a connection past its age",
    )
    # gRPC keepalive: a connection that does not answer a ping within the timeout is closed,
    # which ends its sessions (and frees their holds) when a client host dies silently.
    grpc_keepalive_time: float = LISTEN.setting(
        "GRPC_KEEPALIVE_TIME",
        10.0,
        _DURATION,
        "how often the server pings an idle gRPC connection (0: never)",
    )
    grpc_keepalive_timeout: float = LISTEN.setting(
        "GRPC_KEEPALIVE_TIMEOUT",
        5.0,
        _DURATION,
        "a connection that does not answer a ping within this is closed (its holds freed)",
    )
    # Each HTTP port (PORT, DEBUG_PORT, the Prometheus scrape) is bounded on its own, so
    # that clients that open connections and send nothing hold little, and not for long.
    http_max_connections: int = LISTEN.setting(
        "HTTP_MAX_CONNECTIONS",
        256,
        Integer(1),
        "open connections each HTTP port serves; one more is answered 503 and closed",
    )
    http_max_buffered_bytes: int = LISTEN.setting(
        "HTTP_MAX_BUFFERED_BYTES",
        16 << 20,
        Integer(1 << 20),
        "request body bytes each HTTP port reads at once over all its connections; a body "
        "past it is answered 503 (a body is at most 1 MiB)",
    )
    http_read_timeout: float = LISTEN.setting(
        "HTTP_READ_TIMEOUT",
        5.0,
        Duration(above=True),
        "time an HTTP client has to send a request's headers and body, and to start its "
        "next request on a kept-alive connection; a request not sent in time is answered "
        "408 and its connection closed",
    )
    http_max_json_depth: int = LISTEN.setting(
        "HTTP_MAX_JSON_DEPTH",
        32,
        Integer(1),
        "arrays and objects a JSON request body may nest; deeper is answered 400",
    )

    log_level: str = LOGS.setting(
        "LOG_LEVEL", "info", LogLevel(), "log level", flag=Flag("--log-level")
    )
    log_format: str = LOGS.setting(
        "LOG_FORMAT",
        "text",
        Choice((("text", ""), ("json", "")), blank_is_default=False),
        "log format",
        flag=Flag("--log-format"),
    )
    decision_log: str = LOGS.setting(
        "DECISION_LOG",
        "",
        _TEXT,
        "a file that receives one JSON line per decision (ShouldRateLimit and ferryman.v1 "
        "Request), written off the request path, for `ferryman replay` (empty: off)",
    )
    decision_log_sample: float = LOGS.setting(
        "DECISION_LOG_SAMPLE",
        1.0,
        Number(0.0, 1.0),
        "the share of decisions written to `DECISION_LOG` (1: every one)",
    )
    decision_log_max_bytes: int = LOGS.setting(
        "DECISION_LOG_MAX_BYTES",
        100 * 1024 * 1024,
        _COUNT,
        "past this size `DECISION_LOG` is renamed to `<file>.1` (replacing it) and a new file "
        "is started (0: no cap)",
    )

    watch_root: bool = CONFIG.setting(
        "RUNTIME_WATCH_ROOT",
        True,
        _BOOL,
        "watch the whole runtime root (a symlink swap reloads); any file change reloads",
    )
    ignore_dotfiles: bool = CONFIG.setting(
        "RUNTIME_IGNOREDOTFILES",
        True,
        _BOOL,
        "skip files and directories whose name starts with `.` (ConfigMap mounts load once)",
    )
    merge_domain_config: bool = CONFIG.setting(
        "MERGE_DOMAIN_CONFIG",
        False,
        _BOOL,
        "files naming the same domain are merged instead of refused",
    )
    strict_config: bool = CONFIG.setting(
        "STRICT_CONFIG",
        False,
        _BOOL,
        "refuse a descriptor file for what is otherwise a warning: a key of the reference "
        "where it is not read, a repeated key, a second YAML document (the reference loads "
        "such files; see the migration page)",
    )
    config_type: str = CONFIG.setting(
        "CONFIG_TYPE",
        "FILE",
        Choice(
            (
                ("FILE", "descriptor files"),
                ("GRPC_XDS_SOTW", "RateLimitConfig resources from an xDS management server"),
            ),
            fold="upper",
        ),
        "where the descriptors come from",
    )
    force_start_without_initial_config: bool = CONFIG.setting(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        False,
        _BOOL,
        "start even without a configuration (a missing directory is watched until it appears)",
    )
    healthy_with_at_least_one_config_loaded: bool = CONFIG.setting(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        False,
        _BOOL,
        "unhealthy until a configuration with at least one domain is loaded",
    )

    xds_server_url: str = XDS.setting(
        "CONFIG_GRPC_XDS_SERVER_URL",
        "localhost:18000",
        Text(blank_is_default=True),
        "the management server, `host:port`",
    )
    xds_node_id: str = XDS.setting(
        "CONFIG_GRPC_XDS_NODE_ID", "default", Text(blank_is_default=True), "this node's id"
    )
    xds_node_metadata: tuple[tuple[str, str], ...] = XDS.setting(
        "CONFIG_GRPC_XDS_NODE_METADATA", (), Pairs("="), "this node's metadata"
    )
    xds_additional_headers: tuple[tuple[str, str], ...] = XDS.setting(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        (),
        Pairs(":"),
        "headers sent with the ADS stream",
    )
    xds_connect_retry_interval: float = XDS.setting(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        3.0,
        _DURATION,
        "wait before reopening a stream that ended (then the backoff below)",
    )
    xds_server_use_tls: bool = XDS.setting(
        "CONFIG_GRPC_XDS_SERVER_USE_TLS", False, _BOOL, "reach the server over TLS"
    )
    xds_client_tls_cert: str = XDS.setting(
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "",
        _TEXT,
        "client certificate (PEM file), with its key",
    )
    xds_client_tls_key: str = XDS.setting(
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", _TEXT, "client key (PEM file), with its certificate"
    )
    xds_server_tls_cacert: str = XDS.setting(
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", _TEXT, "CA that signed the server's certificate"
    )
    xds_server_tls_san: str = XDS.setting(
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", _TEXT, "name the server's certificate must carry"
    )
    xds_backoff_initial_interval: float = XDS.setting(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10.0, _DURATION, "first wait of the backoff"
    )
    xds_backoff_max_interval: float = XDS.setting(
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        60.0,
        _DURATION,
        "longest wait of the backoff (not under the initial one)",
    )
    xds_backoff_random_factor: float = XDS.setting(
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", 0.5, Number(0.0, 1.0), "randomness of each wait"
    )
    xds_backoff_jitter: bool = XDS.setting(
        "XDS_CLIENT_BACKOFF_JITTER", True, _BOOL, "randomize the backoff's waits"
    )
    xds_max_msg_size: int = XDS.setting(
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        0,
        _COUNT,
        "largest message accepted from the server (0: gRPC's default, 4 MiB)",
    )

    # The config API: where versions live (files: the config directory, redis: the
    # backend's Redis), the bearer token file that turns it on, and how many versions stay.
    config_store: str = CONFIG_API.setting(
        "CONFIG_STORE",
        "files",
        Choice((("files", "the config directory"), ("redis", "the backend's Redis"))),
        "where the config API keeps its versions",
    )
    admin_tokens_file: str = CONFIG_API.setting(
        "ADMIN_TOKENS_FILE",
        "",
        _TEXT,
        "bearer tokens file (`token user role` lines); set, it turns the config API on",
    )
    config_history: int = CONFIG_API.setting(
        "CONFIG_HISTORY", 100, Integer(1), "versions kept by the config API"
    )

    near_limit_ratio: float = LIMITS.setting(
        "NEAR_LIMIT_RATIO",
        0.8,
        Number(0.0, 1.0),
        "share of a limit past which hits count as near the limit",
    )
    shadow_mode: bool = LIMITS.setting(
        "SHADOW_MODE", False, _BOOL, "count and report, but answer OK to every request"
    )
    quota_mode: bool = LIMITS.setting(
        "QUOTA_MODE",
        False,
        _BOOL,
        "the reference's quota mode: rules marked quota report without refusing",
    )
    stop_cache_key_increment_when_overlimit: bool = LIMITS.setting(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        False,
        _BOOL,
        "a request refused by one limit does not count against its other limits",
    )
    limit_response_headers_enabled: bool = LIMITS.setting(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        False,
        _BOOL,
        "send the rate limit headers below with each answer",
    )
    limit_response_headers_format: str = LIMITS.setting(
        "LIMIT_RESPONSE_HEADERS_FORMAT",
        "draft",
        _HEADER_FORMAT,
        "which rate limit headers are sent: one policy per limit of the request with `ietf`",
    )
    limit_limit_header: str = LIMITS.setting(
        "LIMIT_LIMIT_HEADER", "RateLimit-Limit", _TEXT, "header naming the limit"
    )
    limit_remaining_header: str = LIMITS.setting(
        "LIMIT_REMAINING_HEADER", "RateLimit-Remaining", _TEXT, "header with the hits left"
    )
    limit_reset_header: str = LIMITS.setting(
        "LIMIT_RESET_HEADER", "RateLimit-Reset", _TEXT, "header with the seconds to the reset"
    )
    response_dynamic_metadata: bool = LIMITS.setting(
        "RESPONSE_DYNAMIC_METADATA",
        False,
        _BOOL,
        "return the request's descriptors as dynamic metadata to Envoy",
    )
    local_cache_size_in_bytes: int = LIMITS.setting(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        0,
        _COUNT,
        "memory for remembering keys over their limit until their window ends, so that "
        "refusing them costs no backend call (0: off)",
    )
    hold_lease_seconds: float = LIMITS.setting(
        "HOLD_LEASE_SECONDS",
        10.0,
        _DURATION,
        "lease of a held resource whose client stops renewing it",
    )
    # Reservations waiting (max_wait) in held copies' queues, counted per server: past
    # either cap a waiter is refused at once (RESOURCE_EXHAUSTED, counted).
    hold_queue_max_per_node: int = LIMITS.setting(
        "HOLD_QUEUE_MAX_PER_NODE",
        1000,
        Integer(1),
        "reservations one server lets wait for copies of one copy-limited node",
    )
    hold_queue_max: int = LIMITS.setting(
        "HOLD_QUEUE_MAX",
        10000,
        Integer(1),
        "reservations one server lets wait for held copies, all nodes together",
    )

    backend: str = BACKEND.setting(
        "BACKEND_TYPE",
        "memory",
        Choice((("memory", ""), ("redis", ""), ("memcache", ""))),
        "where counters live",
        flag=Flag(
            "--backend",
            "memory, redis://host:port, rediss://..., redis+cluster://h:p,h:p, "
            "redis+sentinel://h:p,h:p/master or unix:///path",
            kind=_TEXT,
        ),
        shown_default="`memory`; `redis` when `REDIS_URL` is set",
    )
    # BACKEND_TYPE=memcache: MEMCACHE_HOST_PORT's servers.
    memcache_servers: tuple[tuple[str, int], ...] = BACKEND.setting(
        "MEMCACHE_HOST_PORT",
        (),
        Servers(),
        "memcached servers (needed with `BACKEND_TYPE=memcache`)",
    )
    cache_key_prefix: str = BACKEND.setting(
        "CACHE_KEY_PREFIX", "", _TEXT, "prefix of every counter's key"
    )
    expiration_jitter_max_seconds: int = BACKEND.setting(
        "EXPIRATION_JITTER_MAX_SECONDS",
        300,
        _COUNT,
        "most seconds of random delay added to a key's expiry, so keys do not all expire at once",
    )
    fail_open: bool = BACKEND.setting(
        "FAIL_OPEN",
        False,
        _BOOL,
        "answer OK (counted as degraded) when the backend fails",
        flag=Flag("--fail-open"),
    )
    # Entries of every kind's state the memory backend keeps at most (0: no cap); see
    # core/memory_cap.py.
    memory_max_keys: int = BACKEND.setting(
        "MEMORY_MAX_KEYS",
        100_000,
        _COUNT,
        "entries the memory backend keeps at most, every rule kind's state together "
        "(counters, tenants, reservations; 0: no cap)",
    )
    # Health fails while the backend is down (by default it stays SERVING: the service
    # still answers, with its failure policy).
    health_requires_backend: bool = BACKEND.setting(
        "FERRYMAN_HEALTH_REQUIRES_BACKEND",
        False,
        _BOOL,
        "report unhealthy while the backend is down (else the service stays SERVING and "
        "answers with its failure policy)",
        flag=Flag("--health-requires-backend"),
    )

    redis_socket_type: str = REDIS.setting(
        "REDIS_SOCKET_TYPE", "unix", Text(fold="lower"), "`unix` or `tcp`"
    )
    redis_type: str = REDIS.setting(
        "REDIS_TYPE", "single", Text(fold="lower"), "`single`, `sentinel` or `cluster`"
    )
    redis_url: str = REDIS.setting(
        "REDIS_URL",
        "/var/run/nutcracker/ratelimit.sock",
        _TEXT,
        "where Redis is; set with `BACKEND_TYPE` unset, it picks the Redis backend",
    )
    redis_auth: str = REDIS.setting("REDIS_AUTH", "", _TEXT, "password, or `user:password`")
    redis_username: str = REDIS.setting(
        "REDIS_USERNAME", "", _TEXT, "Redis ACL user (with REDIS_AUTH its password)"
    )
    redis_tls: bool = REDIS.setting("REDIS_TLS", False, _BOOL, "reach Redis over TLS")
    redis_tls_cacert: str = REDIS.setting(
        "REDIS_TLS_CACERT", "", _TEXT, "CA that signed Redis's certificate (PEM file)"
    )
    redis_tls_client_cert: str = REDIS.setting(
        "REDIS_TLS_CLIENT_CERT", "", _TEXT, "client certificate for Redis (PEM file)"
    )
    redis_tls_client_key: str = REDIS.setting(
        "REDIS_TLS_CLIENT_KEY", "", _TEXT, "its key (PEM file)"
    )
    redis_tls_skip_hostname_verification: bool = REDIS.setting(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        False,
        _BOOL,
        "accept a certificate that does not name the host",
    )
    redis_sentinel_auth: str = REDIS.setting(
        "REDIS_SENTINEL_AUTH", "", _TEXT, "password of the Sentinels themselves"
    )
    redis_pool_size: int = REDIS.setting(
        "REDIS_POOL_SIZE", 10, Integer(1), "connections to each Redis node"
    )
    redis_timeout: float = REDIS.setting(
        "REDIS_TIMEOUT", 10.0, _DURATION, "longest wait for a Redis answer"
    )
    redis_pipeline_window: float = REDIS.setting(
        "REDIS_PIPELINE_WINDOW",
        0.0,
        _DURATION,
        "how long calls gather before they are written together (0: no wait)",
    )
    redis_pipeline_limit: int = REDIS.setting(
        "REDIS_PIPELINE_LIMIT", 0, _COUNT, "calls written together at most (0: no limit)"
    )
    redis_sync_interval: float = REDIS.setting(
        "REDIS_SYNC_INTERVAL",
        0.0,
        _DURATION,
        "synced counting for every fixed window without its own `sync`: each replica decides "
        "from its own view and flushes its hits this often (0: exact, a round trip per "
        "request; see the performance page for the error bound)",
    )
    # Wait for Redis at start (any REDIS_STARTUP_* set), retrying with exponential backoff
    # from the initial interval up to the maximum; give up after max elapsed (0: never).
    redis_startup_wait: bool = False
    redis_startup_initial_interval: float = REDIS.setting(
        "REDIS_STARTUP_INITIAL_INTERVAL",
        1.0,
        Duration(above=True),
        "any `REDIS_STARTUP_*` set makes the start wait for Redis: first wait between tries",
    )
    redis_startup_max_interval: float = REDIS.setting(
        "REDIS_STARTUP_MAX_INTERVAL",
        30.0,
        _DURATION,
        "longest wait between tries (not under the initial one)",
    )
    redis_startup_max_elapsed_time: float = REDIS.setting(
        "REDIS_STARTUP_MAX_ELAPSED_TIME", 0.0, _DURATION, "give up after this (0: never)"
    )

    redis_persecond: bool = PERSECOND.setting(
        "REDIS_PERSECOND", False, _BOOL, "a second Redis for per-second limits"
    )
    redis_persecond_url: str = PERSECOND.setting(
        "REDIS_PERSECOND_URL",
        "/var/run/nutcracker/ratelimitpersecond.sock",
        _TEXT,
        "as `REDIS_URL`",
    )
    redis_persecond_socket_type: str = PERSECOND.setting(
        "REDIS_PERSECOND_SOCKET_TYPE", "unix", Text(fold="lower"), "as `REDIS_SOCKET_TYPE`"
    )
    redis_persecond_tls: bool = PERSECOND.setting(
        "REDIS_PERSECOND_TLS", False, _BOOL, "as `REDIS_TLS`"
    )
    redis_persecond_type: str = PERSECOND.setting(
        "REDIS_PERSECOND_TYPE", "single", Text(fold="lower"), "as `REDIS_TYPE`"
    )
    redis_persecond_auth: str = PERSECOND.setting(
        "REDIS_PERSECOND_AUTH", "", _TEXT, "as `REDIS_AUTH`"
    )
    redis_persecond_sentinel_auth: str = PERSECOND.setting(
        "REDIS_PERSECOND_SENTINEL_AUTH", "", _TEXT, "as `REDIS_SENTINEL_AUTH`"
    )
    redis_persecond_pool_size: int = PERSECOND.setting(
        "REDIS_PERSECOND_POOL_SIZE", 10, Integer(1), "as `REDIS_POOL_SIZE`"
    )
    # None: as REDIS_TIMEOUT (what ferryman did before the reference split them).
    redis_persecond_timeout: float | None = PERSECOND.setting(
        "REDIS_PERSECOND_TIMEOUT",
        None,
        _DURATION,
        "as `REDIS_TIMEOUT`",
        shown_default="`REDIS_TIMEOUT`'s",
    )
    redis_persecond_pipeline_window: float = PERSECOND.setting(
        "REDIS_PERSECOND_PIPELINE_WINDOW", 0.0, _DURATION, "as `REDIS_PIPELINE_WINDOW`"
    )
    redis_persecond_pipeline_limit: int = PERSECOND.setting(
        "REDIS_PERSECOND_PIPELINE_LIMIT", 0, _COUNT, "as `REDIS_PIPELINE_LIMIT`"
    )

    # Credentials that rotate without a restart: files read at each connect when they
    # changed, and after Redis refuses them (connections/redis_auth.py). Each takes the
    # place of its variable without _FILE; both set is refused.
    redis_auth_file: str = REDIS.setting(
        "REDIS_AUTH_FILE",
        "",
        _TEXT,
        "file holding what `REDIS_AUTH` holds (password, or `user:password`), read again "
        "when it changes: new connections use it, open ones go on (see Rotating credentials)",
    )
    redis_sentinel_auth_file: str = REDIS.setting(
        "REDIS_SENTINEL_AUTH_FILE",
        "",
        _TEXT,
        "file holding the Sentinels' password, read again when it changes",
    )
    redis_persecond_auth_file: str = PERSECOND.setting(
        "REDIS_PERSECOND_AUTH_FILE", "", _TEXT, "as `REDIS_AUTH_FILE`"
    )
    redis_persecond_sentinel_auth_file: str = PERSECOND.setting(
        "REDIS_PERSECOND_SENTINEL_AUTH_FILE", "", _TEXT, "as `REDIS_SENTINEL_AUTH_FILE`"
    )

    # TLS on every port (the reference's names); mutual TLS when a client CA is given.
    grpc_server_use_tls: bool = TLS.setting(
        "GRPC_SERVER_USE_TLS",
        False,
        _BOOL,
        "the gRPC port speaks TLS only, and the HTTP, debug and Prometheus ports HTTPS only",
    )
    grpc_server_tls_cert: str = TLS.setting(
        "GRPC_SERVER_TLS_CERT",
        "",
        _TEXT,
        "the server's certificate chain (PEM file; needed with TLS, re-read on change)",
    )
    grpc_server_tls_key: str = TLS.setting(
        "GRPC_SERVER_TLS_KEY", "", _TEXT, "its private key (PEM file; needed with TLS)"
    )
    grpc_client_tls_cacert: str = TLS.setting(
        "GRPC_CLIENT_TLS_CACERT",
        "",
        _TEXT,
        "mutual TLS: gRPC clients need a certificate from this CA (PEM file)",
    )
    grpc_client_tls_san: str = TLS.setting(
        "GRPC_CLIENT_TLS_SAN",
        "",
        _TEXT,
        "with a client CA: the name a client certificate must also carry",
    )

    use_statsd: bool = STATSD.setting("USE_STATSD", True, _BOOL, "send stats to StatsD")
    statsd_host: str = STATSD.setting("STATSD_HOST", "localhost", _TEXT, "StatsD agent's host")
    statsd_port: int = STATSD.setting("STATSD_PORT", 8125, Port(), "StatsD agent's port")
    # The reference's statsd library reads STATSD_PROTOCOL too: tcp (its default) or udp.
    statsd_protocol: str = STATSD.setting(
        "STATSD_PROTOCOL", "tcp", Choice((("tcp", ""), ("udp", ""))), "transport to the agent"
    )
    # Whether the StatsD sink was asked for (any of its variables set), or is only on by
    # default: an agent missing by default is not worth a WARNING.
    statsd_explicit: bool = False
    stats_flush_interval: float = STATSD.setting(
        "STATS_FLUSH_INTERVAL", 10.0, _DURATION, "how often stats are sent"
    )
    extra_tags: tuple[tuple[str, str], ...] = STATSD.setting(
        "EXTRA_TAGS", (), Pairs(":"), "tags added to every stat"
    )
    disable_stats: bool = STATSD.setting(
        "DISABLE_STATS", False, _BOOL, "no stats sink of any kind (StatsD, Prometheus, OTLP)"
    )
    use_dog_statsd: bool = STATSD.setting(
        "USE_DOG_STATSD", False, _BOOL, "DogStatsD: tags on stats, and the mogrifiers below"
    )
    use_dog_statsd_mogrifiers: tuple[str, ...] = STATSD.setting(
        "USE_DOG_STATSD_MOGRIFIERS",
        (),
        Items(),
        "mogrifiers (each defined by `DOG_STATSD_MOGRIFIER_<NAME>_*`) that rename stats",
    )
    # The DOG_STATSD_MOGRIFIER_<NAME>_{PATTERN,NAME,TAGS} variables of those mogrifiers.
    dog_statsd_mogrifier_env: tuple[tuple[str, str], ...] = ()

    use_prometheus: bool = METRICS.setting(
        "USE_PROMETHEUS", False, _BOOL, "serve Prometheus metrics (not with `DISABLE_STATS`)"
    )
    prometheus_addr: str = METRICS.setting(
        "PROMETHEUS_ADDR", ":9090", Address(), "Prometheus port's address"
    )
    prometheus_path: str = METRICS.setting(
        "PROMETHEUS_PATH", "/metrics", HttpPath(), "Prometheus metrics' path"
    )
    prometheus_mapper_yaml: str = METRICS.setting(
        "PROMETHEUS_MAPPER_YAML",
        "",
        _TEXT,
        "a statsd_exporter mapping file that replaces the built-in names",
    )
    prometheus_response_time_as_milliseconds: bool = METRICS.setting(
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        False,
        _BOOL,
        "response times in milliseconds instead of seconds",
    )
    metrics_max_series: int = METRICS.setting(
        "METRICS_MAX_SERIES", 10_000, Integer(1), "series kept per metric at most"
    )
    max_metric_series: int = METRICS.setting(
        "MAX_METRIC_SERIES",
        10_000,
        Integer(1),
        "request values one rule keeps series of their own for (detailed_metric, "
        "value_to_metric, tenants of burst and bucket nodes, unknown domains); past it they "
        "fold into the rule's `_other_` series",
    )
    # OpenTelemetry's standard OTEL_EXPORTER_OTLP_[METRICS_|TRACES_]ENDPOINT: push over OTLP/gRPC.
    otlp_metrics_endpoint: str = METRICS.setting(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "",
        Text(blank_is_default=True),
        "push metrics over OTLP/gRPC to this collector (not with `DISABLE_STATS`)",
        shown_default="`OTEL_EXPORTER_OTLP_ENDPOINT`'s",
    )

    tracing_enabled: bool = TRACING.setting(
        "TRACING_ENABLED", False, _BOOL, "record spans for each request"
    )
    tracing_sampling_rate: float = TRACING.setting(
        "TRACING_SAMPLING_RATE", 1.0, Number(0.0, 1.0), "share of requests traced"
    )
    otlp_traces_endpoint: str = TRACING.setting(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "",
        Text(blank_is_default=True),
        "where spans are pushed",
        shown_default="`OTEL_EXPORTER_OTLP_ENDPOINT`'s",
    )
    # How spans are pushed (OTLP over http or grpc). The reference's default, http, is what
    # from_env gives; a Settings built in code keeps gRPC, the transport of OTLP metrics.
    tracing_exporter_protocol: str = TRACING.setting(
        "TRACING_EXPORTER_PROTOCOL",
        "grpc",
        Choice((("http", ""), ("grpc", ""))),
        "OTLP transport of spans",
        env_default="http",
    )
    # Empty: OTEL_SERVICE_NAME when set, else the reference's default, "RateLimit".
    tracing_service_name: str = TRACING.setting(
        "TRACING_SERVICE_NAME",
        "",
        _TEXT,
        "the service's name in spans and metrics",
        shown_default="`OTEL_SERVICE_NAME`, else `RateLimit`",
    )
    tracing_service_namespace: str = TRACING.setting(
        "TRACING_SERVICE_NAMESPACE", "", _TEXT, "the service's namespace"
    )
    tracing_service_instance_id: str = TRACING.setting(
        "TRACING_SERVICE_INSTANCE_ID", "", _TEXT, "this instance's id"
    )

    # Capacity leases (doorman.Capacity): a client is recomputed at most this often per
    # resource (0: always); the address replicas advertise as master (empty: the gRPC
    # listen address); the parent server (host:port; empty: this server is a root); the
    # term a master holds through Redis before it must renew.
    doorman_minimum_refresh_interval: float = CAPACITY.setting(
        "DOORMAN_MINIMUM_REFRESH_INTERVAL",
        5.0,
        _DURATION,
        "a client's lease is recomputed at most this often per resource (0: always)",
    )
    doorman_advertise_address: str = CAPACITY.setting(
        "DOORMAN_ADVERTISE_ADDRESS",
        "",
        _TEXT,
        "the address replicas give clients for the master (empty: the gRPC listen address)",
    )
    doorman_parent: str = CAPACITY.setting(
        "DOORMAN_PARENT",
        "",
        Address(optional=True),
        "lease capacity from this doorman.Capacity server (empty: this server is a root)",
        flag=Flag("--parent", metavar="HOST:PORT"),
    )
    # The link to the parent speaks TLS as ferryman.Client does (a CA or a certificate
    # implies it); mutual TLS with a client certificate.
    doorman_parent_tls: bool = CAPACITY.setting(
        "DOORMAN_PARENT_TLS", False, _BOOL, "reach the parent server over TLS"
    )
    doorman_parent_tls_cacert: str = CAPACITY.setting(
        "DOORMAN_PARENT_TLS_CACERT",
        "",
        _TEXT,
        "CA that signed the parent's certificate (PEM file; empty: the system's roots)",
    )
    doorman_parent_tls_cert: str = CAPACITY.setting(
        "DOORMAN_PARENT_TLS_CERT", "", _TEXT, "mutual TLS: this server's certificate (PEM file)"
    )
    doorman_parent_tls_key: str = CAPACITY.setting(
        "DOORMAN_PARENT_TLS_KEY", "", _TEXT, "its private key (PEM file)"
    )
    doorman_election_term: float = CAPACITY.setting(
        "DOORMAN_ELECTION_TERM",
        10.0,
        Duration(minimum=0.1),
        "term a master holds through Redis before it must renew",
    )
    doorman_grant_unconfigured: bool = CAPACITY.setting(
        "DOORMAN_GRANT_UNCONFIGURED",
        True,
        _BOOL,
        "grant what clients ask for resources no rule names",
    )

    # Caps per caller (an identity, or the address of a caller without one), and the key
    # transfer ids and config store entries are signed with: every replica sharing a
    # backend needs the same one.
    signing_key: str = ACCESS.setting(
        "SIGNING_KEY",
        "",
        _TEXT,
        "secret that signs transfer ids and config store entries (else SIGNING_KEY_FILE)",
    )
    signing_key_file: str = ACCESS.setting(
        "SIGNING_KEY_FILE",
        "",
        _TEXT,
        "file holding the secret that signs transfer ids and config store entries",
    )
    max_sessions_per_caller: int = ACCESS.setting(
        "MAX_SESSIONS_PER_CALLER", 100, _COUNT, "open Session streams per caller (0: no cap)"
    )
    max_streams_per_caller: int = ACCESS.setting(
        "MAX_STREAMS_PER_CALLER",
        8,
        _COUNT,
        "open QuotaEvents and Health Watch streams per caller (0: no cap)",
    )
    max_dynamic_buckets_per_caller: int = ACCESS.setting(
        "MAX_DYNAMIC_BUCKETS_PER_CALLER",
        0,
        _COUNT,
        "dynamic token buckets one caller may make per namespace (0: no cap)",
    )
    rlqs_max_streams: int = RLQS.setting(
        "RLQS_MAX_STREAMS",
        10_000,
        Integer(1),
        "quota streams open at once (one per Envoy); one more is refused RESOURCE_EXHAUSTED",
    )
    rlqs_max_pairs: int = RLQS.setting(
        "RLQS_MAX_PAIRS",
        1_000_000,
        Integer(1),
        "(Envoy, bucket) pairs held at once; a bucket past it gets no assignment",
    )
    rlqs_max_buckets: int = RLQS.setting(
        "RLQS_MAX_BUCKETS",
        100_000,
        Integer(1),
        "distinct buckets held at once",
    )
    rlqs_max_streams_per_caller: int = RLQS.setting(
        "RLQS_MAX_STREAMS_PER_CALLER",
        0,
        _COUNT,
        "quota streams one caller (an identity, or an address without one) may hold "
        "(0: only `RLQS_MAX_STREAMS`)",
    )
    rlqs_max_pairs_per_caller: int = RLQS.setting(
        "RLQS_MAX_PAIRS_PER_CALLER",
        0,
        _COUNT,
        "(Envoy, bucket) pairs one caller's streams may hold (0: only `RLQS_MAX_PAIRS`)",
    )
    rlqs_learning: float = RLQS.setting(
        "RLQS_LEARNING",
        10.0,
        _DURATION,
        "after the start, how long demand is learnt before anything is assigned (Envoys "
        "still enforce what they held before a restart, until its TTL; 0: off)",
    )
    rlqs_tick: float = RLQS.setting(
        "RLQS_TICK",
        1.0,
        Duration(minimum=0.05),
        "how often a bucket whose demand, Envoys, config or lease changed is divided again",
    )

    doorman_max_clients_per_server: int = ACCESS.setting(
        "DOORMAN_MAX_CLIENTS_PER_SERVER",
        10,
        Integer(1),
        "clients one GetServerCapacity band counts at most",
    )

    # Processes serving the same ports (SO_REUSEPORT); more than one needs a shared backend.
    workers: int = PROCESS.setting(
        "WORKERS",
        1,
        Integer(1),
        "processes serving the same ports (more than one needs Redis)",
        flag=Flag("--workers"),
    )
    # The event loop: uvloop when importable (auto), or insisted on, or asyncio's own.
    event_loop: str = PROCESS.setting(
        "EVENT_LOOP",
        "auto",
        EVENT_LOOP_KIND,
        "the event loop; `uvloop` refuses to start without it",
        flag=Flag("--event-loop"),
    )
    shutdown_grace_seconds: float = PROCESS.setting(
        "FERRYMAN_SHUTDOWN_GRACE",
        10.0,
        _DURATION,
        "time calls in flight get to finish after SIGTERM",
    )
    # Before the grace: health says not serving while every API still answers, so that
    # Kubernetes endpoints and Envoy's health checks move traffic away first.
    shutdown_drain_seconds: float = PROCESS.setting(
        "FERRYMAN_SHUTDOWN_DRAIN",
        5.0,
        _DURATION,
        "time after SIGTERM during which health reports not serving while every API still "
        "answers, before new calls are refused (a second signal ends it); 0: none",
    )
    # Envoy or Istio files whose routes the debug port explains (/explain/envoy): read at
    # start; they need the ferryman[envoy] extra.
    envoy_config_files: tuple[str, ...] = PROCESS.setting(
        "ENVOY_CONFIG_FILES",
        (),
        Items(),
        "Envoy or Istio files whose routes the debug page explains (needs ferryman[envoy])",
        flag=Flag("--envoy", metavar="FILE", kind=_TEXT, repeat=True),
    )

    # Set variables of the reference that ferryman accepts but cannot honour (logged once).
    ignored: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default: ``os.environ``); raises SettingsError."""
        from ferryman.settings.read import read

        return read(cls, env)

    def with_overrides(self, **changes: object) -> Settings:
        """A copy with the given fields replaced (used for command-line flags)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def declared() -> Iterator[tuple[str, Setting]]:
    """Each declared field of Settings (its name) with its Setting, in field order."""
    for item in dataclasses.fields(Settings):
        setting = item.metadata.get(METADATA)
        if isinstance(setting, Setting):
            yield item.name, setting


def every_setting() -> Iterator[Setting]:
    """Every declared variable: Settings' fields, then the others."""
    yield from (setting for _, setting in declared())
    yield from FEEDING
    yield from ACCEPTED


#: Every variable by its name (a field only a flag sets has none).
VARIABLES: Mapping[str, Setting] = {s.env: s for s in every_setting() if s.env}
