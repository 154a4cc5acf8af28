"""GCRA on descriptor nodes (``gcra``): a descriptor's request of its hits, and its status
from the store's answer: ``rate`` per the smallest unit not shorter than ``per`` as the
limit (the burst over the time a full burst takes to come back in the headers), the burst
left as the remaining, the time until the bucket is full again as the reset; and
ferryman.v1's ``Request``, which may wait (a shaper)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.gcra.model import GcraResult, GcraStore
from ferryman.algorithms.gcra.spec import Gcra
from ferryman.core.algorithm import Algorithm, Ask, Call, Granted, Timed
from ferryman.core.answers import Code, EngineOptions, Status, Tally, unit_for
from ferryman.core.keys import stats_key, tenant_key
from ferryman.core.rules import Rule, UnitLimit
from ferryman.errors import BackendError
from ferryman.stats import REQUEST_CALL, Stats

__all__ = ["GcraItem", "GcraLimiter", "GcraRule", "gcra_key", "reported"]


def gcra_key(prefix: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> str:
    """One tenant's TAT (the request's values): one key, its own hash tag."""
    return tenant_key(prefix, "gcra", rule, entries)


def reported(limit: Gcra) -> UnitLimit:
    """The limit as Envoy is told it: ``rate`` per the smallest unit not shorter than
    ``per``."""
    return UnitLimit(limit.rate, unit_for(limit.per), name=limit.name)


@dataclass(frozen=True, slots=True)
class GcraRule:
    rule: Rule
    limit: Gcra
    reported: UnitLimit
    path: tuple[Rule, ...]
    quota: bool


@dataclass(slots=True)
class GcraItem:
    index: int
    rule: Rule
    limit: Gcra
    reported: UnitLimit
    key: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


class GcraLimiter:
    """Plans and answers GCRA descriptors (ShouldRateLimit and Limiter.Request)."""

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> GcraRule:
        rule = path[-1]
        assert isinstance(rule.limit, Gcra)
        return GcraRule(rule, rule.limit, reported(rule.limit), path, quota)

    def plan(
        self,
        prepared: GcraRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> GcraItem:
        key, parts = stats_key(domain, entries, prepared.path)
        return GcraItem(
            index,
            prepared.rule,
            prepared.limit,
            prepared.reported,
            gcra_key(self.opts.cache_key_prefix, prepared.rule, entries),
            key,
            parts,
            max(hits, 0),  # time given out is not taken back: a negative hit only looks
            prepared.quota,
        )

    def calls(self, store: GcraStore, items: Sequence[GcraItem], now: float) -> list[Call]:
        return [(1, store.take(g.key, g.limit.params, g.hits, 0, now)) for g in items]

    def count(self, item: GcraItem, granted: bool, waited: bool) -> None:
        stats, shadow = self.stats, item.rule.shadow_mode
        stats.outcome(item.stats_key, item.stats_path, item.hits, granted, shadow, waited)

    def answer(
        self,
        items: Sequence[GcraItem],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for item, result in zip(items, replies, strict=True):
            status = self.status(item, result)
            statuses[item.index] = status
            over = not result.allowed
            tally.add(
                status.code is Code.OVER_LIMIT, item.quota, None if over else item.rule.metadata
            )

    def status(self, item: GcraItem, result: GcraResult) -> Status:
        """The Envoy view of a decision (counted in stats)."""
        self.count(item, result.allowed, False)
        limit = item.limit
        code = Code.OK if result.allowed or item.rule.shadow_mode else Code.OVER_LIMIT
        shown = result.remaining if result.allowed else 0
        reset = math.ceil(result.full_us / 1e6)
        window = limit.burst * limit.per / limit.rate
        return Status(code, item.reported, shown, reset, item.quota, window, limit.burst)

    async def request(
        self, store: GcraStore, ask: Ask, now: Callable[[], float], timed: Timed
    ) -> Granted:
        """ferryman.v1's ``Request`` on a GCRA node: ``copies`` hits, else ``min_copies``,
        else none, granted after a wait of at most ``max_wait_millis``. With FAIL_OPEN a
        backend error grants them all (counted)."""
        rule = ask.path[-1]
        limit = rule.limit
        assert isinstance(limit, Gcra)
        key = gcra_key(self.opts.cache_key_prefix, rule, ask.entries)
        wait_us = max(0, ask.max_wait_millis) * 1000
        granted, result = 0, None
        try:
            counts = (ask.copies, ask.min_copies) if ask.min_copies < ask.copies else (ask.copies,)
            for n in counts:
                result = await timed(1, store.take(key, limit.params, n, wait_us, now()))
                if result.allowed:
                    granted = n
                    break
        except BackendError:
            if not self.opts.fail_open:
                raise
            self.stats.inc(f"{REQUEST_CALL}.degraded")
            return Granted(ask.copies, {"tokens_remaining": limit.burst}, {})
        assert result is not None
        stats, parts = stats_key(ask.domain, ask.entries, ask.path)
        quota = rule.quota_mode or self.opts.quota_mode
        item = GcraItem(0, rule, limit, reported(limit), key, stats, parts, ask.copies, quota)
        self.count(item, granted > 0, result.wait_us > 0)
        return _granted(granted, result)


def _granted(granted: int, result: GcraResult) -> Granted:
    durations: dict[str, float] = {}
    if granted and result.wait_us > 0:
        durations["wait"] = result.wait_us / 1e6
    if not granted and result.retry_us >= 0:  # -1: more than the burst never passes
        durations["retry_after"] = result.retry_us / 1e6
    return Granted(granted, {"tokens_remaining": result.remaining}, durations)
