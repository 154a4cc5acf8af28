"""RateLimiter over capacity leases: two real processes share one FAIR_SHARE resource, fall
back to their own modes when the root is gone, and converge again when it is back."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferryman.client import AsyncCapacityClient, CapacityClient, Gauge, RateLimiter

from helpers.capacity import Fleet
from helpers.leased import LeasedWorker, per_second
from helpers.server import ConfigDir, wait_for

RESOURCES = """
resources:
  - identifier_glob: fair*
    capacity: 100
    safe_capacity: 20
    algorithm: {kind: FAIR_SHARE, lease_length: 3, refresh_interval: 1,
                learning_mode_duration: 0}
"""


@pytest.fixture
def fleet(tmp_path: Path, config_dir: ConfigDir) -> Iterator[Fleet]:
    config_dir.write("resources.yaml", RESOURCES)
    fleet = Fleet(tmp_path / "procs", config_dir.path)
    yield fleet
    fleet.close()


@pytest.fixture
def workers() -> Iterator[list[LeasedWorker]]:
    made: list[LeasedWorker] = []
    yield made
    for worker in made:
        worker.stop()


def _converged(workers: list[LeasedWorker]) -> bool:
    return [w.last() for w in workers] == [(70.0, "lease"), (30.0, "lease")]


def _check_split(workers: list[LeasedWorker], seconds: int) -> None:
    start = int(time.time()) + 1
    time.sleep(seconds + 1.5)
    big, small = per_second(workers, range(start, start + seconds))
    for a, b in zip(big, small, strict=True):
        assert 63 <= a <= 77, (big, small)
        assert 27 <= b <= 33, (big, small)
        assert a + b <= 110, (big, small)


def test_two_processes_split_a_fair_share_and_fall_back_to_their_modes(
    fleet: Fleet, workers: list[LeasedWorker]
) -> None:
    """Demands of 150/s and 30/s on 100/s settle on 70/s and 30/s, never above 110 in a
    second; with the root killed each keeps its lease until it ends and then takes its
    fallback (safe: 20; pessimistic: 0); with the root back they converge again."""
    root = fleet.server()
    workers.append(LeasedWorker(root.address, "fair", 150, "safe"))
    workers.append(LeasedWorker(root.address, "fair", 30, "pessimistic"))
    wait_for("70/s and 30/s", lambda: _converged(workers), timeout=20)
    _check_split(workers, 3)

    port = root.grpc_port
    killed = time.time()
    root.kill()
    wait_for(
        "the fallbacks",
        lambda: [w.last() for w in workers] == [(20.0, "safe"), (0.0, "pessimistic")],
        timeout=10,
    )
    # Each kept a lease that outlived the root, and fell back only once it had expired.
    for worker in workers:
        assert worker.expiry > killed, (worker.expiry, killed)
        assert worker.fell_back_at >= worker.expiry - 0.05, (worker.fell_back_at, worker.expiry)
    fleet.servers.append(fleet.server("--grpc-port", str(port)))
    wait_for("converged again", lambda: _converged(workers), timeout=20)
    _check_split(workers, 2)


def test_rate_limiter_spacing_follows_the_lease(fleet: Fleet) -> None:
    """A limiter on a 100/s lease gives about 100 permits in a second, spaced, not bursted;
    a client's stats count refreshes and the resource's capacity."""
    root = fleet.server()
    with CapacityClient(root.address) as client:
        resource = client.resource("fair", 100)
        wait_for("a lease", lambda: resource.capacity == 100, timeout=10)
        limiter = RateLimiter(resource)
        start = time.monotonic()
        for _ in range(50):
            limiter.wait()
        assert 0.45 <= time.monotonic() - start <= 0.75
        assert not limiter.try_acquire()  # the next permit is 10 ms away
        stats = client.stats()
        assert stats.refreshes >= 1
        assert stats.capacity == {"fair": 100.0}
        assert stats.mode == {"fair": "lease"}


def test_fallback_modes_and_counters_without_a_server(tmp_path: Path) -> None:
    """With no server at all: optimistic gives what is wanted, pessimistic 0, safe 0 until a
    server has named a safe capacity; failures are counted and a limiter at 0 admits nothing."""
    with CapacityClient("127.0.0.1:1", timeout=0.2) as client:
        optimistic = client.resource("a", 12, fallback="optimistic")
        pessimistic = client.resource("b", 12, fallback="pessimistic")
        safe = client.resource("c", 12)
        wait_for("a failure", lambda: client.stats().failures >= 1, timeout=5)
        assert (optimistic.capacity, pessimistic.capacity, safe.capacity) == (12, 0, 0)
        optimistic.ask(3)
        assert optimistic.capacity == 3
        assert not RateLimiter(pessimistic).try_acquire()
        with pytest.raises(ValueError, match="fallback"):
            client.resource("d", 1, fallback="hopeful")  # type: ignore[arg-type]


def test_async_client_gauge_and_limiter(fleet: Fleet) -> None:
    """The asyncio client leases like the threaded one; a Gauge holds at most the capacity
    in flight; wait_async spaces permits."""
    root = fleet.server()

    async def scenario() -> tuple[int, float]:
        async with AsyncCapacityClient(root.address) as client:
            resource = client.resource("fair", 4)
            for _ in range(200):
                if resource.capacity == 4:
                    break
                await asyncio.sleep(0.05)
            gauge = Gauge(resource)
            peak = 0

            async def use() -> None:
                nonlocal peak
                async with gauge:
                    peak = max(peak, gauge.in_flight)
                    await asyncio.sleep(0.02)

            await asyncio.gather(*(use() for _ in range(20)))
            limiter = RateLimiter(resource)
            start = time.monotonic()
            for _ in range(4):
                await limiter.wait_async()
            return peak, time.monotonic() - start

    peak, took = asyncio.run(scenario())
    assert peak == 4
    assert 0.7 <= took <= 1.2 or math.isnan(took)
