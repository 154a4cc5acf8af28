"""Synced counting: fixed windows decided from each replica's view and flushed to Redis,
with the stated error bound, answers equal to exact mode's for a replica alone, Redis
outages, bounded memory, the config keys and the request path."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from ferryman.algorithms.fixed_window.limiter import WindowLimiter
from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult
from ferryman.algorithms.fixed_window.redis import RedisFixedWindows
from ferryman.algorithms.fixed_window.synced import FLUSHES, SyncedFixedWindows
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import ManualClock
from ferryman.config.loader import load_directory
from ferryman.connections.deadline import ANSWER_BY
from ferryman.core.periods import UnitPeriod
from ferryman.core.rules import Unit
from ferryman.errors import ConfigError

from helpers.redis_procs import RedisProcess
from helpers.server import ConfigDir, ServerFactory, codes, remaining
from helpers.sick_redis import Proxy
from helpers.stores import redis_backend, unique_prefix

pytestmark = pytest.mark.redis

T = TypeVar("T")
MINUTE = UnitPeriod(Unit.MINUTE)
START = 1_700_000_040.0  # a minute window's start


def op(
    clock: ManualClock, key: str, hits: int = 1, limit: int = 100, sync: float = 0.1
) -> CounterOp:
    """An op on ``key``'s counter in the minute window of the clock's time."""
    return WindowLimiter.op(key, MINUTE, hits, limit, clock.now(), sync)


def replicas(url: str, clock: ManualClock, n: int) -> list[tuple[RedisBackend, SyncedFixedWindows]]:
    """``n`` replicas on one Redis: each its own connection and view, flushed by hand."""
    out = []
    for _ in range(n):
        backend = redis_backend(url, timeout=2.0, server_time=False)
        out.append(
            (backend, SyncedFixedWindows(RedisFixedWindows(backend.connection), clock, False))
        )
    return out


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(scenario())  # type: ignore[arg-type]


def test_two_replicas_admit_within_the_stated_bound(redis_server: RedisProcess) -> None:
    """Two replicas at the full rate admit at most limit + R x hits-per-interval in a window,
    at least the limit, and every hit (refused ones too) reaches Redis once."""
    clock = ManualClock(START)
    key = unique_prefix() + "k_"
    limit, per_interval, intervals = 100, 15, 12

    async def scenario() -> tuple[int, int, int]:
        pairs = replicas(redis_server.url, clock, 2)
        for backend, _ in pairs:
            await backend.start()
        admitted = 0
        try:
            for _ in range(intervals):
                for _, view in pairs:
                    for _ in range(per_interval):
                        (result,) = await view.apply(
                            [op(clock, key, limit=limit)], stop_when_over=False
                        )
                        admitted += result.after <= limit
                for _, view in pairs:
                    assert await view.flush()
                clock.advance(0.1)
            (counted,) = await pairs[0][1].exact.peek([op(clock, key)])
            return admitted, counted, len(pairs[0][1])
        finally:
            for backend, _ in pairs:
                await backend.close()

    admitted, counted, held = run(scenario)
    assert limit <= admitted <= limit + 2 * per_interval
    assert counted == 2 * per_interval * intervals
    assert held == 1


def test_a_replica_alone_answers_as_exact_mode_does(redis_server: RedisProcess) -> None:
    """One replica's view holds every hit, so a random trace (refunds, zero hits,
    stop-when-over, a key twice in a call) gets exact mode's answers, whenever it flushes."""
    clock = ManualClock(START)
    rng = random.Random(7)
    synced_prefix, exact_prefix = unique_prefix(), unique_prefix()

    async def scenario() -> tuple[list[list[int]], list[list[int]]]:
        ((backend, view),) = replicas(redis_server.url, clock, 1)
        await backend.start()
        exact = RedisFixedWindows(backend.connection)
        got, want = [], []
        try:
            for step in range(200):
                names = rng.choices("abc", k=rng.randint(1, 3))
                hits = [rng.choice([-3, 0, 1, 1, 2, 5]) for _ in names]
                stop = rng.random() < 0.5
                mine = [
                    op(clock, synced_prefix + n, h, limit=12)
                    for n, h in zip(names, hits, strict=True)
                ]
                theirs = [
                    op(clock, exact_prefix + n, h, limit=12, sync=0)
                    for n, h in zip(names, hits, strict=True)
                ]
                got.append(flat(await view.apply(mine, stop_when_over=stop)))
                want.append(flat(await exact.apply(theirs, stop_when_over=stop)))
                if step % 7 == 0:
                    assert await view.flush()
            return got, want
        finally:
            await backend.close()

    got, want = run(scenario)
    assert got == want


def flat(results: list[CounterResult]) -> list[int]:
    return [x for r in results for x in (r.after, r.applied)]


def test_exact_ops_go_to_redis_and_synced_ones_wait_for_the_flush(
    redis_server: RedisProcess,
) -> None:
    """An op with sync 0 is counted in Redis on the request path; a synced one only when
    the view flushes, in one write."""
    clock = ManualClock(START)
    prefix = unique_prefix()

    async def scenario() -> list[int]:
        ((backend, view),) = replicas(redis_server.url, clock, 1)
        await backend.start()
        try:
            await view.apply(
                [op(clock, prefix + "x", 2, sync=0), op(clock, prefix + "y", 3)],
                stop_when_over=False,
            )
            before_flush = await view.exact.peek([op(clock, prefix + "x"), op(clock, prefix + "y")])
            writes = backend.writes
            await view.flush()
            flush_writes = backend.writes - writes
            after = await view.exact.peek([op(clock, prefix + "x"), op(clock, prefix + "y")])
            return [*before_flush, *after, flush_writes]
        finally:
            await backend.close()

    assert run(scenario) == [2, 0, 2, 3, 1]


def test_an_outage_keeps_deciding_and_reconnects_without_counting_twice(
    redis_server: RedisProcess,
) -> None:
    """Redis unreachable: the view decides from its last global count, failed flushes and
    blind counters are counted; after it returns, the waiting hits are counted once."""
    clock = ManualClock(START)
    key, new = unique_prefix() + "k", unique_prefix() + "n"
    proxy = Proxy(redis_server.port)

    async def scenario() -> tuple[list[int], dict[str, object], int, list[int]]:
        ((backend, view),) = replicas(f"redis://127.0.0.1:{proxy.port}", clock, 1)
        await backend.start()
        try:
            for _ in range(4):
                await view.apply([op(clock, key, limit=6)], stop_when_over=False)
            assert await view.flush()
            await asyncio.to_thread(proxy.set, "refuse")
            during = []
            for _ in range(4):
                (r,) = await view.apply([op(clock, key, limit=6)], stop_when_over=False)
                during.append(r.after)
            await view.apply([op(clock, new, limit=6)], stop_when_over=False)
            assert not await view.flush()
            state = view.state()
            await asyncio.to_thread(proxy.set, "pass")
            tries = 0
            while not await view.flush():  # the connection's backoff and breaker clear
                tries += 1
                assert tries < 200
                await asyncio.sleep(0.05)
            return (
                during,
                state,
                view.blind,
                await view.exact.peek([op(clock, key), op(clock, new)]),
            )
        finally:
            await backend.close()

    try:
        during, state, blind, counted = run(scenario)
    finally:
        proxy.stop()
    assert during == [5, 6, 7, 8]
    assert state["degraded"] is True and state["unflushed_hits"] == 5
    assert isinstance(state["failures"], int) and state["failures"] >= 2
    assert blind == 1
    assert counted == [8, 1]


def test_counters_of_ended_windows_and_idle_counters_are_dropped(
    redis_server: RedisProcess,
) -> None:
    """Memory follows use: a flush drops counters whose window ended, and those that saw no
    request for a whole interval; a later request reads the global count again."""
    clock = ManualClock(START)
    prefix = unique_prefix()

    async def scenario() -> list[int]:
        ((backend, view),) = replicas(redis_server.url, clock, 1)
        await backend.start()
        try:
            sizes = []
            for i in range(50):
                await view.apply([op(clock, f"{prefix}{i}")], stop_when_over=False)
            sizes.append(len(view))
            await view.flush()  # sent; each was asked for since the last flush: kept
            sizes.append(len(view))
            await view.apply([op(clock, f"{prefix}0")], stop_when_over=False)
            await view.flush()  # 49 idle for an interval: dropped
            sizes.append(len(view))
            clock.advance(60)
            await view.flush()  # the window ended
            sizes.append(len(view))
            clock.advance(-60)
            (again,) = await view.apply([op(clock, f"{prefix}7")], stop_when_over=False)
            sizes.append(again.after)
            return sizes
        finally:
            await backend.close()

    assert run(scenario) == [50, 50, 1, 0, 2]


SYNCED = """
domain: s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3, sync: 60s}
  - key: g
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: e
    rate_limit: {unit: minute, requests_per_unit: 3, sync: 0s}
"""


def test_a_synced_rule_is_answered_without_a_round_trip(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    redis_server: RedisProcess,
    clock: ManualClock,
) -> None:
    """On the request path a synced rule (its own sync, or REDIS_SYNC_INTERVAL's) costs
    Redis one read of its counter, then nothing until the flush; ``sync: 0s`` stays exact;
    /status shows the view."""
    config_dir.write("s.yaml", SYNCED)
    target = parse_backend_url(redis_server.url, pool_size=4, timeout=5.0)
    backend = RedisBackend(target, server_time=False, clock=clock)
    server = make_server(
        backend=backend, cache_key_prefix=unique_prefix(), redis_sync_interval=30.0
    )
    first = [server.ask("s", [(key, "a")]) for key in "kg"]
    writes = backend.writes
    rest = [server.ask("s", [(key, "a")]) for _ in range(3) for key in "kg"]
    assert backend.writes == writes
    assert [remaining(r)[0] for r in [*first, *rest]] == [2, 2, 1, 1, 0, 0, 0, 0]
    assert codes(rest[-1]) == codes(rest[-2]) == ["OVER_LIMIT"]
    server.ask("s", [("e", "a")])
    assert backend.writes == writes + 1
    status, body = server.http("GET", "/status", debug=True)
    (sync,) = json.loads(body)["backend"]["sync"]
    assert (status, sync["counters"], sync["unflushed_hits"], sync["intervals"]) == (
        200,
        2,
        8,
        [30.0, 60.0],
    )
    (view,) = backend.synced()
    assert server.run(view.flush())
    assert server.stat(FLUSHES) == 1
    assert view.state()["unflushed_hits"] == 0


def test_sync_is_read_on_rate_limit_and_refused_elsewhere(tmp_path: Path) -> None:
    """``sync`` takes a duration up to 60s on a fixed window; another kind's map that has
    one is told which kind supports it."""
    (tmp_path / "ok.yaml").write_text(SYNCED.replace("domain: s", "domain: ok"))
    config = load_directory(tmp_path)
    limits = [rule.limit for _, rule in config.iter_limits()]
    assert [getattr(limit, "sync", None) for limit in limits] == [60.0, None, 0.0]
    (tmp_path / "bad.yaml").write_text(
        "domain: bad\ndescriptors:\n"
        "  - key: a\n    sliding_window: {unit: minute, requests_per_unit: 5, sync: 1s}\n"
        "  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5, sync: 2m}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_directory(tmp_path)
    text = str(caught.value)
    assert "bad.yaml:4" in text and "supported by rate_limit (fixed windows) only" in text
    assert "bad.yaml:6" in text and "sync 120s is out of range" in text


def test_the_flusher_outlives_the_deadline_of_the_request_that_started_it(
    redis_server: RedisProcess,
) -> None:
    """The background flush runs on a timer of its own and keeps sending after the
    deadline of the request that started it has passed."""
    clock = ManualClock(START)
    key = unique_prefix() + "k"

    async def scenario() -> int:
        backend = redis_backend(redis_server.url, timeout=2.0, server_time=False)
        await backend.start()
        view = SyncedFixedWindows(RedisFixedWindows(backend.connection), clock)
        try:
            token = ANSWER_BY.set(time.monotonic() + 0.2)
            await view.apply([op(clock, key, sync=0.01)], stop_when_over=False)
            ANSWER_BY.reset(token)
            await asyncio.sleep(0.3)  # past that deadline
            await view.apply([op(clock, key, sync=0.01)], stop_when_over=False)
            for _ in range(400):  # until a flush carries the second hit
                (counted,) = await view.exact.peek([op(clock, key)])
                if counted == 2:
                    break
                await asyncio.sleep(0.01)
            return counted
        finally:
            await view.close()
            await backend.close()

    assert run(scenario) == 2
