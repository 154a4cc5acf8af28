"""Synced counting: fixed windows decided from this replica's view, flushed to Redis.

An op with ``sync > 0`` is not sent to Redis on the request path. The replica decides it from
its view of the counter: the global count it last read plus its own hits since. Every
``sync`` seconds a background flush sends each counter's own hits (refused ones included, as
exact mode counts them) in one script call per slot (a single Redis: one round trip; a
Cluster: one write per node, all nodes at once) and reads back the global count.

The error is bounded by the interval: with R replicas each receiving ``h`` hits a second, a
window admits at most about ``limit + R x h x interval`` (up to twice that when the
replicas' flushes are out of phase), since a replica misses only the others' hits since its
last read.

Memory is bounded by what is in use: a counter whose window ended, or that saw no request
for a whole interval, is dropped at the next flush (a later request reads it again).

Redis unreachable: counters in the view keep deciding from their last global count; their
hits wait and go with the first flush that succeeds, counted once (hits are taken from the
pending count only when Redis has answered). A counter first seen during the outage starts
from 0 (a *blind* counter, counted). Failed reads and flushes, blind counters and the last
error are counted and shown in /status.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.fixed_window.model import (
    CounterOp,
    CounterResult,
    FixedWindowStore,
    over_limit,
)
from ferryman.clock import Clock
from ferryman.errors import BackendError
from ferryman.tasks import cancel

__all__ = ["BLIND", "FAILURES", "FLUSHES", "SyncedFixedWindows"]

FLUSHES = "ratelimit.service.redis.sync.flushes"
FAILURES = "ratelimit.service.redis.sync.failures"  # failed reads and flushes
BLIND = "ratelimit.service.redis.sync.blind_counters"


@dataclass(slots=True)
class _Counter:
    """One window's counter in the view: the last global count read (``seen``, own flushed
    hits included), own hits not yet sent (``pending``) and in flight (``sending``)."""

    op: CounterOp  # key, limit, window end and TTL, as the first request gave them
    seen: int
    pending: int = 0
    sending: int = 0
    touched: bool = True  # asked for since the last flush

    @property
    def value(self) -> int:
        return self.seen + self.pending + self.sending


class SyncedFixedWindows:
    """A fixed-window store that counts synced ops in this process and every other op in
    ``exact`` (the Redis store), flushing the former every interval."""

    def __init__(self, exact: FixedWindowStore, clock: Clock, background: bool = True) -> None:
        """``background``: flush on a timer (tests call :meth:`flush` themselves)."""
        self.exact = exact
        self._clock = clock
        self._background = background
        self._view: dict[str, _Counter] = {}
        self._loops: dict[float, asyncio.Task[None]] = {}
        self.flushes = 0
        self.failures = 0
        self.blind = 0
        self.last_error = ""
        # Where flushes, failed reads and flushes, and blind counters are counted (the
        # service's Stats.inc).
        self.report: Callable[[str, int], None] | None = None

    def __len__(self) -> int:
        return len(self._view)

    def apply(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> Coroutine[Any, Any, list[CounterResult]]:
        for op in ops:
            if op.sync > 0:
                return self._synced(ops, stop_when_over)
        # Exact mode's own call, not wrapped in another coroutine: it pays nothing here.
        return self.exact.apply(ops, stop_when_over=stop_when_over)

    async def _synced(self, ops: Sequence[CounterOp], stop_when_over: bool) -> list[CounterResult]:
        synced = [i for i, op in enumerate(ops) if op.sync > 0]
        if len(synced) == len(ops):
            return await self._local(ops, stop_when_over)
        # Each part is applied atomically on its own: stop-when-over holds within each.
        exact = [i for i, op in enumerate(ops) if op.sync <= 0]
        remote, local = await asyncio.gather(
            self.exact.apply([ops[i] for i in exact], stop_when_over=stop_when_over),
            self._local([ops[i] for i in synced], stop_when_over),
        )
        out: list[CounterResult | None] = [None] * len(ops)
        for i, r in [*zip(exact, remote, strict=True), *zip(synced, local, strict=True)]:
            out[i] = r
        return [r for r in out if r is not None]

    #: Synced ops in the view are decided without a wait (:meth:`apply_now`).
    at_once = True

    def apply_now(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult] | None:
        """The ops decided from the view at once, when they are all synced and all in the
        view; None when Redis must be asked first (:meth:`apply`)."""
        view = self._view
        for op in ops:
            if op.sync <= 0 or op.key not in view:
                return None
        return self._decide(ops, stop_when_over, {})

    async def _local(self, ops: Sequence[CounterOp], stop_when_over: bool) -> list[CounterResult]:
        """The ops decided from the view, as the exact store decides them from Redis."""
        view = self._view
        loaded: dict[str, int] = {}
        missing = [op for op in ops if op.key not in view]
        if missing:
            loaded = await self._load(missing)
        return self._decide(ops, stop_when_over, loaded)

    def _decide(
        self, ops: Sequence[CounterOp], stop_when_over: bool, loaded: dict[str, int]
    ) -> list[CounterResult]:
        """The ops applied to the view (no await: atomic for concurrent requests); a
        counter missing from it starts from ``loaded``."""
        view = self._view
        counters = []
        for op in ops:
            counter = view.get(op.key)
            if counter is None:  # dropped by a flush while this request read it
                counter = view[op.key] = _Counter(op, loaded.get(op.key, 0))
            counters.append(counter)
        skip: set[int] = set()
        if stop_when_over:
            over = over_limit(ops, [c.value for c in counters])
            if over:
                skip = set(range(len(ops))) - over
        results: list[CounterResult] = []
        for i, (op, counter) in enumerate(zip(ops, counters, strict=True)):
            counter.touched = True
            before = counter.value
            if op.hits == 0 or i in skip:
                results.append(CounterResult(before, 0))
                continue
            after = max(0, before + op.hits)
            counter.pending += after - before
            results.append(CounterResult(after, after - before))
        return results

    async def _load(self, ops: Sequence[CounterOp]) -> dict[str, int]:
        """Read the global counts of counters new to the view, and enter them."""
        try:
            values = await self.exact.peek(ops)
        except BackendError as exc:
            self._failed(exc)
            values = [0] * len(ops)
            self.blind += len(ops)
            self._report(BLIND, len(ops))
        loaded = {}
        for op, value in zip(ops, values, strict=True):
            loaded[op.key] = value
            if op.key not in self._view:
                self._view[op.key] = _Counter(op, value)
            task = self._loops.get(op.sync)
            if self._background and (task is None or task.done()):
                # A context of its own: the request that starts it must not lend the
                # flusher its deadline (ANSWER_BY), nor its trace.
                self._loops[op.sync] = asyncio.create_task(
                    self._run(op.sync), name="ferryman-redis-sync", context=contextvars.Context()
                )
        return loaded

    async def _run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.flush(interval)

    def _batch(self, interval: float | None, now: float) -> list[tuple[_Counter, CounterOp]]:
        """The counters to flush (those of ``interval``, None: all), their hits moved to
        ``sending``; counters of ended windows and idle ones leave the view."""
        batch = []
        view = self._view
        for key, counter in list(view.items()):
            op = counter.op
            if interval is not None and op.sync != interval:
                continue
            if op.expires_at <= now:
                del view[key]  # the window ended: its count decides nothing any more
                continue
            if not counter.touched and not counter.pending and not counter.sending:
                del view[key]
                continue
            counter.touched = False
            hits = counter.pending
            counter.sending += hits
            counter.pending = 0
            batch.append((counter, CounterOp(key, hits, op.limit, op.expires_at, op.ttl)))
        return batch

    async def flush(self, interval: float | None = None) -> bool:
        """Send the own hits of the counters of ``interval`` (None: every counter) and read
        back their global counts; whether Redis answered (or there was nothing to send)."""
        batch = self._batch(interval, self._clock.now())
        if not batch:
            return True
        try:
            results = await self.exact.apply([op for _, op in batch], stop_when_over=False)
        except BaseException as exc:  # BackendError, or cancelled (by close): sent again
            for counter, op in batch:
                counter.sending -= op.hits
                counter.pending += op.hits
            if not isinstance(exc, BackendError):
                raise
            self._failed(exc)
            return False
        for (counter, op), result in zip(batch, results, strict=True):
            counter.sending -= op.hits
            counter.seen = result.after
        self.flushes += 1
        self.last_error = ""
        self._report(FLUSHES, 1)
        return True

    def _failed(self, exc: BackendError) -> None:
        self.failures += 1
        self.last_error = str(exc)
        self._report(FAILURES, 1)

    def _report(self, name: str, amount: int) -> None:
        if self.report is not None:
            self.report(name, amount)

    async def peek(self, ops: Sequence[CounterOp]) -> list[int]:
        return await self.exact.peek(ops)

    async def reset(self, ops: Sequence[CounterOp]) -> int:
        for op in ops:
            self._view.pop(op.key, None)
        return await self.exact.reset(ops)

    def state(self) -> dict[str, Any]:
        """The view for /status: counters held, own hits not yet flushed, the intervals
        flushed, flushes, failed reads and flushes, blind counters and the last error."""
        return {
            "counters": len(self._view),
            "unflushed_hits": sum(c.pending + c.sending for c in self._view.values()),
            "intervals": sorted(self._loops),
            "flushes": self.flushes,
            "failures": self.failures,
            "blind_counters": self.blind,
            "degraded": bool(self.last_error),
            "last_error": self.last_error or None,
        }

    async def close(self) -> None:
        """Stop flushing on a timer, then send what is left (once)."""
        loops, self._loops = self._loops, {}
        for task in loops.values():
            await cancel(task)
        await self.flush()
