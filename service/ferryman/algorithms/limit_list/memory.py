"""Nodes' limits in process memory: the embedded store, and the reference for Redis's."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ferryman.algorithms.limit_list.model import Checked, Part, decide_all

__all__ = ["MemoryLimits"]


class MemoryLimits:
    """Keys in least recently used order, at most ``max_keys`` (0: no cap; the oldest goes
    first); a key whose states no longer matter at the front is dropped as calls come."""

    name = "memory"

    def __init__(self, max_keys: int = 0) -> None:
        self._keys: OrderedDict[str, tuple[float, dict[str, tuple[float, ...]]]] = OrderedDict()
        self._max = max_keys

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
            keys[key] = (now_us + keep_us, {**saved, **kept})
            keys.move_to_end(key)
            if self._max and len(keys) > self._max:
                keys.popitem(last=False)
        return checked

    async def reset(self, key: str) -> int:
        return 0 if self._keys.pop(key, None) is None else 1

    def clear(self) -> None:
        self._keys.clear()
