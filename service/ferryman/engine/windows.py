"""Fixed windows on the request path: each descriptor's counter op, then its status and
stats from the store's result (the reference's arithmetic, local over-limit cache included)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferryman.algorithms.fixed_window.local_cache import OverLimitCache
from ferryman.algorithms.fixed_window.model import (
    CounterOp,
    CounterResult,
    reset_after,
    split,
    window_start,
)
from ferryman.config.model import RateLimit, Rule
from ferryman.engine.matcher import cache_key, segment, stats_key
from ferryman.engine.model import Code, EngineOptions, Status, Tally
from ferryman.engine.policy import Plain, Window
from ferryman.stats import LOCAL_CACHE_HITS, Stats

__all__ = ["PlainCounter", "WindowItem", "WindowLimiter"]


@dataclass(slots=True)
class WindowItem:
    """One descriptor counted in a fixed window."""

    index: int
    limit: RateLimit
    seconds: int
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    shadow: bool
    quota: bool
    rule: Rule | None
    op: CounterOp | None = None
    cached: bool = False  # over its limit per the local cache: not sent to the store
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PlainCounter:
    """One descriptor of a request that is all plain windows, worked out once for every
    request with the same bytes: all but the window the request falls in."""

    index: int
    policy: Plain
    base: str  # the counter key without its window
    hits: int
    near: int  # the count past which hits are near the limit
    row: tuple[str, tuple[str, ...]]  # the stats' key and path


class WindowLimiter:
    """Plans and answers the fixed-window descriptors of requests."""

    def __init__(self, opts: EngineOptions, stats: Stats, local: OverLimitCache | None) -> None:
        self.opts = opts
        self.stats = stats
        self.local = local

    def plain(self, index: int, p: Plain, base: str, hits: int, now: float) -> WindowItem:
        """The common case, with nothing worked out per request: ``base`` is the counter key
        without its window (``p.head`` and the entries)."""
        item = WindowItem(
            index,
            p.limit,
            p.seconds,
            p.stats_key,
            p.stats_path,
            hits,
            p.shadow,
            p.quota,
            p.rule,
            metadata=p.metadata,
        )
        return self._counted(item, base, now)

    def window(
        self,
        index: int,
        w: Window,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> WindowItem:
        key, parts = stats_key(domain, entries, w.path)
        assert w.limit.unit is not None
        item = WindowItem(
            index,
            w.limit,
            w.limit.unit.seconds,
            key,
            parts,
            hits,
            w.rule.shadow_mode,
            w.quota,
            w.rule,
            metadata=w.rule.metadata,
        )
        base = cache_key(self.opts.cache_key_prefix, domain, entries, w.path)
        return self._counted(item, base, now)

    def override(
        self,
        index: int,
        limit: RateLimit,
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
            limit.unit.seconds,
            domain + "." + ".".join(parts),
            (domain, *parts),
            hits,
            False,
            self.opts.quota_mode,
            None,
        )
        return self._counted(
            item, cache_key(self.opts.cache_key_prefix, domain, entries, None), now
        )

    @staticmethod
    def key(base: str, seconds: int, now: float) -> tuple[str, int]:
        """The counter of the window ``now`` falls in, for a descriptor's ``base`` key
        (``cache_key``): its key and the window's start."""
        start = window_start(now, seconds)
        return base + str(start), start

    def _counted(self, item: WindowItem, base: str, now: float) -> WindowItem:
        seconds = item.seconds
        key, start = self.key(base, seconds, now)
        item.op = CounterOp(key, item.hits, item.limit.requests_per_unit, start + seconds, seconds)
        local = self.local
        if local is not None:
            if item.hits < 0:
                local.discard(item.op.key)
            elif local.contains(item.op.key, now):
                item.cached = True
        return item

    def compile(
        self, matches: Sequence[tuple[Any, str]], hits: Sequence[int]
    ) -> tuple[PlainCounter, ...] | None:
        """The counters of a request whose descriptors (``matches``, each with its own
        ``hits``) are all plain windows that add hits, replace no other rule and skip no
        local cache: such a request is answered by :meth:`plain_ops` and
        :meth:`plain_answer` alone. None for any other request."""
        if self.local is not None or not matches:
            return None
        ratio = self.opts.near_limit_ratio
        out = []
        for i, (policy, base) in enumerate(matches):
            if not isinstance(policy, Plain) or policy.limit.replaces or hits[i] <= 0:
                return None
            near = math.floor(policy.limit.requests_per_unit * ratio)
            row = (policy.stats_key, policy.stats_path)
            out.append(PlainCounter(i, policy, base, hits[i], near, row))
        return tuple(out)

    @staticmethod
    def plain_ops(counters: Sequence[PlainCounter], now: float) -> list[CounterOp]:
        """The store's ops for ``counters`` at ``now``."""
        ops = []
        for c in counters:
            seconds = c.policy.seconds
            key, start = WindowLimiter.key(c.base, seconds, now)
            ops.append(
                CounterOp(key, c.hits, c.policy.limit.requests_per_unit, start + seconds, seconds)
            )
        return ops

    def plain_answer(
        self, counters: Sequence[PlainCounter], results: Sequence[CounterResult], now: float
    ) -> tuple[list[Status | None], Tally]:
        """Statuses, stats and tally of a compiled request, as :meth:`answer` gives them
        for the same counters."""
        statuses: list[Status | None] = []
        tally = Tally()
        rows = []
        for c, result in zip(counters, results, strict=True):
            p = c.policy
            limit = p.limit
            rpu = limit.requests_per_unit
            after = result.after
            hits = c.hits
            over, counts = split(hits, rpu, c.near, after - result.applied, after)
            rows.append((*c.row, counts))
            if over and p.shadow:
                self.stats.rule(p.stats_key, "shadow_mode", hits, p.stats_path)
                over = False
                remaining = 0
            else:
                remaining = 0 if over else rpu - after
            seconds = p.seconds
            statuses.append(
                Status(
                    Code.OVER_LIMIT if over else Code.OK,
                    limit,
                    remaining,
                    reset_after(now, seconds),
                    p.quota,
                )
            )
            tally.add(over, p.quota, p.metadata, c.index)
        self.stats.rule_counts(rows)
        return statuses, tally

    def answer(
        self,
        items: Sequence[WindowItem],
        results: Sequence[CounterResult],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        """Each item's status from the store's results (in the order of the items that were
        sent), stats counted, and the outcome tallied."""
        stats = self.stats
        local = self.local
        ratio = self.opts.near_limit_ratio
        result_iter = iter(results)
        counts: list[tuple[str, tuple[str, ...], tuple[int, ...]]] = []
        for item in items:
            limit = item.limit
            rpu = limit.requests_per_unit
            reset = reset_after(now, item.seconds)
            key = item.stats_key
            labels = item.stats_path
            hits = item.hits
            if item.cached:
                over = True
                counts.append((key, labels, (hits, 0, 0, hits)))
                stats.inc(LOCAL_CACHE_HITS)
                stats.rule(key, "over_limit_with_local_cache", hits, labels)
            else:
                result = next(result_iter)
                after = result.after
                if hits < 0:
                    remaining = max(0, rpu - after)
                    statuses[item.index] = Status(Code.OK, limit, remaining, reset, item.quota)
                    continue
                threshold = math.floor(rpu * ratio)
                over, split_counts = split(hits, rpu, threshold, after - result.applied, after)
                counts.append((key, labels, split_counts))
                if over and local is not None and item.op is not None:
                    local.add(item.op.key, item.op.expires_at)
            if over and item.shadow:
                stats.rule(key, "shadow_mode", item.hits, labels)
                over = False
                remaining = 0
            else:
                remaining = 0 if over else rpu - after
            code = Code.OVER_LIMIT if over else Code.OK
            statuses[item.index] = Status(code, limit, remaining, reset, item.quota)
            tally.add(over, item.quota, item.metadata, item.index)
        if counts:
            stats.rule_counts(counts)
