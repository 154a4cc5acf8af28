"""Sliding-window counters in process memory: the embedded store, and the reference for the
Redis one."""

from __future__ import annotations

from collections import OrderedDict

from ferryman.algorithms.sliding_window.model import SlidingResult, SlidingState, decide
from ferryman.core.memory_cap import MemoryCap, forget_oldest

__all__ = ["MemorySlidingWindows"]


class MemorySlidingWindows:
    """Keys in least recently used order; a key two windows old at the front is dropped
    (its counts no longer matter). Keys count against the memory backend's cap: to make
    room the least recently used go first. Every call runs without awaiting, hence
    atomically."""

    name = "memory"

    def __init__(self, cap: MemoryCap | None = None) -> None:
        self._keys: OrderedDict[str, tuple[int, SlidingState]] = OrderedDict()
        self.cap = MemoryCap() if cap is None else cap
        self.cap.join("sliding_window", self)

    def make_room(self, want: int) -> int:
        return forget_oldest(self._keys, want)

    def __len__(self) -> int:
        return len(self._keys)

    async def hit(
        self, key: str, limit: int, window_us: int, hits: int, now: float
    ) -> SlidingResult:
        return self.hit_at(key, limit, window_us, hits, round(now * 1e6))

    def hit_at(self, key: str, limit: int, window_us: int, hits: int, now_us: int) -> SlidingResult:
        keys = self._keys
        for _ in range(2):
            if not keys:
                break
            first = next(iter(keys))
            length, old = keys[first]
            if first == key or old.start > now_us - 2 * length:
                break
            del keys[first]
        found = keys.get(key)
        result, state = decide(None if found is None else found[1], limit, window_us, hits, now_us)
        if state.previous or state.current:
            if found is None and self.cap.max_keys and not self.cap.admit(self):
                return SlidingResult(False, float(limit), result.left_us)  # no room
            keys[key] = (window_us, state)
            keys.move_to_end(key)
        else:
            keys.pop(key, None)
        return result

    async def peek(self, key: str, limit: int, window_us: int, now: float) -> SlidingResult:
        found = self._keys.get(key)  # decide() builds new states: the kept one is untouched
        state = None if found is None else found[1]
        return decide(state, limit, window_us, 0, round(now * 1e6))[0]

    async def reset(self, key: str) -> int:
        return 0 if self._keys.pop(key, None) is None else 1

    def clear(self) -> None:
        self._keys.clear()
