"""REDIS_STARTUP_*: a real `ferryman serve` waits for Redis at start with exponential
backoff, logging each retry, and serves once a redis-server started after it answers; when
Redis never comes it gives up after REDIS_STARTUP_MAX_ELAPSED_TIME with a clear error and a
non-zero exit."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.errors import SettingsError
from ferryman.settings import Settings

from helpers.ports import free_port
from helpers.redis_procs import RedisFactory
from helpers.serve_process import ServeProcess
from helpers.server import descriptor, overall, rls_stub, wait_for

pytestmark = pytest.mark.redis

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def _env(port: int, **extra: str) -> dict[str, str]:
    return {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{port}",
        **extra,
    }


def _config(tmp_path: Path) -> Path:
    (tmp_path / "descriptors").mkdir()
    (tmp_path / "descriptors" / "d.yaml").write_text(CONFIG)
    return tmp_path


def test_the_startup_variables_are_read() -> None:
    """Set, they make the service wait (with the others at their defaults); unset, it
    starts at once as before; a bad value is refused."""
    assert not Settings.from_env({}).redis_startup_wait
    s = Settings.from_env({"REDIS_STARTUP_MAX_ELAPSED_TIME": "5s"})
    assert s.redis_startup_wait
    assert (s.redis_startup_initial_interval, s.redis_startup_max_interval) == (1.0, 30.0)
    assert s.redis_startup_max_elapsed_time == 5.0
    with pytest.raises(SettingsError, match="REDIS_STARTUP_MAX_INTERVAL"):
        Settings.from_env(
            {"REDIS_STARTUP_INITIAL_INTERVAL": "2s", "REDIS_STARTUP_MAX_INTERVAL": "1s"}
        )


def test_serve_waits_for_a_redis_that_starts_later(
    tmp_path: Path, make_redis: RedisFactory
) -> None:
    redis = make_redis(free_port())
    env = _env(
        redis.port,
        REDIS_STARTUP_INITIAL_INTERVAL="100ms",
        REDIS_STARTUP_MAX_INTERVAL="400ms",
        REDIS_STARTUP_MAX_ELAPSED_TIME="60s",
    )
    process = ServeProcess(_config(tmp_path), env)
    try:
        # Each retry is logged, with a growing delay; nothing is served meanwhile.
        wait_for("3 retries", lambda: "waiting for redis (attempt 3" in process.text, timeout=30)
        assert not process.serving()
        delays = [float(d) for d in re.findall(r"retrying in ([\d.]+)s", process.text)]
        assert delays[0] <= 0.1 + 1e-9 and max(delays) <= 0.4 + 1e-9
        assert "refused: Error 111 connecting to 127.0.0.1" in process.text
        redis.start()
        process.wait_serving()
        assert "redis answered after" in process.text
        with grpc.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
            request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "")])])
            answers = [overall(rls_stub(channel).ShouldRateLimit(request, timeout=5)) for _ in "ab"]
        assert answers == ["OK", "OVER_LIMIT"]
        with redis.client() as client:
            keys = [key.decode() for key in client.scan_iter()]
        assert [key for key in keys if key.startswith("d_k_")], keys  # counted in this Redis
        assert process.stop() == 0
    finally:
        process.kill()


def test_serve_gives_up_when_redis_never_comes(tmp_path: Path) -> None:
    env = _env(
        free_port(),
        REDIS_STARTUP_INITIAL_INTERVAL="100ms",
        REDIS_STARTUP_MAX_ELAPSED_TIME="1s",
    )
    process = ServeProcess(_config(tmp_path), env)
    try:
        assert process.wait_exit() == 2
        assert "ferryman serving" not in process.text
        last = process.lines[-1]
        assert last.startswith("ferryman: gave up waiting for redis after 1.0s"), process.text
        assert "(REDIS_STARTUP_MAX_ELAPSED_TIME=1s)" in last
        assert "refused: Error 111" in last
    finally:
        process.kill()


def test_a_signal_ends_the_wait(tmp_path: Path) -> None:
    """SIGTERM while waiting for Redis stops the service at once, cleanly (exit 0)."""
    env = _env(free_port(), REDIS_STARTUP_INITIAL_INTERVAL="100ms")
    process = ServeProcess(_config(tmp_path), env)
    try:
        wait_for("a retry", lambda: "waiting for redis (attempt 2" in process.text, timeout=30)
        assert process.stop() == 0
        assert "stopped while starting" in process.text
        assert "ferryman serving" not in process.text
    finally:
        process.kill()
