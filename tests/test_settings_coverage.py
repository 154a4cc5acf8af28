"""Every environment variable the reference service reads is either read by ferryman or
accepted, documented in the docs' migration page, and logged once at start if set."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ferryman.errors import SettingsError
from ferryman.settings import ACCEPTED_IGNORED, Settings
from ferryman.settings.model import VARIABLES

from helpers.ports import free_port
from helpers.server import wait_for

ROOT = Path(__file__).resolve().parents[1]
DOCS = "\n".join(page.read_text() for page in sorted((ROOT / "docs").rglob("*.md")))
MIGRATION = (ROOT / "docs" / "operators" / "migration.md").read_text()

# The variables of envoyproxy/ratelimit's src/settings/settings.go (the `envconfig:` tags):
# those at commit 00e75e687256efaa1214f3d24f29757962c2fa42, and those that later revisions
# add (REDIS_SENTINEL_AUTH and after), as issue 17 lists them.
REFERENCE_VARIABLES = """
PROTO HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT
GRPC_MAX_CONNECTION_AGE GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS
GRPC_SERVER_TLS_CERT GRPC_SERVER_TLS_KEY GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN
LOG_LEVEL LOG_FORMAT CONFIG_TYPE FORCE_START_WITHOUT_INITIAL_CONFIG
CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA CONFIG_GRPC_XDS_SERVER_URL
CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS
CONFIG_GRPC_XDS_SERVER_USE_TLS CONFIG_GRPC_XDS_CLIENT_TLS_CERT CONFIG_GRPC_XDS_CLIENT_TLS_KEY
CONFIG_GRPC_XDS_SERVER_TLS_CACERT CONFIG_GRPC_XDS_SERVER_TLS_SAN
XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL
XDS_CLIENT_BACKOFF_RANDOM_FACTOR XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES
USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS
STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS PROMETHEUS_ADDR PROMETHEUS_PATH
PROMETHEUS_MAPPER_YAML PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS
RUNTIME_ROOT RUNTIME_SUBDIRECTORY RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT
EXPIRATION_JITTER_MAX_SECONDS LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX
BACKEND_TYPE STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER
HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
REDIS_SOCKET_TYPE REDIS_TYPE REDIS_URL REDIS_POOL_SIZE REDIS_AUTH REDIS_TLS
REDIS_TLS_CLIENT_CERT REDIS_TLS_CLIENT_KEY REDIS_TLS_CACERT REDIS_TLS_SKIP_HOSTNAME_VERIFICATION
REDIS_PIPELINE_WINDOW REDIS_PIPELINE_LIMIT
REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE REDIS_PERSECOND_TYPE REDIS_PERSECOND_URL
REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH REDIS_PERSECOND_TLS
REDIS_PERSECOND_PIPELINE_WINDOW REDIS_PERSECOND_PIPELINE_LIMIT
REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT
MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV MEMCACHE_SRV_REFRESH MEMCACHE_TLS
MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION
SHADOW_MODE RESPONSE_DYNAMIC_METADATA MERGE_DOMAIN_CONFIG
TRACING_ENABLED TRACING_SERVICE_NAME TRACING_SERVICE_NAMESPACE TRACING_SERVICE_INSTANCE_ID
TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE
REDIS_SENTINEL_AUTH REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_TIMEOUT
REDIS_POOL_ON_EMPTY_BEHAVIOR REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR
REDIS_POOL_ON_EMPTY_WAIT_DURATION REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION
REDIS_STARTUP_INITIAL_INTERVAL REDIS_STARTUP_MAX_INTERVAL REDIS_STARTUP_MAX_ELAPSED_TIME
QUOTA_MODE
""".split()  # noqa: SIM905 (a plain list, as the reference writes it)


def _migration_section() -> str:
    assert MIGRATION.startswith("# Migrating from envoyproxy/ratelimit\n")
    return MIGRATION


def _read_by_settings(name: str) -> bool:
    """``name`` is declared as a setting ferryman honours (not an accepted-and-ignored one)."""
    return name in VARIABLES and name not in ACCEPTED_IGNORED


def test_the_reference_list_has_no_duplicates() -> None:
    """The list is a plain list of names, each once."""
    assert len(REFERENCE_VARIABLES) == len(set(REFERENCE_VARIABLES))
    assert all(re.fullmatch(r"[A-Z0-9_]+", name) for name in REFERENCE_VARIABLES)


@pytest.mark.parametrize("name", REFERENCE_VARIABLES)
def test_every_reference_variable_is_read_or_accepted_and_documented(name: str) -> None:
    """Read by ferryman (and named in the docs), or accepted-and-ignored and explained in
    the docs' migration page."""
    if name in ACCEPTED_IGNORED:
        assert f"`{name}`" in _migration_section(), f"{name}: explain it in the migration notes"
    else:
        assert _read_by_settings(name), f"{name} is neither read nor accepted-and-ignored"
        assert name in DOCS, f"{name} is read but no page of docs/ names it"


def test_every_accepted_variable_is_explained_in_the_migration_section() -> None:
    """No accepted-and-ignored name goes without its explanation."""
    section = _migration_section()
    assert [n for n in ACCEPTED_IGNORED if f"`{n}`" not in section] == []


def test_set_ignored_variables_are_recorded_and_invalid_values_still_refused() -> None:
    """Settings names the accepted variables that are set (for the one start-up line), and a
    value that cannot mean anything is still an error."""
    settings = Settings.from_env({"MEMCACHE_MAX_IDLE_CONNS": "4", "PROTO": "tcp"})
    assert settings.ignored == ("PROTO", "MEMCACHE_MAX_IDLE_CONNS")
    assert Settings.from_env({"MEMCACHE_MAX_IDLE_CONNS": ""}).ignored == ()
    with pytest.raises(SettingsError, match="REDIS_POOL_ON_EMPTY_BEHAVIOR"):
        Settings.from_env({"REDIS_POOL_ON_EMPTY_BEHAVIOR": "sometimes"})
    with pytest.raises(SettingsError, match="REDIS_STARTUP_MAX_INTERVAL"):
        Settings.from_env({"REDIS_STARTUP_MAX_INTERVAL": "soon"})
    with pytest.raises(SettingsError, match="CONFIG_TYPE"):
        Settings.from_env({"CONFIG_TYPE": "CONSUL"})
    with pytest.raises(SettingsError, match="GRPC_SERVER_USE_TLS"):
        Settings.from_env({"GRPC_SERVER_USE_TLS": "true"})
    with pytest.raises(SettingsError, match="MEMCACHE_TLS"):
        Settings.from_env(
            {"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "m:1", "MEMCACHE_TLS": "1"}
        )


def test_a_set_ignored_variable_is_logged_once_at_start(tmp_path: Path) -> None:
    """`ferryman serve` names each accepted-but-ignored variable that is set, once, at start."""
    config = tmp_path / "descriptors"
    config.mkdir()
    (config / "x.yaml").write_text("domain: d\ndescriptors:\n  - key: k\n")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONDONTWRITEBYTECODE": "1",
        "REDIS_POOL_ON_EMPTY_BEHAVIOR": "WAIT",
        "MEMCACHE_MAX_IDLE_CONNS": "4",
        "USE_STATSD": "false",
        "DEBUG_PORT": str(free_port()),
        # No drain on SIGTERM: this test does not test it, and would wait it out.
        "FERRYMAN_SHUTDOWN_DRAIN": "0",
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ferryman", "serve", "--grpc-port", "0", "--http-port", "0"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for("ferryman serving", lambda: "ferryman serving" in log.read_text(), timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    text = log.read_text()
    for name in ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "MEMCACHE_MAX_IDLE_CONNS"):
        assert text.count(f"{name} is set") == 1, text
    assert "USE_STATSD is set" not in text
