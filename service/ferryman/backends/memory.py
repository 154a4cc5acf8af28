"""The embedded default backend: every algorithm's state in this process."""

from __future__ import annotations

from ferryman.algorithms.burst.memory import MemoryBursts
from ferryman.algorithms.copies.memory import MemoryCopies
from ferryman.algorithms.fixed_window.memory import MemoryFixedWindows
from ferryman.algorithms.sliding_window.memory import MemorySlidingWindows
from ferryman.algorithms.token_bucket.memory import MemoryNodeBuckets, MemoryTokenBucketStore
from ferryman.algorithms.token_bucket.model import BucketStore
from ferryman.clock import Clock, SystemClock

__all__ = ["InProcessStores", "MemoryBackend"]


class InProcessStores:
    """Every algorithm's store in this process but the fixed window's counters, which each
    backend built on it brings: the memory backend, and backends that keep only counters
    elsewhere (memcache)."""

    def __init__(self, clock: Clock) -> None:
        self.bursts = MemoryBursts(clock)
        self.copies = MemoryCopies(clock)
        self.buckets = MemoryNodeBuckets(clock)
        self.sliding = MemorySlidingWindows()

    def quota_store(self, prefix: str, clock: Clock) -> BucketStore:
        return MemoryTokenBucketStore(clock)

    def clear(self) -> None:
        """Forget every tier log, bucket and window (held copies end with their sessions)."""
        self.bursts.clear()
        self.buckets.clear()
        self.sliding.clear()


class MemoryBackend(InProcessStores):
    """Counters, burst tiers, held copies, node token buckets and sliding windows in this
    process; nothing to connect to."""

    name = "memory"

    def __init__(self, clock: Clock | None = None, max_keys: int = 0) -> None:
        clock = clock or SystemClock()
        super().__init__(clock)
        self.windows = MemoryFixedWindows(clock, max_keys)

    async def start(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        self.windows.clear()
        self.clear()
