"""A sick Redis under steady load with a client deadline shorter than REDIS_TIMEOUT: calls
are answered in time with the failure policy, refused hits are not counted, the breaker
bounds reconnects, the state is visible, and no task exception is lost.

Each fault runs through ``sick_redis.run_fault`` (real redis-server, a TCP proxy of the
test's own); tests/bench/bench_faults.py prints the same figures for longer faults.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest
from sick_redis import CONFIG, FAULTS, run_cluster_kill, run_fault

from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.connections.redis import BACKOFF_CAP, BREAKER_FAILURES, reason_of

from conftest import ConfigDir, ServerFactory, wait_for
from redis_procs import RedisProcess

OK_CODE = 1  # RateLimitResponse.OK

# Generous: the property is "answered before the deadline", on two shared cores.
IN_TIME = 0.97


@pytest.mark.parametrize("fault", FAULTS)
def test_a_sick_redis_is_answered_in_time_and_refused_hits_are_not_counted(
    fault: str, tmp_path: Path
) -> None:
    """Under 100 calls/s with a 300 ms client deadline (REDIS_TIMEOUT 1 s), during the fault
    calls are answered before the deadline with OK or UNAVAILABLE, the hits in Redis equal
    the calls answered OK, every state change is logged with a reason, service recovers."""
    report = run_fault(fault, tmp_path)
    assert report.calls > 200
    assert report.answered_in_time >= IN_TIME, report.codes
    assert report.policy_ok, report.codes
    assert report.hits_exact, report.counted
    assert report.recovery is not None and report.recovery < 5.0
    assert report.lost == []
    assert all(line.strip() and "()" not in line for line in report.log_lines)
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


def test_refused_connections_are_retried_with_backoff_not_per_call(tmp_path: Path) -> None:
    """While Redis refuses connections, connection attempts stay bounded by the breaker's
    backoff (a few per second), not one per call (100 per second)."""
    report = run_fault("refuse", tmp_path, seconds=2.0)
    assert report.connects_per_second < 10 + BREAKER_FAILURES, report
    assert report.refused_calls > 50


def test_no_task_exception_is_lost_in_asyncio_debug_mode(tmp_path: Path) -> None:
    """With the server's loop in asyncio debug mode, faults that break connections in every
    way leave no "Task exception was never retrieved" nor "coroutine was never awaited"."""
    for fault in ("close", "slow", "blackhole"):
        report = run_fault(fault, tmp_path / fault, seconds=1.0, settle=1.0, debug=True)
        assert report.lost == [], report.lost


def test_reasons_are_named_never_blank() -> None:
    """Each kind of failure has its name, and a failure without a message still has one."""
    import redis.exceptions as rex

    from ferryman.connections.redis_pipe import DeadlineError

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
