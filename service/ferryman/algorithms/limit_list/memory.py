"""Nodes' limits in process memory: the embedded store, and the reference for Redis's."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ferryman.algorithms.limit_list.model import Checked, Part, decide_all
from ferryman.core.memory_cap import MemoryCap, forget_oldest

__all__ = ["MemoryLimits"]


class MemoryLimits:
    """Keys in least recently used order, counted against the memory backend's cap (the
    oldest goes first to make room); a key whose states no longer matter at the front is
    dropped as calls come."""

    name = "memory"

    def __init__(self, max_keys: int = 0, cap: MemoryCap | None = None) -> None:
        self._keys: OrderedDict[str, tuple[float, dict[str, tuple[float, ...]]]] = OrderedDict()
        self.cap = MemoryCap(max_keys) if cap is None else cap
        self.cap.join("limit_list", self)

    def make_room(self, want: int) -> int:
        return forget_oldest(self._keys, want)

    def __len__(self) -> int:
        return len(self._keys)

    async def check(self, key: str, parts: Sequence[Part], cost: int, now: float) -> Checked:
        now_us = round(now * 1e6)
        keys = self._keys
        for _ in range(2):
            if not keys:
                break
            first = next(iter(keys))
            if keys[first][0] > now_us or first == key:
                break
            del keys[first]
        found = keys.get(key)
        saved = {} if found is None or found[0] <= now_us else found[1]
        checked, kept, keep_us = decide_all(saved, parts, cost, now_us)
        if kept is not None:
            if found is None and self.cap.max_keys:
                self.cap.admit(self)  # the oldest goes first: the new key is always kept
            keys[key] = (now_us + keep_us, {**saved, **kept})
            keys.move_to_end(key)
        return checked

    async def reset(self, key: str) -> int:
        return 0 if self._keys.pop(key, None) is None else 1

    def clear(self) -> None:
        self._keys.clear()
