"""Settings come from the reference service's environment variable names."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferryman.errors import SettingsError
from ferryman.server.app import grpc_server_options
from ferryman.settings import Settings, default_config_dir


def test_defaults_match_the_reference_ports_and_memory_backend() -> None:
    """With an empty environment: ports 8081/8080/6070, memory backend, ratio 0.8."""
    s = Settings.from_env({})
    assert (s.grpc_port, s.port, s.debug_port) == (8081, 8080, 6070)
    assert s.backend == "memory"
    assert s.near_limit_ratio == 0.8
    assert s.runtime_root is None


def test_reference_variables_are_read() -> None:
    """A reference deployment's variables land in the matching settings."""
    s = Settings.from_env(
        {
            "GRPC_PORT": "9001",
            "PORT": "9002",
            "DEBUG_PORT": "9003",
            "RUNTIME_ROOT": "/data",
            "RUNTIME_SUBDIRECTORY": "ratelimit",
            "RUNTIME_IGNOREDOTFILES": "false",
            "RUNTIME_WATCH_ROOT": "false",
            "SHADOW_MODE": "true",
            "QUOTA_MODE": "1",
            "NEAR_LIMIT_RATIO": "0.9",
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "True",
            "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
            "LIMIT_REMAINING_HEADER": "X-Left",
            "REDIS_TIMEOUT": "500ms",
            "CACHE_KEY_PREFIX": "rl_",
            "BACKEND_TYPE": "redis",
            "REDIS_URL": "redis:6379",
        }
    )
    assert (s.grpc_port, s.port, s.debug_port) == (9001, 9002, 9003)
    assert s.config_dir == Path("/data/ratelimit/config")
    assert s.runtime_root == Path("/data")
    assert not s.ignore_dotfiles
    assert not s.watch_root
    assert s.shadow_mode
    assert s.quota_mode
    assert s.near_limit_ratio == 0.9
    assert s.stop_cache_key_increment_when_overlimit
    assert s.limit_response_headers_enabled
    assert s.limit_remaining_header == "X-Left"
    assert s.redis_timeout == 0.5
    assert s.cache_key_prefix == "rl_"
    assert s.backend == "redis"
    assert s.redis_url == "redis:6379"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GRPC_PORT", "http"),
        ("SHADOW_MODE", "maybe"),
        ("NEAR_LIMIT_RATIO", "1.5"),
        ("REDIS_TIMEOUT", "soon"),
        ("REDIS_PIPELINE_WINDOW", "150 microseconds"),
        ("REDIS_PIPELINE_LIMIT", "-1"),
        ("BACKEND_TYPE", "memcache"),
        ("LOG_FORMAT", "xml"),
        ("GRPC_KEEPALIVE_TIME", "often"),
        ("GRPC_KEEPALIVE_TIMEOUT", "-1s"),
    ],
)
def test_invalid_values_are_rejected_naming_the_variable(name: str, value: str) -> None:
    """A bad value raises SettingsError that names the variable."""
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_default_config_dir_is_descriptors_of_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rule: descriptors/ relative to where ferryman runs, wherever it is installed."""
    monkeypatch.chdir(tmp_path)
    assert default_config_dir() == tmp_path / "descriptors"
    assert Settings.from_env({}).config_dir == tmp_path / "descriptors"


def test_grpc_keepalive_reaches_the_server_options() -> None:
    """GRPC_KEEPALIVE_TIME / _TIMEOUT become the server's ping period and ping timeout; 0
    turns the server's pings off (client pings stay allowed)."""
    settings = Settings.from_env({"GRPC_KEEPALIVE_TIME": "2s", "GRPC_KEEPALIVE_TIMEOUT": "500ms"})
    options = dict(grpc_server_options(settings))
    assert options["grpc.keepalive_time_ms"] == 2000
    assert options["grpc.keepalive_timeout_ms"] == 500
    assert options["grpc.http2.ping_timeout_ms"] == 500
    assert options["grpc.http2.max_pings_without_data"] == 0
    off = dict(grpc_server_options(Settings.from_env({"GRPC_KEEPALIVE_TIME": "0"})))
    assert "grpc.keepalive_time_ms" not in off
    assert (
        off["grpc.http2.min_ping_interval_without_data_ms"]
        == options["grpc.http2.min_ping_interval_without_data_ms"]
    )
    defaults = Settings()
    assert (defaults.grpc_keepalive_time, defaults.grpc_keepalive_timeout) == (10.0, 5.0)


def test_grpc_holds_as_many_pending_calls_as_quota_streams_may_open() -> None:
    """A mesh's Envoys open their quota streams at once: gRPC holds RLQS_MAX_STREAMS calls
    before the server takes them (twice that before refusing every one), not 1,000."""
    options = dict(grpc_server_options(Settings.from_env({"RLQS_MAX_STREAMS": "20000"})))
    assert options["grpc.server.max_pending_requests"] == 20_000
    assert options["grpc.server.max_pending_requests_hard_limit"] == 40_000
