"""Every Redis store decides exactly as the memory store does: fixed traces and random ones,
for fixed windows (through the engine), burst tiers and held copies."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman.algorithms.burst.model import BurstPolicy, Tier
from ferryman.backends.base import Backend
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.config.reloader import ConfigHolder
from ferryman.core.rules import Unit, UnitLimit
from ferryman.engine import DescriptorRequest, EngineOptions, RateLimitEngine
from ferryman.stats import Stats

from helpers.bursts import COOKBOOK, Trace, replay_burst, tier_lists, trace_strategy
from helpers.copies import CopyNode, Step, copy_steps, replay_copies
from helpers.server import EPOCH
from helpers.stores import Store, memory_store, on_stores

# The store fixture lives for one test, across all of its examples; every example keeps to
# keys (prefix, node) of its own.
EXAMPLES = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

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
    DescriptorRequest((("o", "1"),), limit=UnitLimit(4, Unit.MINUTE)),
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


async def replay(backend: Backend, scenario: Scenario) -> None:
    """Run the scenario on a memory engine and one on ``backend``, demanding equal answers."""
    clock = ManualClock(EPOCH + scenario.start)
    options = EngineOptions(
        stop_when_over=scenario.stop_when_over,
        cache_key_prefix=f"p{uuid.uuid4().hex[:12]}_",
        local_cache_bytes=scenario.local_cache_bytes,
        headers=True,
    )
    memory_stats, redis_stats = Stats(), Stats()
    memory = RateLimitEngine(HOLDER, MemoryBackend(clock), clock, memory_stats, options)
    on_redis = RateLimitEngine(HOLDER, backend, clock, redis_stats, options)
    for n, step in enumerate(scenario.steps):
        if isinstance(step, float):
            clock.advance(step)
            continue
        want = await memory.should_rate_limit("prop", step.descriptors, step.hits)
        got = await on_redis.should_rate_limit("prop", step.descriptors, step.hits)
        assert got == want, f"step {n}: {step}"
    assert redis_stats.snapshot() == memory_stats.snapshot()


@on_stores("redis", "cluster")
@settings(EXAMPLES, max_examples=50)
@given(scenario=scenarios)
def test_fixed_windows_decide_exactly_as_memory(store: Store, scenario: Scenario) -> None:
    """Random requests, hits, refunds and clock moves give equal Decisions on memory and
    Redis; on a Cluster one request's counters span several slots."""
    store.run(replay(store.backend, scenario))


@on_stores("redis", "cluster")
@pytest.mark.parametrize("name", sorted(COOKBOOK))
def test_cookbook_burst_traces_match_memory(store: Store, clock: ManualClock, name: str) -> None:
    """A fixed trace over each cookbook config gives identical outcomes on both stores."""
    policy = COOKBOOK[name]
    trace = [("a", 0.0, 3, 1)] * 3 + [("b", 0.2, 2, 2), ("a", 0.5, 1, 1), ("a", 2.0, 6, 1)]
    trace += [("a", 20.0, 1, 1), ("b", 301.0, 5000, 1), ("a", 86100.0, 10, 10)]
    node = f"n{uuid.uuid4().hex[:10]}"
    with memory_store(clock) as reference:
        memory = replay_burst(reference, policy, trace, node)
    assert replay_burst(store, policy, trace, node) == memory
    assert any(o.granted for o in memory)


tiers_strategy = tier_lists([0.5, 1.0, 2.0, 5.0])


@on_stores("redis")
@settings(EXAMPLES, max_examples=40)
@given(
    tiers=tiers_strategy,
    hard=st.one_of(st.none(), st.integers(0, 6)),
    glob=st.one_of(st.none(), st.integers(0, 8)),
    trace=trace_strategy,
)
def test_random_burst_traces_match_memory(
    store: Store, tiers: list[Tier], hard: int | None, glob: int | None, trace: Trace
) -> None:
    """Random configs and traces: Redis's script and the memory store agree on every field."""
    policy = BurstPolicy(tuple(tiers), hard, glob)
    node = f"n{uuid.uuid4().hex[:10]}"
    with memory_store(ManualClock(0.0)) as reference:
        memory = replay_burst(reference, policy, trace, node)
    assert replay_burst(store, policy, trace, node) == memory


@on_stores("redis")
@settings(EXAMPLES, max_examples=60)
@given(steps=copy_steps)
def test_random_copy_operations_agree_and_keep_counts_in_bounds(
    store: Store, steps: list[Step]
) -> None:
    """Random interleavings across two servers: same answers and counts on both stores."""
    with memory_store(ManualClock(0.0)) as reference:
        assert replay_copies(CopyNode(reference), steps) == replay_copies(CopyNode(store), steps)
