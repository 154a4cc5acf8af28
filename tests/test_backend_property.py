"""Memory and Redis backends give identical decisions for any sequence of requests."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.config.model import RateLimit, Unit
from ferryman.config.reloader import ConfigHolder
from ferryman.limits.engine import DescriptorRequest, EngineOptions, RateLimitEngine
from ferryman.stats import Stats

from helpers.redis_procs import RedisCluster, RedisProcess
from helpers.server import EPOCH
from helpers.stores import redis_backend

# Units of a minute and more only: Redis expires keys in real time while the test clock is
# manual, and a one-second TTL could lapse during a slow example.
CONFIG = """
domain: prop
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: c
    value: x
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: q
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: d
    descriptors:
      - key: e
        rate_limit: {unit: minute, requests_per_unit: 4}
  - key: sh
    value: s*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 6}
"""

HOLDER = ConfigHolder(config=load_sources([("prop.yaml", CONFIG)]))

POOL: tuple[DescriptorRequest, ...] = (
    DescriptorRequest((("a", "1"),)),
    DescriptorRequest((("a", "2"),)),
    DescriptorRequest((("b", "1"),)),
    DescriptorRequest((("c", "x"),)),
    DescriptorRequest((("c", "y"),)),
    DescriptorRequest((("q", "1"),)),
    DescriptorRequest((("d", "1"), ("e", "1"))),
    DescriptorRequest((("sh", "s1"),)),
    DescriptorRequest((("sh", "s2"),)),
    DescriptorRequest((("nomatch", "1"),)),
    DescriptorRequest((("o", "1"),), limit=RateLimit(4, Unit.MINUTE)),
)


@dataclass(frozen=True)
class Request:
    descriptors: tuple[DescriptorRequest, ...]
    hits: int


@dataclass(frozen=True)
class Scenario:
    start: float
    stop_when_over: bool
    local_cache_bytes: int
    steps: tuple[Request | float, ...]  # a float advances the clock by that many seconds


@st.composite
def descriptors(draw: st.DrawFn) -> DescriptorRequest:
    base = draw(st.sampled_from(POOL))
    hits = draw(st.none() | st.integers(0, 5))
    negative = draw(st.integers(0, 6)) == 0
    return DescriptorRequest(base.entries, base.limit, hits, negative)


requests = st.builds(
    Request,
    descriptors=st.lists(descriptors(), min_size=1, max_size=4).map(tuple),
    hits=st.integers(0, 5),
)
advances = st.sampled_from([0.5, 1.0, 7.0, 30.0, 59.0, 60.0, 61.0, 3600.0])
scenarios = st.builds(
    Scenario,
    start=st.integers(0, 3599).map(float) | st.sampled_from([0.0, 59.5, 3599.75]),
    stop_when_over=st.booleans(),
    local_cache_bytes=st.sampled_from([0, 0, 4096]),
    steps=st.lists(requests | advances, min_size=1, max_size=25).map(tuple),
)


async def replay(url: str, scenario: Scenario) -> None:
    """Run the scenario on a memory engine and a Redis engine, demanding equal answers."""
    clock = ManualClock(EPOCH + scenario.start)
    options = EngineOptions(
        stop_when_over=scenario.stop_when_over,
        cache_key_prefix=f"p{uuid.uuid4().hex[:12]}_",
        local_cache_bytes=scenario.local_cache_bytes,
        headers=True,
    )
    memory_stats, redis_stats = Stats(), Stats()
    memory = RateLimitEngine(HOLDER, MemoryBackend(clock), clock, memory_stats, options)
    backend = redis_backend(url, pool_size=4, timeout=5.0)
    await backend.start()
    try:
        on_redis = RateLimitEngine(HOLDER, backend, clock, redis_stats, options)
        for n, step in enumerate(scenario.steps):
            if isinstance(step, float):
                clock.advance(step)
                continue
            want = await memory.should_rate_limit("prop", step.descriptors, step.hits)
            got = await on_redis.should_rate_limit("prop", step.descriptors, step.hits)
            assert got == want, f"step {n}: {step}"
        assert redis_stats.snapshot() == memory_stats.snapshot()
    finally:
        await backend.close()


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios)
def test_single_redis_decides_exactly_as_memory(
    redis_server: RedisProcess, scenario: Scenario
) -> None:
    """Random requests, hits, refunds and clock moves give equal Decisions on memory and Redis."""
    asyncio.run(replay(redis_server.url, scenario))


@settings(max_examples=40, deadline=None)
@given(scenario=scenarios)
def test_redis_cluster_decides_exactly_as_memory(
    redis_cluster: RedisCluster, scenario: Scenario
) -> None:
    """The same holds on a 3-node Cluster, where one request's counters span several slots."""
    asyncio.run(replay(redis_cluster.url, scenario))
