"""Charon's burst tiers: stacked sliding windows with active and cooldown periods."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.burst.limiter import BurstLimiter, node_key
from ferryman.algorithms.burst.model import BurstPolicy, BurstStore
from ferryman.algorithms.burst.spec import KEYS, read_burst
from ferryman.core.algorithm import AlgorithmBase, Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.rules import Rule
from ferryman.stats import Stats

__all__ = ["BURST_TIERS", "BurstAlgorithm", "BurstLimiter", "BurstPolicy", "node_key"]


class BurstAlgorithm(AlgorithmBase):
    """``burst_tiers`` (with ``hard_limit``, ``global_limit``, ``name``, ``replaces``)."""

    name = BurstPolicy.kind
    keys = KEYS
    stats = MappingProxyType(
        {
            "burst": "Requests on a burst-tier node that entered a higher tier.",
            "tier_hits": (
                "Hits granted on a burst-tier node, by the tier the tenant was in after them."
            ),
        }
    )

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> BurstPolicy | None:
        return read_burst(ctx, fields, path)

    def describe(self, limit: BurstPolicy) -> dict[str, Any]:
        return {
            "kind": self.name,
            "tiers": limit.describe(),
            "tier_list": [
                {
                    "limit": t.limit,
                    "window": t.window,
                    "active": t.active,
                    "cooldown": t.cooldown,
                    "skippable": t.skippable,
                }
                for t in limit.tiers
            ],
            "name": limit.name or None,
            "replaces": list(limit.replaces),
        }

    def text(self, described: Mapping[str, Any]) -> str:
        return str(described["tiers"])

    def rate(self, limit: BurstPolicy) -> Rate | None:
        if not limit.tiers:
            return None
        first = limit.tiers[0]
        return Rate(first.limit / first.window, float(first.limit))

    def limiter(self, options: EngineOptions, stats: Stats) -> BurstLimiter:
        return BurstLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> BurstStore:
        from ferryman.algorithms.burst.memory import MemoryBursts

        return MemoryBursts(options.clock, options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> BurstStore:
        from ferryman.algorithms.burst.redis import RedisBursts

        return RedisBursts(connection, options.server_time)

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        policy = path[-1].limit
        assert isinstance(policy, BurstPolicy)
        node, tenant = node_key(options.cache_key_prefix, path[-1], entries)
        return Target(f"{node} {tenant}", (node, tenant, policy))

    async def peek(self, store: BurstStore, target: Target, now: float) -> dict[str, Any]:
        node, tenant, policy = target.state
        seen = await store.peek(node, tenant, policy, now)
        tiers = [
            {
                "limit": tier.limit,
                "window": tier.window,
                "active": tier.active,
                "cooldown": tier.cooldown,
                "phase": state.phase,
                "hits": state.hits,
                "entered": state.entered,
                "active_until": state.active_until,
                "cooldown_until": state.cooldown_until,
            }
            for tier, state in zip(policy.tiers, seen.tiers, strict=True)
        ]
        return {
            "tenant": tenant,
            "now": seen.now,
            "current": seen.current,
            "last_second": seen.last_second,
            "hard_limit": policy.hard_limit,
            "tiers": tiers,
        }

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "current" not in fields:
            return ""
        tier = f"tier {fields['current']}" if fields["current"] else "no tier active"
        return f"{tier}, {fields['last_second']} in the last second"

    async def reset(self, store: BurstStore, target: Target) -> bool:
        node, tenant, policy = target.state
        return await store.reset(node, tenant, len(policy.tiers)) > 0


BURST_TIERS = BurstAlgorithm()
