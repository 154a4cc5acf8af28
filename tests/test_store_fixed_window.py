"""Fixed-window counters: one body per behaviour, on every store."""

from __future__ import annotations

import asyncio

from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult, FixedWindowStore
from ferryman.backends.memory import MemoryBackend

from helpers.stores import Store, on_stores

pytestmark = on_stores()


def op(store: Store, key: str, hits: int = 1, limit: int = 10) -> CounterOp:
    """An op on this test's counter ``key`` in a minute window that starts now."""
    return CounterOp(store.prefix + key, hits, limit, int(store.clock.now()) + 60, 60)


def apply(store: Store, *ops: CounterOp, stop_when_over: bool = False) -> list[CounterResult]:
    return store.run(store.backend.store("fixed_window").apply(ops, stop_when_over=stop_when_over))


def test_counts_accumulate_and_never_go_below_zero(store: Store) -> None:
    """Hits add up within a window; a refund larger than the count stops at zero."""
    assert apply(store, op(store, "a", 3))[0].after == 3
    assert apply(store, op(store, "a", 4))[0].after == 7
    refund = apply(store, op(store, "a", -10))[0]
    assert (refund.after, refund.applied) == (0, -7)


def test_stop_when_over_applies_only_the_over_counters(store: Store) -> None:
    """With stop_when_over, an over counter is incremented and the others are left alone
    (on a Cluster the two counters may live on different nodes)."""
    ops = (op(store, "tight", 1, limit=1), op(store, "broad", 1, limit=5))
    apply(store, *ops, stop_when_over=True)
    results = apply(store, *ops, stop_when_over=True)
    assert [(r.after, r.applied) for r in results] == [(2, 1), (1, 0)]


def test_the_same_key_twice_in_one_call_counts_both(store: Store) -> None:
    """Two ops on one counter in one call see each other's hits."""
    results = apply(store, op(store, "a", 2), op(store, "a", 3))
    assert [r.after for r in results] == [2, 5]


def test_a_counter_is_kept_for_its_window(store: Store) -> None:
    """A counter lives until its window ends: memory keeps it to ``expires_at``, Redis sets
    the window's length as the key's TTL."""
    counter = op(store, "a", 1)
    apply(store, counter)
    if isinstance(store.backend, MemoryBackend):
        left = store.backend.store("fixed_window")._counts[counter.key][1] - store.clock.now()
    else:
        with store.redis() as client:
            left = client.ttl(counter.key)
    assert 0 < left <= 60


def test_concurrent_coroutines_lose_no_hits(store: Store) -> None:
    """1000 concurrent fixed_window calls on one loop add up exactly."""
    windows: FixedWindowStore = store.backend.store("fixed_window")

    async def main() -> int:
        await asyncio.gather(
            *(
                windows.apply([op(store, "c", 1, limit=10**9)], stop_when_over=False)
                for _ in range(1000)
            )
        )
        return (await windows.apply([op(store, "c", 0)], stop_when_over=False))[0].after

    assert store.run(main()) == 1000
