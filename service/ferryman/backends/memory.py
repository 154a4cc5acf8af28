"""The embedded default backend: every algorithm's state in this process."""

from __future__ import annotations

from ferryman.algorithms.burst.memory import MemoryBursts
from ferryman.algorithms.copies.memory import MemoryCopies
from ferryman.algorithms.fixed_window.memory import MemoryFixedWindows
from ferryman.algorithms.sliding_window.memory import MemorySlidingWindows
from ferryman.algorithms.token_bucket.memory import MemoryNodeBuckets
from ferryman.clock import Clock, SystemClock

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """Counters, burst tiers, held copies, node token buckets and sliding windows in this
    process; nothing to connect to."""

    name = "memory"

    def __init__(self, clock: Clock | None = None, max_keys: int = 0) -> None:
        clock = clock or SystemClock()
        self.windows = MemoryFixedWindows(clock, max_keys)
        self.bursts = MemoryBursts(clock)
        self.copies = MemoryCopies(clock)
        self.buckets = MemoryNodeBuckets(clock)
        self.sliding = MemorySlidingWindows()

    async def start(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        self.windows.clear()
        self.bursts.clear()
        self.buckets.clear()
        self.sliding.clear()
