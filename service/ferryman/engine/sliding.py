"""Sliding-window counters on descriptor nodes (``sliding_window``): a descriptor's hit, and
its status from the store's answer: the limit per unit, what the sliding window has left,
the end of the current window as the reset."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferryman.algorithms.sliding_window.model import SlidingResult
from ferryman.config.model import RateLimit, Rule
from ferryman.engine.model import Code, EngineOptions, Status, Tally
from ferryman.engine.policy import SlidingNode
from ferryman.stats import Stats

__all__ = ["SlidingItem", "SlidingLimiter"]


@dataclass(slots=True)
class SlidingItem:
    index: int
    rule: Rule
    limit: RateLimit
    seconds: int
    key: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


class SlidingLimiter:
    """Plans and answers sliding-window descriptors."""

    def __init__(self, opts: EngineOptions, stats: Stats) -> None:
        self.opts = opts
        self.stats = stats

    @staticmethod
    def key(policy: SlidingNode, entries: Sequence[tuple[str, str]]) -> str:
        """One tenant's counter (the request's values): one key, its own hash tag."""
        return f"{policy.key}|{'_'.join(v for _, v in entries)}}}"

    def answer(
        self,
        items: Sequence[SlidingItem],
        results: Sequence[SlidingResult],
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for item, result in zip(items, results, strict=True):
            status = self.status(item, result)
            statuses[item.index] = status
            over = not result.allowed
            tally.add(
                status.code is Code.OVER_LIMIT, item.quota, None if over else item.rule.metadata
            )

    def status(self, item: SlidingItem, result: SlidingResult) -> Status:
        stats, key, labels, hits = self.stats, item.stats_key, item.stats_path, item.hits
        stats.rule(key, "total_hits", hits, labels)
        shadow = item.rule.shadow_mode
        if result.allowed:
            stats.rule(key, "within_limit", hits, labels)
        else:
            stats.rule(key, "over_limit", hits, labels)
            if shadow:
                stats.rule(key, "shadow_mode", hits, labels)
        limit = item.limit
        left = max(0, math.floor(limit.requests_per_unit - result.estimate))
        reset = math.ceil(result.left_us / 1e6)
        code = Code.OK if result.allowed or shadow else Code.OVER_LIMIT
        return Status(code, limit, left if result.allowed else 0, reset, item.quota)
