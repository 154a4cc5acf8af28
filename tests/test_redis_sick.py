"""A sick Redis under steady load with a client deadline shorter than REDIS_TIMEOUT: calls
are answered in time with the failure policy, refused hits are not counted, the breaker
bounds reconnects, the state is visible, and no task exception is lost.

Each fault runs through ``sick_redis.run_fault`` (real redis-server, a TCP proxy of the
test's own); tests/bench/bench_faults.py prints the same figures for longer faults.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import grpc
import pytest
import redis.exceptions as rex
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.connections.redis import BACKOFF_CAP, BREAKER_FAILURES, LuaScript, reason_of
from ferryman.connections.redis_pipe import DeadlineError

from helpers.redis_procs import RedisProcess
from helpers.server import (
    MIXED,
    MIXED_REQUEST,
    ConfigDir,
    ServerFactory,
    descriptor,
    limiter_stub,
    wait_for,
)
from helpers.sick_redis import CONFIG, FAULTS, run_cluster_kill, run_fault

OK_CODE = 1  # RateLimitResponse.OK

# Generous: the property is "answered before the deadline", on two shared cores.
IN_TIME = 0.97


@pytest.mark.parametrize("fault", FAULTS)
def test_a_sick_redis_is_answered_in_time_and_refused_hits_are_not_counted(
    fault: str, tmp_path: Path
) -> None:
    """Under 100 calls/s with a 300 ms client deadline (REDIS_TIMEOUT 1 s), during the fault
    calls are answered before the deadline with OK or UNAVAILABLE, the hits in Redis equal
    the calls answered OK, reconnects are bounded by the backoff, every state change is
    logged with a reason, and the service recovers."""
    report = run_fault(fault, tmp_path)
    assert report.calls > 200
    assert report.answered_in_time >= IN_TIME, report.codes
    assert report.policy_ok, report.codes
    assert report.hits_exact, report.counted
    assert report.recovery is not None and report.recovery < 5.0
    assert report.lost == []
    assert all(line.strip() and "()" not in line for line in report.log_lines)
    # Connection attempts are bounded by the backoff, not one per call (100 per second).
    assert report.connects_per_second < 10 + BREAKER_FAILURES, report
    if fault in ("refuse", "close", "kill"):
        assert report.refused_calls > 30  # answered by the open breaker, Redis not asked
    if fault != "slow":
        assert any("down" in t or "degraded" in t for t in report.transitions), report
        assert any(" is up " in line for line in report.log_lines[1:]), report.log_lines


def test_a_cluster_master_killed_under_load_fails_over_in_time_without_losing_hits(
    tmp_path: Path,
) -> None:
    """A replicated Cluster's master is killed under load: calls are answered in time with OK
    or UNAVAILABLE while its replica takes over, the promoted replica holds every hit
    answered OK, and the service recovers without a restart."""
    report = run_cluster_kill(tmp_path)
    assert report.answered_in_time >= IN_TIME, report.codes
    assert report.policy_ok, report.codes
    assert report.hits_exact, report.counted
    assert report.recovery is not None and report.recovery < 5.0, report
    assert report.lost == []
    assert report.connects_per_second < 10 + BREAKER_FAILURES, report


def test_fail_open_answers_ok_in_time_during_a_stall(tmp_path: Path) -> None:
    """With FAIL_OPEN a stalled Redis gets OK answers before the deadline, and Redis holds no
    more hits than OK answers (the degraded ones are not counted, now or later)."""
    report = run_fault("sigstop", tmp_path, fail_open=True)
    assert report.answered_in_time >= IN_TIME, report.codes
    assert report.policy_ok, report.codes
    assert report.hits_exact, report.counted


def test_no_task_exception_is_lost_in_asyncio_debug_mode(tmp_path: Path) -> None:
    """With the server's loop in asyncio debug mode, faults that break connections in every
    way leave no "Task exception was never retrieved" nor "coroutine was never awaited"."""
    for fault in ("close", "blackhole"):
        report = run_fault(fault, tmp_path / fault, seconds=1.0, settle=1.0, debug=True)
        assert report.lost == [], report.lost


def test_reasons_are_named_never_blank() -> None:
    """Each kind of failure has its name, and a failure without a message still has one."""
    assert reason_of(DeadlineError())[0] == "timeout"
    assert reason_of(TimeoutError())[1] == "TimeoutError"
    assert reason_of(rex.ConnectionError("Error 111 connecting to x. Connection refused."))[0] == (
        "refused"
    )
    assert reason_of(rex.ReadOnlyError("READONLY You can't write"))[0] == "READONLY"
    assert reason_of(rex.ClusterDownError("CLUSTERDOWN The cluster is down"))[0] == ("CLUSTERDOWN")
    assert reason_of(rex.BusyLoadingError("LOADING Redis is loading"))[0] == "LOADING"
    assert reason_of(rex.AuthenticationError("invalid username-password pair"))[0] == "auth"
    assert reason_of(rex.ResponseError("WRONGPASS invalid"))[0] == "auth"
    assert reason_of(rex.ConnectionError("redis closed the connection"))[0] == "closed"


def test_health_stays_serving_while_redis_is_down_unless_asked(
    make_server: ServerFactory, config_dir: ConfigDir, tmp_path: Path
) -> None:
    """By default /healthcheck stays 200 while Redis is down (the service answers with its
    policy); /status shows the state, the reason and the open breaker; with the setting,
    health fails."""
    config_dir.write("d.yaml", CONFIG)
    proc = RedisProcess(tmp_path / "r").start()
    try:
        backend = RedisBackend(parse_backend_url(proc.url, timeout=0.5))
        strict = RedisBackend(parse_backend_url(proc.url, timeout=0.5))
        server = make_server(backend=backend)
        strict_server = make_server(backend=strict, health_requires_backend=True)
        wait_for("both up", lambda: backend.connection.state == strict.connection.state == "up")
        assert server.ask("sick", [("k", "v")]).overall_code == OK_CODE
        proc.kill()
        with pytest.raises(grpc.RpcError) as failed:
            server.ask("sick", [("k", "v")])
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
        wait_for("down", lambda: backend.connection.state == "down", BACKOFF_CAP + 2)
        assert server.http("GET", "/healthcheck")[0] == 200
        wait_for("strict 500", lambda: strict_server.http("GET", "/healthcheck")[0] == 500)
        status = json.loads(server.http("GET", "/status", debug=True)[1])
        (conn,) = status["backend"]["connections"]
        assert conn["state"] == "down"
        assert conn["reason"].split(":")[0] in ("refused", "closed")
        assert conn["breaker"]["open"] is True
        started = time.monotonic()
        with pytest.raises(grpc.RpcError):
            server.ask("sick", [("k", "v")])
        assert time.monotonic() - started < 0.5  # the open breaker answers at once
        assert conn["breaker"]["refused_calls"] <= backend.connection.refused
    finally:
        proc.stop()


def _scripts() -> list[tuple[str, str]]:
    """Every Lua script shipped with an algorithm: (package, file name)."""
    found = []
    for package in resources.files("ferryman.algorithms").iterdir():
        if package.is_dir():
            for item in package.iterdir():
                if item.name.endswith(".lua"):
                    found.append((f"ferryman.algorithms.{package.name}", item.name))
    return sorted(found)


@pytest.mark.parametrize("script", _scripts(), ids=lambda s: s[1])
def test_every_shipped_script_changes_nothing_after_its_deadline(
    script: tuple[str, str], tmp_path: Path
) -> None:
    """Each algorithm's script, given a deadline already past on Redis's clock, answers LATE
    and writes nothing; with no deadline (0) it runs."""
    lua = LuaScript.of(*script)
    proc = RedisProcess(tmp_path / "r").start()
    try:
        with proc.client() as client:
            keys = [f"{{late}}:{i}" for i in range(12)]
            seconds, micros = client.time()
            past = seconds * 1_000_000 + micros - 1000
            with pytest.raises(rex.ResponseError, match=r"^LATE"):
                client.eval(lua.source, len(keys), *keys, past, *["1"] * 40)
            assert client.dbsize() == 0
            assert client.script_load(lua.source) == lua.sha
    finally:
        proc.stop()


def test_every_api_answers_by_the_deadline_while_redis_is_stopped(
    make_server: ServerFactory, config_dir: ConfigDir, tmp_path: Path
) -> None:
    """With Redis stopped (SIGSTOP) and REDIS_TIMEOUT 5 s, a 300 ms deadline is kept by a
    request mixing fixed windows, burst tiers and held copies, and by Limiter/Request:
    UNAVAILABLE, never DEADLINE_EXCEEDED; and nothing they sent is counted once Redis wakes."""
    config_dir.write("mx.yaml", MIXED)
    proc = RedisProcess(tmp_path / "r").start()
    assert proc.proc is not None
    try:
        backend = RedisBackend(parse_backend_url(proc.url, timeout=5.0))
        server = make_server(backend=backend, real_clock=True)
        limiter = limiter_stub(server.channel)
        wait_for("up", lambda: backend.connection.state == "up")
        rate = limiter_pb2.RateRequest(
            domain="mx", descriptor=[limiter_pb2.Entry(key="tiers", value="r")], copies=1
        )
        assert limiter.Request(rate, timeout=5).granted == 1
        mixed = rls_pb2.RateLimitRequest(
            domain="mx", descriptors=[descriptor(d) for d in MIXED_REQUEST]
        )
        with proc.client() as client:
            before = {k: client.dump(k) for k in client.keys("*")}
        os.kill(proc.proc.pid, signal.SIGSTOP)
        try:
            for _ in range(3):
                calls: tuple[Callable[[], object], ...] = (
                    lambda: server.stub.ShouldRateLimit(mixed, timeout=0.3),
                    lambda: limiter.Request(rate, timeout=0.3),
                )
                for call in calls:
                    started = time.monotonic()
                    with pytest.raises(grpc.RpcError) as failed:
                        call()
                    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
                    assert time.monotonic() - started < 0.3
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        wait_for("late scripts refused", lambda: backend.connection.late >= 9, 5)
        with proc.client() as client:
            after = {k: client.dump(k) for k in client.keys("*")}
        assert after == before
    finally:
        proc.stop()
