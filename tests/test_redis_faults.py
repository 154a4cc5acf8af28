"""Redis faults with real redis-server processes: kills, restarts, stalls, absence, fail-open.

Each test owns its redis-server on a free port, so killing it disturbs no other test.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import pytest
import redis

from ferryman.algorithms.fixed_window.model import CounterOp
from ferryman.backends.redis import RedisBackend
from ferryman.connections.redis import LuaScript
from ferryman.errors import BackendError

from helpers.ports import free_port
from helpers.redis_procs import RedisFactory
from helpers.server import (
    MIXED,
    MIXED_REQUEST,
    ConfigDir,
    Server,
    ServerFactory,
    codes,
    overall,
    wait_for,
)
from helpers.stores import redis_backend

pytestmark = pytest.mark.redis

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
"""

TIMEOUT = 0.5  # the backend timeout every test uses
MARGIN = 1.0  # slack on top of it for scheduling, gRPC and the test's own threads
CALL = "ratelimit.service.call.should_rate_limit"
OK = grpc.StatusCode.OK
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE

_values = itertools.count()


@dataclass(frozen=True)
class Outcome:
    """One ShouldRateLimit call: when it started, how it ended, how long it took."""

    started: float
    code: grpc.StatusCode
    seconds: float
    overall: str = ""


def fresh() -> str:
    """A descriptor value no earlier call used, so limits never interfere."""
    return f"v{next(_values)}"


def call(server: Server, value: str | None = None) -> Outcome:
    """One timed ShouldRateLimit for ``k=value``; gRPC errors become their status code."""
    started = time.monotonic()
    try:
        response = server.ask("d", [("k", value or fresh())])
    except grpc.RpcError as exc:
        return Outcome(started, exc.code(), time.monotonic() - started)
    return Outcome(started, OK, time.monotonic() - started, overall(response))


def health(server: Server) -> int:
    return server.http("GET", "/healthcheck")[0]


def backend(url: str) -> RedisBackend:
    return redis_backend(url, pool_size=4, timeout=TIMEOUT)


def script_sha() -> str:
    return LuaScript.of("ferryman.algorithms.fixed_window", "fixed_window.lua").sha


@pytest.fixture(autouse=True)
def _config(config_dir: ConfigDir) -> None:
    config_dir.write("d.yaml", CONFIG)


def test_redis_killed_mid_traffic_fails_fast_and_turns_unhealthy(
    make_redis: RedisFactory, make_server: ServerFactory
) -> None:
    """After SIGKILL of Redis mid-traffic every call is UNAVAILABLE within the timeout."""
    proc = make_redis().start()
    server = make_server(backend=backend(proc.url), health_requires_backend=True)
    wait_for("healthy at start", lambda: health(server) == 200, 5)
    errors_before = server.stat(f"{CALL}.redis_error")

    outcomes: list[Outcome] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            outcomes.append(call(server))

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        wait_for("traffic flowing", lambda: sum(o.code is OK for o in outcomes) >= 5, 5)
        proc.kill()
        killed = time.monotonic()
        wait_for("calls after kill", lambda: sum(o.started > killed for o in outcomes) >= 20, 10)
    finally:
        stop.set()
        sender.join(15)
    assert not sender.is_alive()

    after = [o for o in outcomes if o.started > killed]
    assert {o.code for o in after} == {UNAVAILABLE}
    assert max(o.seconds for o in after) < TIMEOUT + MARGIN
    failed = sum(o.code is UNAVAILABLE for o in outcomes)
    assert server.stat(f"{CALL}.redis_error") - errors_before == failed >= len(after)
    wait_for("/healthcheck turns 500", lambda: health(server) == 500, 5)


def test_service_recovers_when_redis_restarts_empty_on_the_same_port(
    make_redis: RedisFactory, make_server: ServerFactory
) -> None:
    """A brand new, empty Redis on the same port is used again without restarting ferryman."""
    first = make_redis().start()
    server = make_server(backend=backend(first.url), health_requires_backend=True)
    assert call(server).code is OK
    first.kill()
    wait_for("calls fail once Redis is gone", lambda: call(server).code is UNAVAILABLE, 5)
    wait_for("/healthcheck turns 500", lambda: health(server) == 500, 5)

    second = make_redis(first.port).start()
    # The probe that finds the new Redis loads the scripts before it reports the backend up.
    wait_for("/healthcheck back to 200", lambda: health(server) == 200, 10)
    with second.client() as client:
        client.script_flush()  # so that the next call meets NOSCRIPT
        assert client.script_exists(script_sha()) == [False]
    wait_for("calls succeed again", lambda: call(server).code is OK, 5)

    value = fresh()
    assert [call(server, value).overall for _ in range(4)] == ["OK", "OK", "OK", "OVER_LIMIT"]
    with second.client() as client:
        assert client.get(f"d_k_{value}_{int(server.clock.now()) // 60 * 60}") == b"4"


def test_script_flush_on_live_redis_is_handled_by_reloading_the_script(
    make_redis: RedisFactory, make_server: ServerFactory
) -> None:
    """After SCRIPT FLUSH the next call still succeeds: NOSCRIPT reloads the script."""
    proc = make_redis().start()
    server = make_server(backend=backend(proc.url))
    value = fresh()
    assert call(server, value).overall == "OK"
    with proc.client() as client:
        assert client.script_exists(script_sha()) == [True]
        client.script_flush()
        assert client.script_exists(script_sha()) == [False]
    errors = server.stat(f"{CALL}.redis_error")

    assert call(server, value).overall == "OK"
    with proc.client() as client:
        assert client.script_exists(script_sha()) == [True]
    assert [call(server, value).overall for _ in range(2)] == ["OK", "OVER_LIMIT"]
    assert server.stat(f"{CALL}.redis_error") == errors
    assert health(server) == 200


def test_stalled_redis_fails_calls_within_the_timeout_and_recovers(
    make_redis: RedisFactory, make_server: ServerFactory
) -> None:
    """During DEBUG SLEEP 3 calls are UNAVAILABLE within the timeout; afterwards they succeed."""
    proc = make_redis(None, "--enable-debug-command", "local").start()
    server = make_server(backend=backend(proc.url))
    assert call(server).code is OK

    sending = threading.Event()

    def stall() -> None:
        with redis.Redis(port=proc.port, socket_timeout=10) as client:
            client.ping()
            sending.set()
            client.execute_command("DEBUG", "SLEEP", "3")

    sleeper = threading.Thread(target=stall, daemon=True)
    stalled = time.monotonic()
    sleeper.start()
    assert sending.wait(5)
    time.sleep(0.1)  # let the DEBUG SLEEP reach Redis before the calls do

    # More concurrent calls than the pool has connections: none may wait for the stall.
    with ThreadPoolExecutor(8) as pool:
        during = list(pool.map(lambda _: call(server), range(8)))
    assert time.monotonic() - stalled < 3.0, "the calls outlasted the stall; proved nothing"
    assert {o.code for o in during} == {UNAVAILABLE}
    assert max(o.seconds for o in during) < TIMEOUT + MARGIN

    sleeper.join(10)
    assert not sleeper.is_alive()
    wait_for("calls succeed after the stall", lambda: call(server).code is OK, 5)
    value = fresh()
    assert [call(server, value).overall for _ in range(4)] == ["OK", "OK", "OK", "OVER_LIMIT"]
    wait_for("/healthcheck back to 200", lambda: health(server) == 200, 5)


def test_service_starts_without_redis_and_connects_when_it_appears(
    make_redis: RedisFactory, make_server: ServerFactory
) -> None:
    """With no Redis listening ferryman starts unhealthy, fails fast, and heals once it starts."""
    port = free_port()
    server = make_server(backend=backend(f"redis://127.0.0.1:{port}"), health_requires_backend=True)
    assert health(server) == 500
    for _ in range(3):
        outcome = call(server)
        assert outcome.code is UNAVAILABLE
        assert outcome.seconds < TIMEOUT + MARGIN
    assert server.stat(f"{CALL}.redis_error") == 3

    make_redis(port).start()
    wait_for("/healthcheck turns 200", lambda: health(server) == 200, 5)
    value = fresh()
    assert [call(server, value).overall for _ in range(4)] == ["OK", "OK", "OK", "OVER_LIMIT"]


def test_fail_open_answers_ok_and_counts_degraded_while_redis_is_down(
    make_redis: RedisFactory, make_server: ServerFactory
) -> None:
    """With fail_open and Redis killed, every call answers OK and is counted as degraded."""
    proc = make_redis().start()
    server = make_server(backend=backend(proc.url), fail_open=True)
    value = fresh()
    assert [call(server, value).overall for _ in range(4)] == ["OK", "OK", "OK", "OVER_LIMIT"]
    assert server.stat(f"{CALL}.degraded") == 0

    proc.kill()
    for n in range(1, 6):
        outcome = call(server, value)  # over the limit, but Redis cannot say so
        assert (outcome.code, outcome.overall) == (OK, "OK")
        assert outcome.seconds < TIMEOUT + MARGIN
        assert server.stat(f"{CALL}.degraded") == n
    assert server.stat(f"{CALL}.redis_error") == 0


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
def test_a_request_mixing_kinds_fails_as_one_when_redis_is_down(
    config_dir: ConfigDir, make_redis: RedisFactory, make_server: ServerFactory, fail_open: bool
) -> None:
    """A fixed window, burst tiers and held copies started together: with Redis killed the
    request gets one answer within the timeout, UNAVAILABLE or (fail-open) OK, counted once."""
    config_dir.write("mx.yaml", MIXED)
    proc = make_redis().start()
    server = make_server(backend=backend(proc.url), fail_open=fail_open)
    assert codes(server.ask("mx", *MIXED_REQUEST)) == ["OK"] * 3
    proc.kill()
    for n in range(1, 4):
        started = time.monotonic()
        if fail_open:
            assert codes(server.ask("mx", *MIXED_REQUEST)) == ["OK"] * 3
        else:
            with pytest.raises(grpc.RpcError) as failed:
                server.ask("mx", *MIXED_REQUEST)
            assert failed.value.code() == UNAVAILABLE
        assert time.monotonic() - started < TIMEOUT + MARGIN
        counted = f"{CALL}.degraded" if fail_open else f"{CALL}.redis_error"
        assert server.stat(counted) == n


def test_redis_backend_reports_unhealthy_and_errors_when_redis_is_gone(
    make_redis: RedisFactory,
) -> None:
    """With its Redis killed, the backend raises BackendError within its timeout."""
    proc = make_redis().start()
    backend = redis_backend(proc.url, timeout=1.0)

    async def scenario() -> None:
        await backend.start()
        try:
            op = CounterOp("gone_k", 1, 5, 60, 60)
            assert [
                r.after
                for r in await backend.store("fixed_window").apply([op], stop_when_over=False)
            ] == [1]
            proc.kill()
            started = time.monotonic()
            with pytest.raises(BackendError):
                await backend.store("fixed_window").apply([op], stop_when_over=False)
            assert time.monotonic() - started < 3
            # The health probe (every second) finds it gone and opens the breaker.
            for _ in range(300):
                if not backend.healthy():
                    break
                await asyncio.sleep(0.01)
            assert not backend.healthy()
        finally:
            await backend.close()

    asyncio.run(scenario())
