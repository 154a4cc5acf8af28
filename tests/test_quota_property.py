"""Memory and Redis (single and Cluster) give identical answers for random sequences of takes."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman.algorithms.token_bucket.memory import MemoryTokenBucketStore
from ferryman.algorithms.token_bucket.model import BucketRef, BucketSpec, TakeResult
from ferryman.algorithms.token_bucket.redis import RedisTokenBucketStore
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import ManualClock

from helpers.redis_procs import RedisCluster, RedisProcess

START_US = 1_700_006_400_000_000

specs = st.builds(
    BucketSpec,
    size=st.integers(0, 20),
    fill_rate=st.sampled_from([0.0, 0.3, 1.0, 2.5, 7.0, 10.0, 1000.0]),
    wait_timeout_millis=st.integers(0, 3000),
    max_debt_millis=st.integers(0, 5000),
    max_tokens_per_request=st.one_of(st.none(), st.integers(1, 25).map(float)),
    max_idle_millis=st.sampled_from([-1, 0, 1, 500, 2000]),
)
# (bucket name, tokens, allowed wait in ms, microseconds since the previous take)
takes = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(1, 30),
        st.integers(0, 4000),
        st.one_of(st.integers(0, 3), st.integers(0, 3_000_000)),
    ),
    min_size=1,
    max_size=40,
)


@pytest.fixture(params=["redis", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    server: RedisProcess | RedisCluster = request.getfixturevalue(
        "redis_server" if request.param == "redis" else "redis_cluster"
    )
    return server.url


def replay_memory(
    spec: BucketSpec, dynamic: bool, limit: int, trace: list[tuple[str, int, int, int]]
) -> list[TakeResult]:
    store = MemoryTokenBucketStore(ManualClock())
    now, out = START_US, []
    for name, tokens, wait, step in trace:
        now += step
        ref = BucketRef("ns", name, dynamic, limit)
        out.append(store.take_at(ref, spec, tokens, wait, now))
    return out


def replay_redis(
    url: str, spec: BucketSpec, dynamic: bool, limit: int, trace: list[tuple[str, int, int, int]]
) -> list[TakeResult]:
    async def main() -> list[TakeResult]:
        backend = RedisBackend(parse_backend_url(url, pool_size=4, timeout=5.0))
        await backend.start()
        store = RedisTokenBucketStore(backend.connection, prefix=f"p{uuid.uuid4().hex[:10]}_")
        now, out = START_US, []
        try:
            for name, tokens, wait, step in trace:
                now += step
                ref = BucketRef("ns", name, dynamic, limit)
                out.append(await store.take_at(ref, spec, tokens, wait, str(now)))
        finally:
            await backend.close()
        return out

    return asyncio.run(main())


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    spec=specs,
    dynamic=st.booleans(),
    limit=st.integers(0, 3),
    trace=takes,
)
def test_memory_and_redis_decide_identically(
    redis_url: str,
    spec: BucketSpec,
    dynamic: bool,
    limit: int,
    trace: list[tuple[str, int, int, int]],
) -> None:
    """TakeStatus, wait, bucket creation and idle removals agree take by take."""
    assert replay_redis(redis_url, spec, dynamic, limit, trace) == replay_memory(
        spec, dynamic, limit, trace
    )


def test_replay_sees_waits_and_refusals(redis_url: str) -> None:
    """A fixed trace exercises wait, timeout, debt and removal on both (guards the property)."""
    spec = BucketSpec(2, 1.0, 1000, 2500, max_tokens_per_request=2.0, max_idle_millis=500)
    trace = [("a", 2, 1000, 0), ("a", 1, 1000, 0), ("a", 1, 1000, 0), ("a", 1, 1000, 0)]
    trace += [("b", 1, 1000, 600_000), ("a", 2, 1000, 0)]
    memory = replay_memory(spec, True, 2, trace)
    assert [(r.status.name, r.wait_millis, r.created, r.removed) for r in memory] == [
        ("OK", 0, True, ()),
        ("OK", 0, False, ()),
        ("OK", 1000, False, ()),
        ("REJECTED_TIMEOUT", 0, False, ()),
        ("OK", 0, True, ("a",)),
        ("OK", 0, True, ()),
    ]
    assert replay_redis(redis_url, spec, True, 2, trace) == memory
