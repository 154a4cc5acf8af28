"""``Settings.from_env``: every declared variable read by its declaration, then the checks
that span several variables and the fields derived from several of them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ferryman.errors import SettingsError
from ferryman.settings.model import ACCEPTED, VARIABLES, Settings, declared

__all__ = ["check_redis_url", "read"]

_RUNTIME = ("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
# Setting any of these asks for the StatsD sink (rather than leaving it on by default).
_STATSD = ("USE_STATSD", "STATSD_HOST", "STATSD_PORT", "STATSD_PROTOCOL", "USE_DOG_STATSD")
_MOGRIFIER = "DOG_STATSD_MOGRIFIER_"


def read(cls: type[Settings], env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``env`` (default: ``os.environ``); raises SettingsError naming the
    variable of the first bad value."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {name: s.read(env) for name, s in declared() if s.env}
    for setting in ACCEPTED:
        setting.read(env)  # ignored, but a value that cannot be valid is still refused
    values["backend"] = _backend(env, values["backend"])
    _check_tls(values)
    _check_xds(values)
    _check_startup(values)
    values.update(_runtime(env))
    values.update(_telemetry(env, values))
    values.update(_statsd(env, values))
    values["health_requires_backend"] = values["health_requires_backend"] or _value(
        env, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"
    )
    values["redis_startup_wait"] = any(
        env.get(s.env, "") != "" for _, s in declared() if s.env.startswith("REDIS_STARTUP_")
    )
    values["ignored"] = tuple(s.env for s in ACCEPTED if env.get(s.env, "") != "")
    return cls(**values)


def _value(env: Mapping[str, str], name: str) -> Any:
    return VARIABLES[name].read(env)


def _runtime(env: Mapping[str, str]) -> dict[str, Any]:
    """The RUNTIME_* variables, any of them present, choose the descriptor directory."""
    if not any(name in env for name in _RUNTIME):
        return {}
    root = Path(_value(env, "RUNTIME_ROOT"))
    directory = root / _value(env, "RUNTIME_SUBDIRECTORY") / _value(env, "RUNTIME_APPDIRECTORY")
    return {"runtime_root": root, "config_dir": directory}


def _backend(env: Mapping[str, str], chosen: str) -> str:
    if not env.get("BACKEND_TYPE", "").strip() and env.get("REDIS_URL"):
        # The reference defaults to Redis, and manifests written for it (Istio's guide
        # among them) set only REDIS_URL: honour that.
        return "redis"
    if chosen == "memcache":
        if not env.get("MEMCACHE_HOST_PORT"):
            srv = " (MEMCACHE_SRV discovery is not supported)" if env.get("MEMCACHE_SRV") else ""
            raise SettingsError(
                f"BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT=host:port[,host:port...]{srv}"
            )
        if _value(env, "MEMCACHE_TLS"):
            raise SettingsError("MEMCACHE_TLS=true: ferryman speaks to memcached without TLS")
    return chosen


def _check_tls(values: Mapping[str, Any]) -> None:
    """The TLS variables make sense together (the files themselves are read at start)."""
    cert, key = values["grpc_server_tls_cert"], values["grpc_server_tls_key"]
    client_ca, client_san = values["grpc_client_tls_cacert"], values["grpc_client_tls_san"]
    if not values["grpc_server_use_tls"]:
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


def _check_xds(values: Mapping[str, Any]) -> None:
    if bool(values["xds_client_tls_cert"]) != bool(values["xds_client_tls_key"]):
        raise SettingsError(
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together "
            "(a client certificate and its key, PEM files)"
        )
    _check_order(values, "xds_backoff_initial_interval", "xds_backoff_max_interval")


def _check_startup(values: Mapping[str, Any]) -> None:
    _check_order(values, "redis_startup_initial_interval", "redis_startup_max_interval")


def _check_order(values: Mapping[str, Any], shorter: str, longer: str) -> None:
    """A backoff's longest wait is not shorter than its first."""
    if values[longer] < values[shorter]:
        names = dict(declared())
        raise SettingsError(
            f"{names[longer].env} ({values[longer]:g}s) is shorter than "
            f"{names[shorter].env} ({values[shorter]:g}s)"
        )


def _telemetry(env: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """OTEL_EXPORTER_OTLP_ENDPOINT serves where the specific endpoints are unset; and
    DISABLE_STATS, as the reference's, means no stats sink of any kind."""
    otlp = _value(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    disabled = values["disable_stats"]
    return {
        "otlp_metrics_endpoint": "" if disabled else values["otlp_metrics_endpoint"] or otlp,
        "otlp_traces_endpoint": values["otlp_traces_endpoint"] or otlp,
        "use_prometheus": values["use_prometheus"] and not disabled,
    }


def _statsd(env: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, Any]:
    """Whether StatsD was asked for, and the mogrifiers' own variables (checked when
    DogStatsD is on)."""
    mogrifier_env = tuple(sorted((k, v) for k, v in env.items() if k.startswith(_MOGRIFIER)))
    if values["use_dog_statsd"]:
        from ferryman.statsd import mogrifiers_from_env

        mogrifiers_from_env(values["use_dog_statsd_mogrifiers"], dict(mogrifier_env))
    return {
        "statsd_explicit": any(env.get(name, "") != "" for name in _STATSD),
        "dog_statsd_mogrifier_env": mogrifier_env,
    }


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
