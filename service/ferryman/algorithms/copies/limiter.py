"""Held copies through Envoy (concurrency limits): hits hold copies of a copy-limited node,
negative hits (sent when the stream ends) give them back."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.copies.model import CopyPolicy, CopyStore, Holder
from ferryman.core.algorithm import Algorithm, Call
from ferryman.core.answers import MAX_REMAINING, Code, EngineOptions, Status, Tally
from ferryman.core.keys import stats_key
from ferryman.core.rules import Rule
from ferryman.stats import Stats

__all__ = ["CopiesRule", "HoldItem", "HoldLimiter", "node_name"]


def node_name(prefix: str, rule: Rule) -> str:
    """The store's name of a copy-limited node (its keys share one hash tag)."""
    return f"{prefix}ferryman_copies_{rule.stats_key}"


@dataclass(frozen=True, slots=True)
class CopiesRule:
    rule: Rule
    policy: CopyPolicy
    path: tuple[Rule, ...]
    quota: bool
    node: str


@dataclass(slots=True)
class HoldItem:
    index: int
    rule: Rule
    policy: CopyPolicy
    node: str
    tenant: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


class HoldLimiter:
    """Takes and gives back Envoy's holds, one descriptor at a time."""

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> CopiesRule:
        rule = path[-1]
        assert isinstance(rule.limit, CopyPolicy)
        node = node_name(self.opts.cache_key_prefix, rule)
        return CopiesRule(rule, rule.limit, path, quota, node)

    def plan(
        self,
        prepared: CopiesRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> HoldItem:
        key, parts = stats_key(domain, entries, prepared.path)
        tenant = "_".join(v for _, v in entries)
        p = prepared
        return HoldItem(index, p.rule, p.policy, p.node, tenant, key, parts, hits, p.quota)

    def calls(self, store: CopyStore, items: Sequence[HoldItem], now: float) -> list[Call]:
        return [(1, self.hold(store, h, now)) for h in items]

    def answer(
        self,
        items: Sequence[HoldItem],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for h, status in zip(items, replies, strict=True):
            statuses[h.index] = status
            tally.add(status.code is Code.OVER_LIMIT, h.quota, h.rule.metadata, h.index)

    async def hold(self, store: CopyStore, h: HoldItem, now: float) -> Status:
        """Take (or give back) an Envoy hold on a copy-limited node, as a descriptor status."""
        policy = h.policy
        stats = self.stats
        if h.hits < 0:
            await store.envoy_release(Holder(h.node, "envoy", 0, now), h.tenant, -h.hits)
            return Status(Code.OK)
        groups = policy.groups_of(h.tenant)
        out = await store.envoy_reserve(
            Holder(h.node, "envoy", 0, now), h.tenant, policy, groups, h.hits, uuid.uuid4().hex
        )
        stats.rule(h.stats_key, "total_hits", h.hits, h.stats_path)
        rooms = [g.limit - out.group_held.get(g.name, 0) for g in groups]
        if policy.limit is not None:
            rooms.append(policy.limit - out.tenant_held)
        if policy.global_limit is not None:
            rooms.append(policy.global_limit - out.global_held)
        remaining = max(0, min(rooms)) if rooms else MAX_REMAINING
        if h.hits == 0 or out.granted:
            stats.rule(h.stats_key, "within_limit", h.hits, h.stats_path)
            return Status(Code.OK, remaining=remaining, quota=h.quota)
        stats.rule(h.stats_key, "over_limit", h.hits, h.stats_path)
        if h.rule.shadow_mode:
            stats.rule(h.stats_key, "shadow_mode", h.hits, h.stats_path)
            return Status(Code.OK, quota=h.quota)
        return Status(Code.OVER_LIMIT, quota=h.quota)
