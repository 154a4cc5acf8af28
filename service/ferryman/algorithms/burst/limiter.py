"""Burst tiers on the request path: a descriptor's burst request, and its status and stats
from the store's outcome (the current tier shown as the limit); and ferryman.v1's
``Request`` (up to N hits, at least M or none)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.burst.model import BurstOutcome, BurstPolicy, BurstRequest, BurstStore
from ferryman.core.algorithm import Algorithm, Ask, Call, Granted, Timed
from ferryman.core.answers import Code, EngineOptions, Status, Tally, unit_for
from ferryman.core.keys import stats_key
from ferryman.core.rules import Rule, UnitLimit
from ferryman.errors import BackendError
from ferryman.stats import REQUEST_CALL, Stats

__all__ = ["BurstItem", "BurstLimiter", "BurstRule", "node_key"]


def node_key(prefix: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """The tiers' node key (``prefix``: the cache key prefix) and the tenant (the request's
    values)."""
    return f"{prefix}ferryman_burst_{rule.stats_key}", "_".join(v for _, v in entries)


@dataclass(frozen=True, slots=True)
class BurstRule:
    rule: Rule
    policy: BurstPolicy
    path: tuple[Rule, ...]
    quota: bool


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

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> BurstRule:
        rule = path[-1]
        assert isinstance(rule.limit, BurstPolicy)
        return BurstRule(rule, rule.limit, path, quota)

    def plan(
        self,
        prepared: BurstRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> BurstItem | Status:
        if hits < 0:  # burst tiers record grants only; nothing to give back
            return Status(Code.OK)
        key, parts = stats_key(domain, entries, prepared.path)
        request = self.request_of(prepared.rule, entries, hits, hits)
        rule = prepared.rule
        return BurstItem(index, rule, prepared.policy, request, key, parts, hits, prepared.quota)

    def request_of(
        self, rule: Rule, entries: Sequence[tuple[str, str]], copies: int, min_copies: int
    ) -> BurstRequest:
        """The store's request for ``copies`` hits (at least ``min_copies``) of a tenant."""
        assert isinstance(rule.limit, BurstPolicy)
        node, tenant = node_key(self.opts.cache_key_prefix, rule, entries)
        return BurstRequest(node, tenant, rule.limit, copies, min_copies)

    def calls(self, store: BurstStore, items: Sequence[BurstItem], now: float) -> list[Call]:
        return [(1, store.decide(b.request, now)) for b in items]

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
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for b, outcome in zip(items, replies, strict=True):
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
        limit = UnitLimit(outcome.tier_limit, unit_for(window), name=b.rule.name)
        remaining = max(0, outcome.tier_limit - outcome.tier_hits)
        reset = math.ceil(outcome.retry_after) if math.isfinite(outcome.retry_after) else None
        if over and b.rule.shadow_mode:
            return Status(Code.OK, limit, 0, reset, b.quota, window)
        code = Code.OVER_LIMIT if over else Code.OK
        return Status(code, limit, 0 if over else remaining, reset, b.quota, window)

    async def request(
        self, store: BurstStore, ask: Ask, now: Callable[[], float], timed: Timed
    ) -> Granted:
        """ferryman.v1's ``Request`` on a burst-tier node: up to ``copies`` hits, at least
        ``min_copies`` or none (a burst tier cannot wait). With FAIL_OPEN a backend error
        grants them all (counted)."""
        rule = ask.path[-1]
        policy = rule.limit
        assert isinstance(policy, BurstPolicy)
        request = self.request_of(rule, ask.entries, ask.copies, ask.min_copies)
        try:
            outcome = await timed(1, store.decide(request, now()))
        except BackendError:
            if not self.opts.fail_open:
                raise
            self.stats.inc(f"{REQUEST_CALL}.degraded")
            outcome = BurstOutcome(ask.copies, 0, 0, 0, math.inf, False, False, False, 0, 0, 0.0)
            return _granted(policy, outcome)
        key, parts = stats_key(ask.domain, ask.entries, ask.path)
        self.count(key, parts, ask.copies, outcome, False)
        return _granted(policy, outcome)


def _granted(policy: BurstPolicy, outcome: BurstOutcome) -> Granted:
    fields: dict[str, int | bool] = {
        "active_tier_index": outcome.tier_index,
        "active_tier_limit": outcome.tier_limit,
        "active_tier_hits": outcome.tier_hits,
        "tenant_hits_last_second": outcome.tenant_last_second,
        "global_hits_last_second": outcome.global_last_second,
        "burst": outcome.burst,
        "limited_by_hard_limit": outcome.limited_by_hard_limit,
        "limited_by_global_limit": outcome.limited_by_global_limit,
    }
    if policy.hard_limit is not None:
        fields["hard_limit"] = policy.hard_limit
    if policy.global_limit is not None:
        fields["global_limit"] = policy.global_limit
    durations: dict[str, float] = {}
    if math.isfinite(outcome.tier_window):
        durations["active_tier_window"] = outcome.tier_window
    if math.isfinite(outcome.retry_after):
        durations["retry_after"] = outcome.retry_after
    return Granted(outcome.granted, fields, durations)
