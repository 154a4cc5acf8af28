"""Fixed windows on the request path: each descriptor's counter op, then its status and
stats from the store's result (the reference's arithmetic, local over-limit cache included).

A rule whose stats key and counter key take nothing from the request but its entries is
*plain*: a request made only of plain windows is compiled once per distinct request
(:meth:`WindowLimiter.compile`) and answered with no plan at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ferryman.algorithms.fixed_window.local_cache import OverLimitCache
from ferryman.algorithms.fixed_window.model import (
    CounterOp,
    CounterResult,
    FixedWindowStore,
    split,
)
from ferryman.algorithms.fixed_window.spec import FixedWindow
from ferryman.core.algorithm import Algorithm, Call
from ferryman.core.answers import MAX_REMAINING, Code, EngineOptions, Status, Tally
from ferryman.core.keys import cache_key, segment, stats_key
from ferryman.core.periods import Period, UnitPeriod
from ferryman.core.rules import Rule, UnitLimit
from ferryman.stats import LOCAL_CACHE_HITS, Stats

__all__ = [
    "CompiledCounters",
    "CurrentWindows",
    "PlainCounter",
    "WindowItem",
    "WindowLimiter",
    "WindowRule",
]


@dataclass(frozen=True, slots=True)
class WindowRule:
    """A fixed-window rule, worked out once per config: a plain one (``plain``) has its
    stats key and counter key's head fixed; others take values from the request
    (detailed_metric, value_to_metric or share_threshold on the path)."""

    rule: Rule
    limit: UnitLimit
    path: tuple[Rule, ...]
    quota: bool
    plain: bool
    head: str  # the counter key's start, <prefix><domain>_
    period: Period | None  # the window (None: unlimited)
    shadow: bool
    metadata: Mapping[str, Any]
    sync: float = 0.0  # synced counting's interval (0: exact)


@dataclass(slots=True)
class WindowItem:
    """One descriptor counted in a fixed window."""

    index: int
    limit: UnitLimit
    period: Period
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    shadow: bool
    quota: bool
    rule: Rule | None
    sync: float = 0.0
    op: CounterOp | None = None
    cached: bool = False  # over its limit per the local cache: not sent to the store
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PlainCounter:
    """One descriptor of a request that is all plain windows, worked out once for every
    request with the same bytes: all but the window the request falls in."""

    index: int
    window: WindowRule
    base: str  # the counter key without its window
    hits: int
    near: int  # the count past which hits are near the limit
    row: tuple[str, tuple[str, ...]]  # the stats' key and path
    period: Period
    w: float | None  # the window's exact length, for the headers (None: the unit's)
    # Read from ``window`` on every request: kept flat.
    limit: UnitLimit
    rpu: int
    quota: bool
    shadow: bool
    tallied: bool  # quota mode or metadata: the tally needs it when within the limit


@dataclass(slots=True)
class CompiledCounters:
    """A compiled request's counters, and the ops of the windows it was last sent in
    (they hold from ``start`` to ``end``)."""

    counters: tuple[PlainCounter, ...]
    ops: list[CounterOp] = field(default_factory=list)
    start: float = math.inf
    end: float = -math.inf

    def renew(self, now: float, windows: CurrentWindows) -> None:
        """The ops of the windows ``now`` falls in."""
        ops = []
        start, end = -math.inf, math.inf
        for c in self.counters:
            w = c.window
            window = windows.at(c.period, now)
            ops.append(counter_op(c.base, window, c.hits, c.rpu, w.sync))
            start, end = max(start, window[3]), min(end, window[4])
        self.ops, self.start, self.end = ops, start, end


# A period's current window: key suffix, expires_at, ttl, start and end.
Window = tuple[str, int, int, float, float]


def window_of(period: Period, now: float) -> Window:
    """The window of ``period`` that ``now`` falls in: its key lives as long as the window
    (a whole second at least)."""
    suffix, start, end = period.window(now)
    return suffix, math.ceil(end), max(1, math.ceil(end - start)), start, end


def counter_op(base: str, window: Window, hits: int, limit: int, sync: float) -> CounterOp:
    """The op of a descriptor's ``base`` key (``cache_key``) in ``window``."""
    suffix, expires_at, ttl, _, _ = window
    return CounterOp(base + suffix, hits, limit, expires_at, ttl, sync)


class CurrentWindows:
    """The window each period is in, worked out once per window rather than per request."""

    #: Periods kept (a config has few; reloads may bring new ones).
    MAX = 1024

    def __init__(self) -> None:
        # By the period's id (hashing a period costs more than the rest), with the period
        # itself: an id is only that period's while it lives.
        self._current: dict[int, tuple[Period, Window]] = {}

    def at(self, period: Period, now: float) -> Window:
        """The window of ``period`` that ``now`` falls in."""
        kept = self._current.get(id(period))
        if kept is not None and kept[0] is period:
            got = kept[1]
            if got[3] <= now < got[4]:
                return got
        got = window_of(period, now)
        if len(self._current) >= self.MAX:
            self._current.clear()
        self._current[id(period)] = (period, got)
        return got


class WindowLimiter:
    """Plans and answers the fixed-window descriptors of requests."""

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats
        self.local = OverLimitCache(opts.local_cache_bytes) if opts.local_cache_bytes > 0 else None
        self.windows = CurrentWindows()

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> WindowRule:
        rule = path[-1]
        assert isinstance(rule.limit, FixedWindow)
        limit = rule.limit.rate
        plain = not (
            rule.detailed_metric or any(r.value_to_metric or r.share_threshold for r in path)
        )
        head = f"{self.opts.cache_key_prefix}{domain}_"
        period = None if limit.unlimited else rule.limit.period
        sync = self.opts.sync_interval if rule.limit.sync is None else rule.limit.sync
        return WindowRule(
            rule, limit, path, quota, plain, head, period, rule.shadow_mode, rule.metadata, sync
        )

    def plan(
        self,
        prepared: WindowRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> WindowItem | Status:
        period = prepared.period
        if period is None:
            return Status(Code.OK, remaining=MAX_REMAINING)
        limit = prepared.limit
        rule = prepared.rule
        if prepared.plain:
            key, parts = rule.stats_key, rule.stats_path
            base = prepared.head + "".join([f"{k}_{v}_" for k, v in entries])
        else:
            key, parts = stats_key(domain, entries, prepared.path)
            base = cache_key(self.opts.cache_key_prefix, domain, entries, prepared.path)
        item = WindowItem(
            index,
            limit,
            period,
            key,
            parts,
            hits,
            rule.shadow_mode,
            prepared.quota,
            rule,
            prepared.sync,
            metadata=rule.metadata,
        )
        return self._counted(item, base, now)

    def override(
        self,
        index: int,
        limit: UnitLimit,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> WindowItem:
        """A limit sent with the descriptor, in place of any configured one."""
        parts = tuple(segment(k, v) for k, v in entries)
        assert limit.unit is not None
        item = WindowItem(
            index,
            limit,
            UnitPeriod(limit.unit),
            domain + "." + ".".join(parts),
            (domain, *parts),
            hits,
            False,
            self.opts.quota_mode,
            None,
            self.opts.sync_interval,
        )
        return self._counted(
            item, cache_key(self.opts.cache_key_prefix, domain, entries, None), now
        )

    @staticmethod
    def op(
        base: str, period: Period, hits: int, limit: int, now: float, sync: float = 0.0
    ) -> CounterOp:
        """The counter op of the window ``now`` falls in, for a descriptor's ``base`` key
        (``cache_key``): the key names the window's start."""
        return counter_op(base, window_of(period, now), hits, limit, sync)

    def _counted(self, item: WindowItem, base: str, now: float) -> WindowItem:
        window = self.windows.at(item.period, now)
        limit = item.limit.requests_per_unit
        item.op = counter_op(base, window, item.hits, limit, item.sync)
        local = self.local
        if local is not None:
            if item.hits < 0:
                local.discard(item.op.key)
            elif local.contains(item.op.key, now):
                item.cached = True
        return item

    def calls(self, store: FixedWindowStore, items: Sequence[WindowItem], now: float) -> list[Call]:
        """One store call for every counter not known to be over (local cache)."""
        ops: list[CounterOp] = [w.op for w in items if w.op is not None and not w.cached]
        stop = self.opts.stop_when_over
        if stop and ops and len(ops) < len(items) and any(w.cached and w.hits > 0 for w in items):
            # A descriptor known to be over (local cache) blocks the request: as with one
            # found over in the store, the others are read, not incremented.
            ops = [replace(op, hits=0) if op.hits > 0 else op for op in ops]
        if not ops:
            return []
        return [(len(ops), store.apply(ops, stop_when_over=stop))]

    def compile(
        self,
        prepared: Sequence[WindowRule | None],
        entries: Sequence[Sequence[tuple[str, str]]],
        hits: Sequence[int],
    ) -> CompiledCounters | None:
        """The counters of a request whose descriptors (each ``prepared``, with its
        ``entries`` and ``hits``) are all plain windows that add hits, replace no other rule
        and skip no local cache: such a request is answered by :meth:`send` and
        :meth:`finish` alone. None for
        any other request (``prepared`` is None where another kind prepared the rule)."""
        if self.local is not None or not prepared:
            return None
        ratio = self.opts.near_limit_ratio
        out = []
        for i, w in enumerate(prepared):
            if w is None or not w.plain or w.limit.replaces or hits[i] <= 0:
                return None
            if w.period is None:  # unlimited
                return None
            base = w.head + "".join([f"{k}_{v}_" for k, v in entries[i]])
            near = math.floor(w.limit.requests_per_unit * ratio)
            row = (w.rule.stats_key, w.rule.stats_path)
            exact = None if w.period.exact else w.period.seconds
            limit = w.limit
            tallied = w.quota or bool(w.metadata)
            out.append(
                PlainCounter(
                    i,
                    w,
                    base,
                    hits[i],
                    near,
                    row,
                    w.period,
                    exact,
                    limit,
                    limit.requests_per_unit,
                    w.quota,
                    w.shadow,
                    tallied,
                )
            )
        return CompiledCounters(tuple(out))

    def send(self, store: FixedWindowStore, compiled: CompiledCounters, now: float) -> Call:
        """A compiled request's one store call (:meth:`compile`): no plan. The ops of the
        windows ``now`` falls in are kept until one of them ends."""
        if not compiled.start <= now < compiled.end:
            compiled.renew(now, self.windows)
        ops = compiled.ops
        return len(ops), store.apply(ops, stop_when_over=self.opts.stop_when_over)

    def answer_now(
        self, store: FixedWindowStore, compiled: CompiledCounters, now: float
    ) -> list[CounterResult] | None:
        """:meth:`send`'s results at once, from a store that says it can give them without
        a wait (``at_once``: the memory store, synced counting's view, whose ``apply_now``
        may still decline with None); None: send the call."""
        if not getattr(store, "at_once", False):
            return None
        if not compiled.start <= now < compiled.end:
            compiled.renew(now, self.windows)
        results: list[CounterResult] | None = store.apply_now(  # type: ignore[attr-defined]
            compiled.ops, stop_when_over=self.opts.stop_when_over
        )
        return results

    def finish(
        self, compiled: CompiledCounters, replies: Sequence[CounterResult], now: float
    ) -> tuple[list[Status | None], Tally]:
        return self.plain_answer(compiled.counters, replies, now)

    def plain_answer(
        self, counters: Sequence[PlainCounter], results: Sequence[CounterResult], now: float
    ) -> tuple[list[Status | None], Tally]:
        """Statuses, stats and tally of a compiled request, as :meth:`answer` gives them
        for the same counters."""
        statuses: list[Status | None] = []
        tally = Tally()
        rows = []
        over_limit, ok = Code.OVER_LIMIT, Code.OK
        for c, result in zip(counters, results, strict=True):
            rpu = c.rpu
            after = result.after
            over, counts = split(c.hits, rpu, c.near, after - result.applied, after)
            rows.append((*c.row, counts))
            if over:
                if c.shadow:
                    self.stats.rule(c.row[0], "shadow_mode", c.hits, c.row[1])
                    status = Status(ok, c.limit, 0, c.period.reset_after(now), c.quota, c.w)
                    over = False
                else:
                    reset = c.period.reset_after(now)
                    status = Status(over_limit, c.limit, 0, reset, c.quota, c.w)
                tally.add(over, c.quota, c.window.metadata, c.index)
            else:
                status = Status(ok, c.limit, rpu - after, c.period.reset_after(now), c.quota, c.w)
                if c.tallied:
                    tally.add(over, c.quota, c.window.metadata, c.index)
            statuses.append(status)
        self.stats.rule_counts(rows)
        return statuses, tally

    def answer(
        self,
        items: Sequence[WindowItem],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        """Each item's status from the store's results (in the order of the items that were
        sent), stats counted, and the outcome tallied."""
        results: Sequence[CounterResult] = replies[0] if replies else ()
        result_iter = iter(results)
        counts: list[tuple[str, tuple[str, ...], tuple[int, ...]]] = []
        for item in items:
            if item.cached:
                over = True
                after = 0
                counts.append((item.stats_key, item.stats_path, (item.hits, 0, 0, item.hits)))
                self.stats.inc(LOCAL_CACHE_HITS)
                self.stats.rule(
                    item.stats_key, "over_limit_with_local_cache", item.hits, item.stats_path
                )
            else:
                result = next(result_iter)
                after = result.after
                if item.hits < 0:
                    remaining = max(0, item.limit.requests_per_unit - after)
                    reset = item.period.reset_after(now)
                    w = None if item.period.exact else item.period.seconds
                    statuses[item.index] = Status(
                        Code.OK, item.limit, remaining, reset, item.quota, w
                    )
                    continue
                over = self._counted_over(item, result, counts)
            statuses[item.index] = self._status(item, over, after, now)
            tally.add(over and not item.shadow, item.quota, item.metadata, item.index)
        if counts:
            self.stats.rule_counts(counts)

    def _counted_over(
        self,
        item: WindowItem,
        result: CounterResult,
        counts: list[tuple[str, tuple[str, ...], tuple[int, ...]]],
    ) -> bool:
        rpu = item.limit.requests_per_unit
        threshold = math.floor(rpu * self.opts.near_limit_ratio)
        after = result.after
        over, split_counts = split(item.hits, rpu, threshold, after - result.applied, after)
        counts.append((item.stats_key, item.stats_path, split_counts))
        if over and self.local is not None and item.op is not None:
            self.local.add(item.op.key, item.op.expires_at)
        return over

    def _status(self, item: WindowItem, over: bool, after: int, now: float) -> Status:
        rpu = item.limit.requests_per_unit
        if over and item.shadow:
            self.stats.rule(item.stats_key, "shadow_mode", item.hits, item.stats_path)
            over = False
            remaining = 0
        else:
            remaining = 0 if over else rpu - after
        code = Code.OVER_LIMIT if over else Code.OK
        period = item.period
        w = None if period.exact else period.seconds
        return Status(code, item.limit, remaining, period.reset_after(now), item.quota, w)
