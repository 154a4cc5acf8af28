"""Fixed-window counters in this process, dropped when their window ends, and capped.

With ``max_keys`` set (``MEMORY_MAX_KEYS``), a new counter that would pass the cap first
makes room: counters whose windows end soonest go first (they are forgotten soonest
anyway), but a counter that has reached its limit is never evicted, since forgetting it
would let its caller in again (a client could reset its own limit by sending many distinct
values). If only such counters are left, the new counter is not stored and its request is
answered over the limit. Both are counted.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Sequence

from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult, over_limit
from ferryman.clock import Clock

__all__ = ["EVICTED", "REFUSED", "MemoryFixedWindows"]

EVICTED = "ratelimit.service.memory.evicted_keys"
REFUSED = "ratelimit.service.memory.refused_keys"
# Room made at once when the cap is reached, so that one scan serves many new counters.
_EVICT_FRACTION = 64


class MemoryFixedWindows:
    """Counters in a dict, with expiry buckets so memory tracks live windows only.

    All work happens under one lock with no awaits, so each call is atomic for concurrent
    requests whether they come from one event loop or several threads.
    """

    def __init__(self, clock: Clock, max_keys: int = 0) -> None:
        self._clock = clock
        self.max_keys = max_keys  # 0: no cap
        self._counts: dict[str, tuple[int, int, int]] = {}  # key -> (count, expires_at, limit)
        self._buckets: dict[int, list[str]] = {}
        self._heap: list[int] = []
        self._lock = threading.Lock()
        self.evicted = 0
        self.refused = 0
        # Where evictions and refusals are counted (the service's Stats.inc).
        self.report: Callable[[str, int], None] | None = None

    def __len__(self) -> int:
        return len(self._counts)

    def _sweep(self, now: float) -> None:
        heap, buckets, counts = self._heap, self._buckets, self._counts
        while heap and heap[0] <= now:
            at = heapq.heappop(heap)
            for key in buckets.pop(at, ()):
                entry = counts.get(key)
                if entry is not None and entry[1] <= now:
                    del counts[key]

    def _current(self, key: str, now: float) -> int:
        entry = self._counts.get(key)
        if entry is None or entry[1] <= now:
            return 0
        return entry[0]

    def _make_room(self) -> bool:
        """Evict counters below their limit, soonest window end first; False if none is."""
        want = max(1, self.max_keys // _EVICT_FRACTION)
        counts, evicted = self._counts, 0
        for at in sorted(self._heap):
            bucket = self._buckets.get(at)
            if not bucket:
                continue
            kept = []
            for key in bucket:
                entry = counts.get(key)
                if entry is None or entry[1] != at:
                    continue  # already gone, or stored again under another window end
                if evicted < want and entry[0] < entry[2]:
                    del counts[key]
                    evicted += 1
                else:
                    kept.append(key)
            self._buckets[at] = kept
            if evicted >= want:
                break
        if evicted:
            self.evicted += evicted
            if self.report is not None:
                self.report(EVICTED, evicted)
        return evicted > 0

    def _admit(self, op: CounterOp) -> bool:
        """Whether a new counter may be stored (making room if the cap is reached)."""
        if not self.max_keys or len(self._counts) < self.max_keys or self._make_room():
            return True
        self.refused += 1
        if self.report is not None:
            self.report(REFUSED, 1)
        return False

    def _file(self, key: str, expires_at: int) -> None:
        """Note a new counter under the end of its window, for the sweep."""
        bucket = self._buckets.get(expires_at)
        if bucket is None:
            bucket = self._buckets[expires_at] = []
            heapq.heappush(self._heap, expires_at)
        bucket.append(key)

    #: :meth:`apply` never waits: the engine may call :meth:`apply_now` instead.
    at_once = True

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        return self.apply_now(ops, stop_when_over=stop_when_over)

    def apply_now(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        """The synchronous core of :meth:`apply`."""
        with self._lock:
            now = self._clock.now()
            heap = self._heap
            if heap and heap[0] <= now:
                self._sweep(now)
            counts = self._counts
            values: dict[str, int] = {}  # counters this call has set, by key
            skip: set[int] = set()
            if stop_when_over:
                over = over_limit(ops, [self._current(op.key, now) for op in ops])
                if over:
                    skip = set(range(len(ops))) - over
            results: list[CounterResult] = []
            for i, op in enumerate(ops):
                key = op.key
                if key in values:
                    before, new = values[key], False
                else:
                    entry = counts.get(key)
                    if entry is None:
                        before, new = 0, True
                    else:
                        before, new = (0 if entry[1] <= now else entry[0]), False
                if op.hits == 0 or (skip and i in skip):
                    results.append(CounterResult(before, 0))
                    continue
                if op.hits > 0 and new and not self._admit(op):
                    # No room, and nothing safe to forget: over the limit, not counted.
                    results.append(CounterResult(op.limit + op.hits, 0))
                    continue
                value = max(0, before + op.hits)
                values[key] = value
                if value or not new:  # hits given back to no counter leave none behind
                    if key not in counts:
                        self._file(key, op.expires_at)
                    counts[key] = (value, op.expires_at, op.limit)
                results.append(CounterResult(value, value - before))
            return results

    async def peek(self, ops: Sequence[CounterOp]) -> list[int]:
        with self._lock:
            now = self._clock.now()
            return [self._current(op.key, now) for op in ops]

    async def reset(self, ops: Sequence[CounterOp]) -> int:
        # The key's expiry bucket keeps its name; the sweep skips keys no longer held.
        with self._lock:
            return sum(self._counts.pop(op.key, None) is not None for op in ops)

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()
            self._buckets.clear()
            self._heap.clear()
