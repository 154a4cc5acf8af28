"""Sliding-window counters on descriptor nodes (``sliding_window``): a descriptor's hit, and
its status from the store's answer: the limit per unit, what the sliding window has left,
the end of the current window as the reset."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.sliding_window.model import SlidingResult, SlidingStore
from ferryman.algorithms.sliding_window.spec import SlidingWindow
from ferryman.core.algorithm import Algorithm, Call
from ferryman.core.answers import Code, EngineOptions, Status, Tally
from ferryman.core.keys import stats_key, tenant_key
from ferryman.core.rules import Rule, UnitLimit
from ferryman.stats import Stats

__all__ = ["SlidingItem", "SlidingLimiter", "SlidingRule", "window_key"]


def window_key(prefix: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> str:
    """One tenant's counter (the request's values): one key, its own hash tag."""
    return tenant_key(prefix, "sliding", rule, entries)


@dataclass(frozen=True, slots=True)
class SlidingRule:
    rule: Rule
    window: SlidingWindow
    path: tuple[Rule, ...]
    quota: bool


@dataclass(slots=True)
class SlidingItem:
    index: int
    rule: Rule
    limit: UnitLimit
    micros: int
    exact: float | None  # the window's length for the headers (None: the unit's)
    key: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


class SlidingLimiter:
    """Plans and answers sliding-window descriptors."""

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> SlidingRule:
        rule = path[-1]
        assert isinstance(rule.limit, SlidingWindow)
        return SlidingRule(rule, rule.limit, path, quota)

    def plan(
        self,
        prepared: SlidingRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> SlidingItem:
        key, parts = stats_key(domain, entries, prepared.path)
        window = prepared.window
        return SlidingItem(
            index,
            prepared.rule,
            window.rate,
            window.micros,
            None if window.period.exact else window.seconds,
            window_key(self.opts.cache_key_prefix, prepared.rule, entries),
            key,
            parts,
            max(hits, 0),  # nothing is given back: a negative hit only looks
            prepared.quota,
        )

    def calls(self, store: SlidingStore, items: Sequence[SlidingItem], now: float) -> list[Call]:
        return [
            (1, store.hit(s.key, s.limit.requests_per_unit, s.micros, s.hits, now)) for s in items
        ]

    def answer(
        self,
        items: Sequence[SlidingItem],
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

    def status(self, item: SlidingItem, result: SlidingResult) -> Status:
        shadow = item.rule.shadow_mode
        self.stats.outcome(item.stats_key, item.stats_path, item.hits, result.allowed, shadow)
        limit = item.limit
        left = max(0, math.floor(limit.requests_per_unit - result.estimate))
        reset = math.ceil(result.left_us / 1e6)
        code = Code.OK if result.allowed or shadow else Code.OVER_LIMIT
        left = left if result.allowed else 0
        return Status(code, limit, left, reset, item.quota, item.exact)
