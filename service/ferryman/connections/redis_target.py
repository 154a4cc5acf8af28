"""Where a Redis deployment is and how to reach it: URLs and the reference's variables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ferryman.errors import SettingsError

__all__ = ["RedisTarget", "address", "parse_backend_url", "split_auth", "target_from_env_style"]


@dataclass(frozen=True)
class RedisTarget:
    """Where a Redis deployment is and how to reach it."""

    kind: str = "single"  # single | sentinel | cluster
    addresses: tuple[tuple[str, int], ...] = (("localhost", 6379),)
    unix_path: str = ""
    master_name: str = ""
    username: str | None = None
    password: str | None = None
    tls: bool = False
    db: int = 0
    pool_size: int = 10
    timeout: float = 10.0
    # Batching on a single Redis (see redis_pipe): seconds between writes on a busy
    # connection, and commands that fill a batch; 0 means off.
    pipeline_window: float = 0.0
    pipeline_limit: int = 0
    # TLS files (PEM) and checks, as REDIS_TLS_CACERT / _CLIENT_CERT / _CLIENT_KEY /
    # _SKIP_HOSTNAME_VERIFICATION: the server's certificate is always verified (against
    # the system's roots unless a CA file is given); skipping keeps the chain check.
    tls_ca_cert: str = ""
    tls_client_cert: str = ""
    tls_client_key: str = ""
    tls_check_hostname: bool = True
    # REDIS_SENTINEL_AUTH: the sentinels' own password (None: the servers' password).
    sentinel_password: str | None = None
    # REDIS_AUTH_FILE and REDIS_SENTINEL_AUTH_FILE: credentials read from files and kept
    # current (see redis_auth), in place of the password and sentinel_password; their
    # variables start with ``variables`` (REDIS or REDIS_PERSECOND).
    auth_file: str = ""
    sentinel_auth_file: str = ""
    variables: str = "REDIS"

    def __post_init__(self) -> None:
        v = self.variables
        if self.auth_file and self.password is not None:
            raise SettingsError(
                f"{v}_AUTH_FILE is set and so is a password ({v}_AUTH or the --backend "
                "URL's): give one of them"
            )
        if self.sentinel_auth_file and self.sentinel_password is not None:
            raise SettingsError(
                f"{v}_SENTINEL_AUTH_FILE and {v}_SENTINEL_AUTH are both set: give one of them"
            )
        if self.sentinel_auth_file and self.kind != "sentinel":
            raise SettingsError(f"{v}_SENTINEL_AUTH_FILE is set but {v}_TYPE is not sentinel")

    def ssl_options(self) -> dict[str, Any]:
        """redis-py's keyword arguments for this target's TLS (empty without TLS)."""
        if not self.tls:
            return {}
        options: dict[str, Any] = {
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": self.tls_check_hostname,
        }
        if self.tls_ca_cert:
            options["ssl_ca_certs"] = self.tls_ca_cert
        if self.tls_client_cert:
            options["ssl_certfile"] = self.tls_client_cert
        if self.tls_client_key:
            options["ssl_keyfile"] = self.tls_client_key
        return options

    def describe(self) -> str:
        if self.unix_path:
            return f"unix:{self.unix_path}"
        where = ",".join(f"{h}:{p}" for h, p in self.addresses)
        if self.kind == "sentinel":
            return f"sentinel {where} master {self.master_name}"
        return f"{self.kind} {where}"


def address(text: str, what: str) -> tuple[str, int]:
    if "://" in text:
        raise SettingsError(
            f"{what}: {text!r} is a URL; {what} is host:port as in the reference "
            "(a URL goes to --backend)"
        )
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise SettingsError(f"{what}: {text!r} is not host:port")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise SettingsError(f"{what}: {text!r} has no numeric port") from None


def parse_backend_url(url: str, pool_size: int = 10, timeout: float = 10.0) -> RedisTarget:
    """Parse ``redis://``, ``rediss://``, ``redis+cluster://``, ``redis+sentinel://``, ``unix://``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    common: dict[str, Any] = {
        "username": user,
        "password": password,
        "pool_size": pool_size,
        "timeout": timeout,
    }
    if scheme == "unix":
        return RedisTarget(unix_path=parts.path, **common)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        raise SettingsError(f"--backend {url!r}: no host")
    addresses = tuple(address(h, "--backend") for h in hosts.split(","))
    path = parts.path.strip("/")
    if scheme in ("redis", "rediss"):
        db = int(path) if path.isdigit() else 0
        return RedisTarget("single", addresses[:1], tls=scheme == "rediss", db=db, **common)
    if scheme in ("redis+cluster", "rediss+cluster"):
        return RedisTarget("cluster", addresses, tls=scheme.startswith("rediss"), **common)
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        if not path:
            raise SettingsError(f"--backend {url!r}: name the master, e.g. .../mymaster")
        return RedisTarget(
            "sentinel", addresses, master_name=path, tls=scheme.startswith("rediss"), **common
        )
    raise SettingsError(
        f"--backend {url!r}: unknown scheme (memory, redis://, rediss://, redis+cluster://, "
        "redis+sentinel://, unix://)"
    )


def target_from_env_style(
    kind: str, url: str, socket_type: str, auth: str, tls: bool, pool_size: int, timeout: float
) -> RedisTarget:
    """A target from the reference's REDIS_TYPE / REDIS_URL / REDIS_SOCKET_TYPE / REDIS_AUTH."""
    user, password = split_auth(auth)
    common: dict[str, Any] = {
        "username": user,
        "password": password,
        "tls": tls,
        "pool_size": pool_size,
        "timeout": timeout,
    }
    kind = kind.lower()
    if kind == "single":
        if socket_type == "unix":
            return RedisTarget(unix_path=url, **common)
        return RedisTarget("single", (address(url, "REDIS_URL"),), **common)
    if kind == "cluster":
        addrs = tuple(address(u, "REDIS_URL") for u in url.split(","))
        return RedisTarget("cluster", addrs, **common)
    if kind == "sentinel":
        master, *nodes = url.split(",")
        if not nodes:
            raise SettingsError("REDIS_URL for sentinel is 'mastername,host:port[,host:port...]'")
        addrs = tuple(address(u, "REDIS_URL") for u in nodes)
        return RedisTarget("sentinel", addrs, master_name=master, **common)
    raise SettingsError(f"REDIS_TYPE={kind!r} must be single, sentinel or cluster")


def split_auth(auth: str) -> tuple[str | None, str | None]:
    """REDIS_AUTH's forms: ``password``, or ``user:password`` (split at the first colon)."""
    if not auth:
        return None, None
    user, sep, password = auth.partition(":")
    return (user, password) if sep else (None, auth)
