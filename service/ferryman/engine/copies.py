"""Held copies through Envoy (concurrency limits): hits hold copies of a copy-limited node,
negative hits (sent when the stream ends) give them back."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ferryman.algorithms.copies.model import CopyStore, Holder
from ferryman.config.model import Rule
from ferryman.engine.model import MAX_REMAINING, Code, EngineOptions, Status
from ferryman.stats import Stats

__all__ = ["CopyItem", "CopyLimiter"]


@dataclass(slots=True)
class CopyItem:
    index: int
    rule: Rule
    node: str
    tenant: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


class CopyLimiter:
    """Takes and gives back Envoy's holds, one descriptor at a time."""

    def __init__(self, opts: EngineOptions, stats: Stats) -> None:
        self.opts = opts
        self.stats = stats

    def node(self, rule: Rule) -> str:
        """The store's name of a copy-limited node (its keys share one hash tag)."""
        return f"{self.opts.cache_key_prefix}ferryman_copies_{rule.stats_key}"

    async def hold(self, store: CopyStore, h: CopyItem, now: float) -> Status:
        """Take (or give back) an Envoy hold on a copy-limited node, as a descriptor status."""
        policy = h.rule.copies
        assert policy is not None
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
