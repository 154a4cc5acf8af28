"""Fixed-window counters in this process, dropped when their window ends, and capped.

Counters count against the memory backend's cap (``MEMORY_MAX_KEYS``, shared with every
kind: ``core.memory_cap``); a new counter that would pass it first makes room: counters
whose windows end soonest go first (they are forgotten soonest
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
from ferryman.core.memory_cap import EVICTED, REFUSED, MemoryCap

__all__ = ["EVICTED", "REFUSED", "MemoryFixedWindows"]


class MemoryFixedWindows:
    """Counters in a dict, with expiry buckets so memory tracks live windows only.

    All work happens under one lock with no awaits, so each call is atomic for concurrent
    requests whether they come from one event loop or several threads.
    """

    def __init__(self, clock: Clock, max_keys: int = 0, cap: MemoryCap | None = None) -> None:
        self._clock = clock
        self.cap = MemoryCap(max_keys) if cap is None else cap
        self.cap.join("fixed_window", self)
        self._counts: dict[str, tuple[int, int, int]] = {}  # key -> (count, expires_at, limit)
        self._buckets: dict[int, list[str]] = {}
        self._heap: list[int] = []
        self._lock = threading.Lock()

    @property
    def max_keys(self) -> int:
        """The cap's (0: none)."""
        return self.cap.max_keys

    @property
    def evicted(self) -> int:
        return self.cap.evicted

    @property
    def refused(self) -> int:
        return self.cap.refused

    @property
    def report(self) -> Callable[[str, int], None] | None:
        """Where the cap's evictions and refusals are counted (the service's Stats.inc)."""
        return self.cap.report

    @report.setter
    def report(self, report: Callable[[str, int], None] | None) -> None:
        self.cap.report = report

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

    def make_room(self, want: int) -> int:
        with self._lock:
            return self._make_room(want)

    def _make_room(self, want: int) -> int:
        """Evict up to ``want`` counters below their limit, soonest window end first."""
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
        return evicted

    def _admit(self, op: CounterOp) -> bool:
        """Whether a new counter may be stored (making room if the cap is reached)."""
        cap = self.cap
        return not cap.max_keys or cap.admit(self, 1, self._make_room)

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
