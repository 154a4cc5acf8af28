"""What only the memory store does: sweeping what expired, thread safety, bounded burst state.

What every store does is in the conformance suite, tests/test_store_*.py."""

from __future__ import annotations

import threading

from ferryman.algorithms.burst.model import BurstPolicy, BurstRequest, Tier
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
        backend.store("fixed_window").apply_now(
            [op(f"k{i}_{window * 60}", expires_at=end) for i in range(100)], stop_when_over=False
        )
        assert len(backend.store("fixed_window")) <= 100
    assert len(backend.store("fixed_window")) == 100


def test_a_window_that_ended_reads_as_zero_even_before_it_is_swept() -> None:
    """A counter past its expiry counts from zero again."""
    clock = ManualClock(0.0)
    backend = MemoryBackend(clock)
    backend.store("fixed_window").apply_now([op("a", 5, expires_at=60)], stop_when_over=False)
    clock.set(60.0)
    assert (
        backend.store("fixed_window")
        .apply_now([op("a", 1, expires_at=120)], stop_when_over=False)[0]
        .after
        == 1
    )


def test_concurrent_threads_lose_no_hits() -> None:
    """8 threads x 2000 increments of one counter add up exactly."""
    backend = MemoryBackend(ManualClock(0.0))

    def work() -> None:
        for _ in range(2000):
            backend.store("fixed_window").apply_now(
                [op("shared", 1, limit=10**9)], stop_when_over=False
            )

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (
        backend.store("fixed_window").apply_now([op("shared", 0)], stop_when_over=False)[0].after
        == 16000
    )


def test_memory_forgets_idle_tenants() -> None:
    """Burst state of a tenant is dropped once its tiers can no longer matter."""
    backend = MemoryBackend(ManualClock(0.0))
    policy = BurstPolicy((Tier(5, 1.0, 10.0, 5.0),))
    for i in range(100):
        backend.store("burst_tiers").decide_now(BurstRequest("node", f"t{i}", policy, 1, 1), 0.0)
    assert backend.store("burst_tiers").tenants == 100
    backend.store("burst_tiers").decide_now(BurstRequest("node", "late", policy, 1, 1), 16.0)
    assert backend.store("burst_tiers").tenants == 1


def test_memory_keeps_one_expiry_entry_per_tenant_not_per_grant() -> None:
    """Thousands of grants to a few tenants leave a handful of expiry entries, not thousands."""
    backend = MemoryBackend(ManualClock(0.0))
    policy = BurstPolicy((Tier(10**6, 1.0, 3600.0),))
    for i in range(5000):
        backend.store("burst_tiers").decide_now(
            BurstRequest("node", f"t{i % 3}", policy, 1, 1), i * 0.01
        )
    assert backend.store("burst_tiers").tenants == 3
    assert len(backend.store("burst_tiers")._heap) == 3
    # Past the horizon they all go, heap entries included.
    backend.store("burst_tiers").decide_now(BurstRequest("node", "late", policy, 1, 1), 50 + 3601.0)
    assert backend.store("burst_tiers").tenants == 1
    assert len(backend.store("burst_tiers")._heap) == 1
