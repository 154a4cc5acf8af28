"""Burst tiers decide identically in memory and in Redis's Lua script."""

from __future__ import annotations

import asyncio
import math
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman.backends.base import BurstRequest
from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import RedisBackend
from ferryman.clock import ManualClock
from ferryman.limits.burst import BurstOutcome, BurstPolicy, Tier

from helpers.bursts import trace_strategy
from helpers.redis_procs import RedisCluster, RedisProcess
from helpers.stores import redis_backend

COOKBOOK = {
    "simple": BurstPolicy((Tier(5, 1.0, 3600.0),)),
    "penalty": BurstPolicy((Tier(5, 1.0, 3600.0), Tier(50, 1.0, 5.0, 15.0))),
    "prison": BurstPolicy((Tier(5, 1.0, 3600.0), Tier(1, 15.0, 15.0))),
    "batch": BurstPolicy((Tier(5000, 300.0, 300.0, 86100.0),)),
    "hard_global": BurstPolicy((Tier(100, 1.0, 100.0),), hard_limit=3, global_limit=4),
}


def replay(
    backend: MemoryBackend | RedisBackend,
    policy: BurstPolicy,
    trace: list[tuple[str, float, int, int]],
    node: str,
) -> list[BurstOutcome]:
    async def main() -> list[BurstOutcome]:
        await backend.start()
        out = []
        now = 1_700_000_000.0
        try:
            for tenant, step, copies, min_copies in trace:
                now += step
                request = BurstRequest(node, tenant, policy, copies, min(min_copies, copies))
                out.append(await backend.burst(request, now))
        finally:
            if isinstance(backend, RedisBackend):
                await backend.close()
        return out

    return asyncio.run(main())


def same(a: BurstOutcome, b: BurstOutcome) -> bool:
    if math.isinf(a.retry_after) or math.isinf(b.retry_after):
        return a == b
    return a == b


@pytest.fixture(params=["redis", "cluster"])
def redis_url(
    request: pytest.FixtureRequest,
) -> str:
    if request.param == "redis":
        server: RedisProcess = request.getfixturevalue("redis_server")
        return server.url
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return cluster.url


@pytest.mark.parametrize("name", sorted(COOKBOOK))
def test_cookbook_traces_match_between_memory_and_redis(redis_url: str, name: str) -> None:
    """A fixed trace over each cookbook config gives identical outcomes on both backends."""
    policy = COOKBOOK[name]
    trace = [("a", 0.0, 3, 1)] * 3 + [("b", 0.2, 2, 2), ("a", 0.5, 1, 1), ("a", 2.0, 6, 1)]
    trace += [("a", 20.0, 1, 1), ("b", 301.0, 5000, 1), ("a", 86100.0, 10, 10)]
    node = f"n{uuid.uuid4().hex[:10]}"
    memory = replay(MemoryBackend(ManualClock(0.0)), policy, trace, node)
    redis_ = replay(redis_backend(redis_url, pool_size=4, server_time=False), policy, trace, node)
    assert memory == redis_
    assert any(o.granted for o in memory)


tiers_strategy = st.lists(
    st.builds(
        Tier,
        limit=st.integers(0, 4),
        window=st.sampled_from([0.5, 1.0, 2.0, 5.0]),
        active=st.sampled_from([1.0, 3.0, 10.0, 30.0]),
        cooldown=st.sampled_from([0.0, 2.0, 7.0]),
        skippable=st.booleans(),
    ),
    max_size=3,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tiers=tiers_strategy,
    hard=st.one_of(st.none(), st.integers(0, 6)),
    glob=st.one_of(st.none(), st.integers(0, 8)),
    trace=trace_strategy,
)
def test_random_traces_match_between_memory_and_redis(
    redis_server: RedisProcess,
    tiers: list[Tier],
    hard: int | None,
    glob: int | None,
    trace: list[tuple[str, float, int, int]],
) -> None:
    """Random configs and traces: Redis's script and the memory backend agree on every field."""
    policy = BurstPolicy(tuple(tiers), hard, glob)
    node = f"n{uuid.uuid4().hex[:10]}"
    memory = replay(MemoryBackend(ManualClock(0.0)), policy, trace, node)
    redis_ = replay(
        redis_backend(redis_server.url, pool_size=4, server_time=False), policy, trace, node
    )
    assert memory == redis_


def test_redis_burst_state_lives_in_one_cluster_slot(redis_cluster: RedisCluster) -> None:
    """All keys of a node share one hash tag, so a multi-key script runs on a Cluster."""
    policy = COOKBOOK["penalty"]
    node = f"n{uuid.uuid4().hex[:10]}"
    outcomes = replay(
        redis_backend(redis_cluster.url, pool_size=4, server_time=False),
        policy,
        [("a", 0.0, 8, 8)],
        node,
    )
    assert outcomes[0].granted == 8
    assert outcomes[0].burst


def test_memory_forgets_idle_tenants() -> None:
    """Burst state of a tenant is dropped once its tiers can no longer matter."""
    backend = MemoryBackend(ManualClock(0.0))
    policy = BurstPolicy((Tier(5, 1.0, 10.0, 5.0),))
    for i in range(100):
        backend.burst_now(BurstRequest("node", f"t{i}", policy, 1, 1), 0.0)
    assert backend.burst_tenants == 100
    backend.burst_now(BurstRequest("node", "late", policy, 1, 1), 16.0)
    assert backend.burst_tenants == 1


def test_memory_keeps_one_expiry_entry_per_tenant_not_per_grant() -> None:
    """Thousands of grants to a few tenants leave a handful of expiry entries, not thousands."""
    backend = MemoryBackend(ManualClock(0.0))
    policy = BurstPolicy((Tier(10**6, 1.0, 3600.0),))
    for i in range(5000):
        backend.burst_now(BurstRequest("node", f"t{i % 3}", policy, 1, 1), i * 0.01)
    assert backend.burst_tenants == 3
    assert len(backend._burst_heap) == 3
    # Past the horizon they all go, heap entries included.
    backend.burst_now(BurstRequest("node", "late", policy, 1, 1), 50 + 3601.0)
    assert backend.burst_tenants == 1
    assert len(backend._burst_heap) == 1
