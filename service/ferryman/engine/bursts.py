"""Burst tiers on the request path: a descriptor's burst request, and its status and stats
from the store's outcome (the current tier shown as the limit)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferryman.algorithms.burst.model import BurstOutcome, BurstPolicy, BurstRequest
from ferryman.config.model import RateLimit, Rule
from ferryman.engine.model import Code, EngineOptions, Status, Tally, unit_for
from ferryman.stats import Stats

__all__ = ["BurstItem", "BurstLimiter"]


@dataclass(slots=True)
class BurstItem:
    index: int
    rule: Rule
    policy: BurstPolicy
    request: BurstRequest
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


class BurstLimiter:
    """Plans and answers burst-tier descriptors (ShouldRateLimit and Limiter.Request)."""

    def __init__(self, opts: EngineOptions, stats: Stats) -> None:
        self.opts = opts
        self.stats = stats

    def request(
        self, rule: Rule, entries: Sequence[tuple[str, str]], copies: int, min_copies: int
    ) -> BurstRequest:
        """The store's request for ``copies`` hits (at least ``min_copies``) of a tenant."""
        assert rule.burst is not None
        node, tenant = self.key(self.opts.cache_key_prefix, rule, entries)
        return BurstRequest(node, tenant, rule.burst, copies, min_copies)

    @staticmethod
    def key(prefix: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> tuple[str, str]:
        """The tiers' node key (``prefix``: the cache key prefix) and the tenant (the
        request's values)."""
        return f"{prefix}ferryman_burst_{rule.stats_key}", "_".join(v for _, v in entries)

    def count(
        self, key: str, labels: tuple[str, ...], hits: int, outcome: BurstOutcome, shadow: bool
    ) -> None:
        stats = self.stats
        granted = outcome.granted
        stats.rule(key, "total_hits", hits, labels)
        stats.rule(key, "within_limit", granted, labels)
        # Tiers come from configuration: one series per tier at most.
        stats.rule(key, "tier_hits", granted, labels, (("tier", str(outcome.tier_index)),))
        if granted < hits:
            stats.rule(key, "over_limit", hits - granted, labels)
            if shadow:
                stats.rule(key, "shadow_mode", hits, labels)
        if outcome.burst:
            stats.rule(key, "burst", 1, labels)

    def answer(
        self,
        items: Sequence[BurstItem],
        outcomes: Sequence[BurstOutcome],
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for b, outcome in zip(items, outcomes, strict=True):
            over = outcome.granted < b.hits
            status = self._status(b, outcome, over)
            statuses[b.index] = status
            tally.add(status.code is Code.OVER_LIMIT, b.quota, b.rule.metadata, b.index)

    def _status(self, b: BurstItem, outcome: BurstOutcome, over: bool) -> Status:
        """The Envoy view of a burst decision: the current tier as the limit."""
        self.count(b.stats_key, b.stats_path, b.hits, outcome, b.rule.shadow_mode)
        policy = b.policy
        window = outcome.tier_window
        if not math.isfinite(window):
            window = policy.tiers[0].window if policy.tiers else 1.0
        limit = RateLimit(outcome.tier_limit, unit_for(window), name=b.rule.name)
        remaining = max(0, outcome.tier_limit - outcome.tier_hits)
        reset = math.ceil(outcome.retry_after) if math.isfinite(outcome.retry_after) else None
        if over and b.rule.shadow_mode:
            return Status(Code.OK, limit, 0, reset, b.quota, window)
        code = Code.OVER_LIMIT if over else Code.OK
        return Status(code, limit, 0 if over else remaining, reset, b.quota, window)
