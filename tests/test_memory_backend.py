"""The memory backend: atomic multi-counter updates, bounded memory, thread safety."""

from __future__ import annotations

import asyncio
import threading

from ferryman.algorithms.fixed_window.model import CounterOp
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock


def op(key: str, hits: int = 1, limit: int = 10, expires_at: int = 60) -> CounterOp:
    return CounterOp(key, hits, limit, expires_at, 60)


def test_expired_windows_are_dropped_so_memory_tracks_live_windows() -> None:
    """After 100 windows of 100 keys each, only the current window's keys remain."""
    clock = ManualClock(0.0)
    backend = MemoryBackend(clock)
    for window in range(100):
        clock.set(window * 60.0)
        end = (window + 1) * 60
        backend.windows.apply_now(
            [op(f"k{i}_{window * 60}", expires_at=end) for i in range(100)], stop_when_over=False
        )
        assert len(backend.windows) <= 100
    assert len(backend.windows) == 100


def test_counts_accumulate_and_never_go_below_zero() -> None:
    """Hits add up within a window; a refund larger than the count stops at zero."""
    backend = MemoryBackend(ManualClock(0.0))
    assert backend.windows.apply_now([op("a", 3)], stop_when_over=False)[0].after == 3
    assert backend.windows.apply_now([op("a", 4)], stop_when_over=False)[0].after == 7
    refund = backend.windows.apply_now([op("a", -10)], stop_when_over=False)[0]
    assert (refund.after, refund.applied) == (0, -7)


def test_a_window_that_ended_reads_as_zero_even_before_it_is_swept() -> None:
    """A counter past its expiry counts from zero again."""
    clock = ManualClock(0.0)
    backend = MemoryBackend(clock)
    backend.windows.apply_now([op("a", 5, expires_at=60)], stop_when_over=False)
    clock.set(60.0)
    assert (
        backend.windows.apply_now([op("a", 1, expires_at=120)], stop_when_over=False)[0].after == 1
    )


def test_stop_when_over_applies_only_the_over_counters() -> None:
    """With stop_when_over, an over counter is incremented and the others are left alone."""
    backend = MemoryBackend(ManualClock(0.0))
    backend.windows.apply_now(
        [op("tight", 1, limit=1), op("broad", 1, limit=5)], stop_when_over=True
    )
    results = backend.windows.apply_now(
        [op("tight", 1, limit=1), op("broad", 1, limit=5)], stop_when_over=True
    )
    assert [(r.after, r.applied) for r in results] == [(2, 1), (1, 0)]


def test_the_same_key_twice_in_one_call_counts_both() -> None:
    """Two ops on one counter in one call see each other's hits."""
    backend = MemoryBackend(ManualClock(0.0))
    results = backend.windows.apply_now([op("a", 2), op("a", 3)], stop_when_over=False)
    assert [r.after for r in results] == [2, 5]


def test_concurrent_threads_lose_no_hits() -> None:
    """8 threads x 2000 increments of one counter add up exactly."""
    backend = MemoryBackend(ManualClock(0.0))

    def work() -> None:
        for _ in range(2000):
            backend.windows.apply_now([op("shared", 1, limit=10**9)], stop_when_over=False)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert backend.windows.apply_now([op("shared", 0)], stop_when_over=False)[0].after == 16000


def test_concurrent_coroutines_lose_no_hits() -> None:
    """1000 concurrent fixed_window calls on one loop add up exactly."""
    backend = MemoryBackend(ManualClock(0.0))

    async def main() -> int:
        await asyncio.gather(
            *(
                backend.windows.apply([op("c", 1, limit=10**9)], stop_when_over=False)
                for _ in range(1000)
            )
        )
        return (await backend.windows.apply([op("c", 0)], stop_when_over=False))[0].after

    assert asyncio.run(main()) == 1000
