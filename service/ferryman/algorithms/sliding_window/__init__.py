"""The sliding-window counter: two fixed windows, the previous one weighted by how much of
it the sliding window still covers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.sliding_window.item import SlidingStep
from ferryman.algorithms.sliding_window.limiter import TAG, SlidingLimiter
from ferryman.algorithms.sliding_window.model import SlidingStore
from ferryman.algorithms.sliding_window.spec import KIND, SlidingWindow, read_sliding_window
from ferryman.core.algorithm import Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.per_tenant import TenantKeyed
from ferryman.core.rules import UnitLimit
from ferryman.stats import Stats

__all__ = ["SLIDING_WINDOW", "SlidingWindow", "SlidingWindowAlgorithm"]


class SlidingWindowAlgorithm(TenantKeyed):
    """``sliding_window`` on a descriptor node."""

    name = KIND
    tag = TAG
    keys = (KIND,)
    step_lua = (__name__, "item.lua")

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> SlidingWindow | None:
        return read_sliding_window(ctx, fields, path)

    def describe(self, limit: SlidingWindow) -> dict[str, Any]:
        return {
            "kind": KIND,
            "requests_per_unit": limit.rate.requests_per_unit,
            **limit.period.describe(),
            "per": limit.period.text(),
        }

    def text(self, described: Mapping[str, Any]) -> str:
        return f"sliding window {described['requests_per_unit']} per {described['per']}"

    def rate(self, limit: SlidingWindow) -> Rate | None:
        count = limit.rate.requests_per_unit
        return Rate(count / limit.seconds, float(count))

    def reported(self, limit: SlidingWindow) -> UnitLimit | None:
        return limit.rate

    def stepper(self, limit: SlidingWindow) -> SlidingStep:
        return SlidingStep(limit)

    def limiter(self, options: EngineOptions, stats: Stats) -> SlidingLimiter:
        return SlidingLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> SlidingStore:
        from ferryman.algorithms.sliding_window.memory import MemorySlidingWindows

        return MemorySlidingWindows(options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> SlidingStore:
        from ferryman.algorithms.sliding_window.redis import RedisSlidingWindows

        return RedisSlidingWindows(connection, options.server_time)

    async def peek(self, store: SlidingStore, target: Target, now: float) -> dict[str, Any]:
        window: SlidingWindow = target.state
        count = window.rate.requests_per_unit
        result = await store.peek(target.key, count, window.micros, now)
        return {
            "estimate": round(result.estimate, 3),
            "remaining": max(0, math.floor(count - result.estimate)),
            "reset_after": math.ceil(result.left_us / 1e6),
        }

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "estimate" not in fields:
            return ""
        return (
            f"{fields['estimate']:g} counted (estimate), {fields['remaining']} left, "
            f"window ends in {fields['reset_after']}s"
        )


SLIDING_WINDOW = SlidingWindowAlgorithm()
