"""Fixed-window counters in this process, dropped when their window ends."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult, over_limit
from ferryman.clock import Clock

__all__ = ["MemoryFixedWindows"]


class MemoryFixedWindows:
    """Counters in a dict, with expiry buckets so memory tracks live windows only.

    All work happens under one lock with no awaits, so each call is atomic for concurrent
    requests whether they come from one event loop or several threads.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._counts: dict[str, tuple[int, int]] = {}  # key -> (count, expires_at)
        self._buckets: dict[int, list[str]] = {}
        self._heap: list[int] = []
        self._lock = threading.Lock()

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

    def _store(self, op: CounterOp, value: int) -> None:
        entry = self._counts.get(op.key)
        if entry is None:
            bucket = self._buckets.get(op.expires_at)
            if bucket is None:
                bucket = self._buckets[op.expires_at] = []
                heapq.heappush(self._heap, op.expires_at)
            bucket.append(op.key)
        self._counts[op.key] = (value, op.expires_at)

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        return self.apply_now(ops, stop_when_over=stop_when_over)

    def apply_now(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        """The synchronous core of :meth:`apply`."""
        with self._lock:
            now = self._clock.now()
            self._sweep(now)
            values: dict[str, int] = {}

            def current(key: str) -> int:
                return values[key] if key in values else self._current(key, now)

            skip: set[int] = set()
            if stop_when_over:
                over = over_limit(ops, [current(op.key) for op in ops])
                if over:
                    skip = set(range(len(ops))) - over
            results: list[CounterResult] = []
            for i, op in enumerate(ops):
                before = current(op.key)
                if i in skip or op.hits == 0:
                    results.append(CounterResult(before, 0))
                    continue
                value = max(0, before + op.hits)
                values[op.key] = value
                self._store(op, value)
                results.append(CounterResult(value, value - before))
            return results

    async def peek(self, ops: Sequence[CounterOp]) -> list[int]:
        with self._lock:
            now = self._clock.now()
            return [self._current(op.key, now) for op in ops]

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()
            self._buckets.clear()
            self._heap.clear()
