"""GCRA (generic cell rate algorithm): a sustained rate and a burst in one stored time per
tenant, exact, one atomic decision per request.

``model`` decides, pure and clock-free (a "would it fit" step and a "commit" step);
``memory`` and ``redis`` (with ``gcra_core.lua``, the decision as Lua functions, in front of
``gcra.lua``) are the two stores behind the ``GcraStore`` protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.gcra.item import GcraStep
from ferryman.algorithms.gcra.limiter import TAG, GcraLimiter, reported
from ferryman.algorithms.gcra.model import GcraStore
from ferryman.algorithms.gcra.spec import KIND, Gcra, read_gcra
from ferryman.core.algorithm import Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.per_tenant import WAIT_STATS, TenantKeyed
from ferryman.core.rules import UnitLimit
from ferryman.stats import Stats

__all__ = ["GCRA", "Gcra", "GcraAlgorithm"]


class GcraAlgorithm(TenantKeyed):
    """``gcra`` on a descriptor node."""

    name = KIND
    tag = TAG
    keys = (KIND,)
    shapes = True
    step_lua = (__name__, "gcra_core.lua", "item.lua")
    stats = WAIT_STATS

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
        # A hit now fits once the debt is down to the burst less one hit.
        step_us = limit.params.step / limit.params.den
        wait_us = max(0.0, result.full_us - (limit.burst - 1) * step_us)
        return {
            "remaining": result.remaining,
            "full_in": round(result.full_us / 1e6, 3),
            "wait": round(wait_us / 1e6, 3) if not result.remaining else 0.0,
        }

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "full_in" not in fields:
            return ""
        if not fields["full_in"]:
            text = f"bucket full, {fields['remaining']} left"
        else:
            text = f"{fields['remaining']} left, bucket full again in {fields['full_in']:g}s"
        max_wait = fields.get("rule", {}).get("max_wait")
        if max_wait and fields.get("wait"):
            verdict = "held" if fields["wait"] <= max_wait else "refused"
            text += f"; a hit now waits {fields['wait']:g}s: {verdict} (max_wait {max_wait:g}s)"
        return text


GCRA = GcraAlgorithm()
