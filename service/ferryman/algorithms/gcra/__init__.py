"""GCRA (generic cell rate algorithm): a sustained rate and a burst in one stored time per
tenant, exact, one atomic decision per request.

``model`` decides, pure and clock-free (a "would it fit" step and a "commit" step);
``memory`` and ``redis`` (with ``gcra_core.lua``, the decision as Lua functions, in front of
``gcra.lua``) are the two stores behind the ``GcraStore`` protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.gcra.item import GcraStep
from ferryman.algorithms.gcra.limiter import TAG, GcraLimiter, reported
from ferryman.algorithms.gcra.model import GcraStore
from ferryman.algorithms.gcra.spec import KIND, Gcra, read_gcra
from ferryman.core.algorithm import Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.per_tenant import TenantKeyed
from ferryman.core.rules import UnitLimit
from ferryman.stats import Stats

__all__ = ["GCRA", "Gcra", "GcraAlgorithm"]


class GcraAlgorithm(TenantKeyed):
    """``gcra`` on a descriptor node."""

    name = KIND
    tag = TAG
    keys = (KIND,)
    step_lua = (__name__, "gcra_core.lua", "item.lua")
    stats = MappingProxyType({"served_with_wait": "Hits granted on a bucket node after a wait."})

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> Gcra | None:
        return read_gcra(ctx, fields, path)

    def describe(self, limit: Gcra) -> dict[str, Any]:
        return {
            "kind": KIND,
            "rate": limit.rate,
            "per": limit.per,
            "burst": limit.burst,
            "name": limit.name or None,
        }

    def text(self, described: Mapping[str, Any]) -> str:
        return f"GCRA {described['rate']} per {described['per']:g}s, burst {described['burst']}"

    def rate(self, limit: Gcra) -> Rate | None:
        return Rate(limit.rate / limit.per, float(limit.burst))

    def reported(self, limit: Gcra) -> UnitLimit | None:
        return reported(limit)

    def stepper(self, limit: Gcra) -> GcraStep:
        return GcraStep(limit)

    def limiter(self, options: EngineOptions, stats: Stats) -> GcraLimiter:
        return GcraLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> GcraStore:
        from ferryman.algorithms.gcra.memory import MemoryGcra

        return MemoryGcra(options.max_keys, options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> GcraStore:
        from ferryman.algorithms.gcra.redis import RedisGcra

        return RedisGcra(connection, options.server_time)

    async def peek(self, store: GcraStore, target: Target, now: float) -> dict[str, Any]:
        limit: Gcra = target.state
        result = await store.peek(target.key, limit.params, now)
        return {"remaining": result.remaining, "full_in": round(result.full_us / 1e6, 3)}

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "full_in" not in fields:
            return ""
        if not fields["full_in"]:
            return f"bucket full, {fields['remaining']} left"
        return f"{fields['remaining']} left, bucket full again in {fields['full_in']:g}s"


GCRA = GcraAlgorithm()
