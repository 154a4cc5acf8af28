"""GCRA in process memory: the embedded store, and the reference for the Redis one.

A tenant is one TAT. One whose bucket is full again is as good as none, so it is dropped
when found at the front of the least recently used order. Tenants count against the memory
backend's cap (``MEMORY_MAX_KEYS``, shared with every kind: ``core.memory_cap``); a new
tenant that would pass it first makes room: tenants with room for one more request go,
least recently used first (forgetting one gives it at most its
burst back); a tenant with no room left is never forgotten, since that would let it in
again. If only such tenants are left, the new one is not stored and its request is refused.
"""

from __future__ import annotations

from collections import OrderedDict

from ferryman.algorithms.gcra.model import GcraParams, GcraResult, Tat, debt, decide, look
from ferryman.core.memory_cap import MemoryCap, forget_safe

__all__ = ["MemoryGcra"]


class MemoryGcra:
    """TATs by key, least recently used first (each with its limit, to tell whether it may
    be forgotten). Every call runs without awaiting, hence atomically on the event loop."""

    name = "memory"

    def __init__(self, max_keys: int = 0, cap: MemoryCap | None = None) -> None:
        self.cap = MemoryCap(max_keys) if cap is None else cap
        self.cap.join("gcra", self)
        self._tats: OrderedDict[str, tuple[GcraParams, Tat]] = OrderedDict()
        self._now_us = 0  # the last call's time, for making room between calls

    @property
    def evicted(self) -> int:
        return self.cap.evicted

    @property
    def refused(self) -> int:
        return self.cap.refused

    def __len__(self) -> int:
        return len(self._tats)

    async def take(
        self, key: str, params: GcraParams, cost: int, max_wait_us: int, now: float
    ) -> GcraResult:
        return self.take_at(key, params, cost, max_wait_us, round(now * 1_000_000))

    def take_at(
        self, key: str, params: GcraParams, cost: int, max_wait_us: int, now_us: int
    ) -> GcraResult:
        """``take`` at ``now_us`` (microseconds since the epoch)."""
        tats = self._tats
        self._now_us = now_us
        for _ in range(2):  # a little sweeping per call, never a large one
            if not tats:
                break
            first = next(iter(tats))
            old_params, old = tats[first]
            if first == key or debt(old, old_params, now_us) > 0:
                break
            del tats[first]
        found = tats.get(key)
        result, after = decide(
            None if found is None else found[1], params, cost, now_us, max_wait_us
        )
        if after is None:
            return result
        if found is None and self.cap.max_keys and not self.cap.admit(self):
            return GcraResult(False, 0, 0, 0, -1)  # no room, and nothing safe to forget
        tats[key] = (params, after)
        tats.move_to_end(key)
        return result

    def make_room(self, want: int) -> int:
        """Forget up to ``want`` tenants with room for one more request, least recently
        used first."""
        now_us = self._now_us

        def has_room(entry: tuple[GcraParams, Tat]) -> bool:
            params, tat = entry
            return debt(tat, params, now_us) + params.step <= params.span

        return forget_safe(self._tats, want, has_room)

    async def peek(self, key: str, params: GcraParams, now: float) -> GcraResult:
        found = self._tats.get(key)
        return look(None if found is None else found[1], params, round(now * 1_000_000))

    async def reset(self, key: str) -> int:
        return 0 if self._tats.pop(key, None) is None else 1

    def clear(self) -> None:
        self._tats.clear()
