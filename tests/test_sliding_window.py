"""The sliding-window counter: the survey's example, memory and Redis agreeing on random
traces (node token buckets too), and ``sliding_window`` nodes through the real gRPC server
on memory, Redis and a Redis Cluster."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman.algorithms.sliding_window import SlidingWindow
from ferryman.algorithms.sliding_window.model import SlidingState, decide
from ferryman.algorithms.token_bucket.model import BucketSpec
from ferryman.clock import ManualClock
from ferryman.config import load_sources
from ferryman.errors import ConfigError

from helpers.server import EPOCH, ConfigDir, ServerFactory, codes
from helpers.stores import Store, memory_store, on_stores

EXAMPLES = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MINUTE_US = 60_000_000


def test_the_surveys_example_weights_the_previous_window() -> None:
    """10 per minute, 9 in the previous minute, 5 in this one, 15 s in: 9 * 0.75 + 5 = 11.75
    is over, so the hit is refused and not counted."""
    start = 100 * MINUTE_US
    state = SlidingState(start, 9, 5)
    result, after = decide(state, 10, MINUTE_US, 1, start + 15_000_000)
    assert not result.allowed
    assert result.estimate == 11.75
    assert after.current == 5
    # 45 s in the previous minute weighs 9 * 0.25: 2.25 + 5 + 1 fits.
    result, after = decide(state, 10, MINUTE_US, 1, start + 45_000_000)
    assert result.allowed and result.estimate == 8.25 and after.current == 6
    # A minute later the current count is the previous one; two minutes later all is gone.
    result, after = decide(after, 10, MINUTE_US, 0, start + MINUTE_US)
    assert (after.previous, after.current, result.left_us) == (6, 0, MINUTE_US)
    result, after = decide(after, 10, MINUTE_US, 0, start + 3 * MINUTE_US)
    assert (after.previous, after.current, result.estimate) == (0, 0, 0.0)


# (microseconds to advance, key, hits, limit); minutes and more only, as Redis expires keys
# in real time while the test clock is manual.
steps = st.lists(
    st.tuples(
        st.integers(0, 150_000_000), st.sampled_from("ab"), st.integers(0, 4), st.integers(0, 8)
    ),
    min_size=1,
    max_size=30,
)


async def _replay_sliding(
    store: Store, trace: list[tuple[int, str, int, int]], prefix: str, window: int
) -> list[tuple[bool, float, int]]:
    out = []
    now_us = round(EPOCH * 1e6) + 7
    for advance, key, hits, limit in trace:
        now_us += advance
        r = await store.backend.store("sliding_window").hit(
            prefix + key, limit, window * 1_000_000, hits, now_us / 1e6
        )
        out.append((r.allowed, r.estimate, r.left_us))
        # A read (as /explain's) of the other key: the same answer as a hit of none.
        other = "b" if key == "a" else "a"
        r = await store.backend.store("sliding_window").peek(
            prefix + other, limit, window * 1_000_000, now_us / 1e6
        )
        out.append((r.allowed, r.estimate, r.left_us))
    return out


@on_stores("redis", "cluster")
@settings(EXAMPLES, max_examples=40)
@given(trace=steps, window=st.sampled_from([60, 3600]))
def test_random_sliding_traces_agree_with_memory(
    store: Store, trace: list[tuple[int, str, int, int]], window: int
) -> None:
    """Random hits, limits and clock moves: the Lua script and the memory store give the same
    decisions, estimates and times left, bit for bit, and so do their reads."""
    prefix = f"{store.prefix}{uuid.uuid4().hex[:8]}{{sw}}"
    with memory_store(ManualClock(EPOCH)) as reference:
        want = reference.run(_replay_sliding(reference, trace, prefix, window))
    assert store.run(_replay_sliding(store, trace, prefix, window)) == want


async def _replay_buckets(
    store: Store, trace: list[tuple[int, str, int, int]], prefix: str, spec: BucketSpec
) -> list[tuple[int, int, float, float]]:
    out = []
    now_us = round(EPOCH * 1e6) + 3
    for advance, key, hits, wait in trace:
        now_us += advance // 1000  # buckets refill fast: keep to short moves
        # The last field is the wait offered, in tenths of a second.
        r = await store.backend.store("token_bucket").take(
            prefix + key, spec, hits, wait * 100, now_us / 1e6
        )
        out.append((int(r.status), r.wait_millis, r.stored, r.debt_us))
    return out


@on_stores("redis", "cluster")
@settings(EXAMPLES, max_examples=40)
@given(
    trace=steps,
    size=st.integers(1, 6),
    rate=st.sampled_from([0.5, 1.0, 3.0, 40.0]),
    debt=st.sampled_from([0, 500, 3000]),
)
def test_random_node_bucket_traces_agree_with_memory(
    store: Store, trace: list[tuple[int, str, int, int]], size: int, rate: float, debt: int
) -> None:
    """Node token buckets: the same statuses, waits, tokens and debt on both stores."""
    spec = BucketSpec(size=size, fill_rate=rate, max_debt_millis=debt, wait_timeout_millis=0)
    prefix = f"{store.prefix}{uuid.uuid4().hex[:8]}{{tb}}"
    with memory_store(ManualClock(EPOCH)) as reference:
        want = reference.run(_replay_buckets(reference, trace, prefix, spec))
    assert store.run(_replay_buckets(store, trace, prefix, spec)) == want


CONFIG = """
domain: sw
descriptors:
  - key: ip
    sliding_window: {unit: minute, requests_per_unit: 4}
  - key: api
    descriptors:
      - key: user
        sliding_window: {unit: hour, requests_per_unit: 2}
        quota_mode: true
"""


@on_stores()
def test_a_sliding_window_node_smooths_the_window_edge(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """4 per minute: four pass late in a minute; at the start of the next one the previous
    minute still weighs almost fully, so the fixed window's double burst is refused."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 50)
    answers = [server.ask("sw", [("ip", "1.2.3.4")]) for _ in range(5)]
    assert [codes(r)[0] for r in answers] == ["OK"] * 4 + ["OVER_LIMIT"]
    first = answers[0].statuses[0]
    assert first.current_limit.requests_per_unit == 4
    assert [r.statuses[0].limit_remaining for r in answers] == [3, 2, 1, 0, 0]
    assert first.duration_until_reset.seconds == 10
    clock.set(EPOCH + 61)  # 4 * 59/60 = 3.93: no room for a whole hit yet
    assert codes(server.ask("sw", [("ip", "1.2.3.4")])) == ["OVER_LIMIT"]
    clock.set(EPOCH + 76)  # 4 * 0.75 = 3: one more fits
    r = server.ask("sw", [("ip", "1.2.3.4")])
    assert codes(r) == ["OK"] and r.statuses[0].limit_remaining == 0
    assert codes(server.ask("sw", [("ip", "5.6.7.8")])) == ["OK"]
    assert server.stat("ratelimit.service.rate_limit.sw.ip.over_limit") == 2
    assert server.stat("ratelimit.service.rate_limit.sw.ip.within_limit") == 6


def test_sliding_window_yaml_and_its_errors() -> None:
    config = load_sources([("s.yaml", CONFIG)])
    limit = config.domains["sw"].root.rules[0].limit
    assert isinstance(limit, SlidingWindow) and limit.rate.requests_per_unit == 4
    for body, path, message in [
        ("    sliding_window: {unit: fortnight, requests_per_unit: 1}\n", ".unit", "invalid unit"),
        ("    sliding_window: {unit: minute}\n", "", "needs 'requests_per_unit'"),
        ("    sliding_window: {unit: minute, requests_per_unit: 1, x: 1}\n", ".x", "unknown key"),
        (
            "    sliding_window: {unit: minute, requests_per_unit: 1}\n"
            "    token_bucket: {size: 1, fill_rate: 1}\n",
            "",
            "one of rate_limit",
        ),
    ]:
        with pytest.raises(ConfigError) as err:
            load_sources([("b.yaml", "domain: d\ndescriptors:\n  - key: k\n" + body)])
        text = str(err.value)
        assert "b.yaml:4" in text, text
        assert f"descriptors[0].sliding_window{path}" in text, text
        assert message in text
