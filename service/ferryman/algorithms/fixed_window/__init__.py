"""Fixed windows (the reference's ``rate_limit``): counters per epoch-aligned window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.fixed_window.item import WindowStep
from ferryman.algorithms.fixed_window.limiter import WindowLimiter
from ferryman.algorithms.fixed_window.model import CounterOp, FixedWindowStore
from ferryman.algorithms.fixed_window.spec import (
    KIND,
    FixedWindow,
    read_fixed_window,
    read_window_fields,
)
from ferryman.core.algorithm import AlgorithmBase, Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.keys import cache_key
from ferryman.core.nodes import Ctx
from ferryman.core.periods import Period
from ferryman.core.rules import Rule, UnitLimit
from ferryman.stats import Stats

__all__ = ["FIXED_WINDOW", "FixedWindow", "FixedWindowAlgorithm"]


class FixedWindowAlgorithm(AlgorithmBase):
    """``rate_limit``; also the counters of limits Envoy sends with a descriptor."""

    name = KIND
    keys = ("rate_limit",)
    step_lua = (__name__, "item.lua")
    stats = MappingProxyType(
        {
            "near_limit": "Hits within the limit but above NEAR_LIMIT_RATIO of it.",
            "over_limit_with_local_cache": (
                "Over-limit hits answered from the local over-limit cache."
            ),
        }
    )

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> FixedWindow | None:
        return read_fixed_window(ctx, fields, path)

    def parse_map(self, ctx: Ctx, node: Node, path: str) -> FixedWindow | None:
        """A fixed window's own map at ``path`` (an item of a ``rate_limits`` list)."""
        return read_window_fields(ctx, node, path)

    def describe(self, limit: FixedWindow) -> dict[str, Any]:
        rate = limit.rate
        if limit.period is None:
            return {"kind": "unlimited", "name": rate.name or None}
        described = {
            "kind": KIND,
            "requests_per_unit": rate.requests_per_unit,
            **limit.period.describe(),
            "per": limit.period.text(),
            "name": rate.name or None,
            "replaces": list(rate.replaces),
        }
        if limit.sync is not None:
            described["sync"] = limit.sync
        return described

    def text(self, described: Mapping[str, Any]) -> str:
        text = f"fixed window {described['requests_per_unit']} per {described['per']}"
        if described.get("sync"):
            text += f", synced every {described['sync']:g}s"
        return text

    def rate(self, limit: FixedWindow) -> Rate | None:
        if limit.period is None:
            return None
        count = limit.rate.requests_per_unit
        return Rate(count / limit.period.seconds, float(count))

    def reported(self, limit: FixedWindow) -> UnitLimit | None:
        return limit.rate

    def stepper(self, limit: FixedWindow) -> WindowStep | None:
        if limit.period is None:
            return None
        return WindowStep(limit, limit.period)

    def limiter(self, options: EngineOptions, stats: Stats) -> WindowLimiter:
        return WindowLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> FixedWindowStore:
        from ferryman.algorithms.fixed_window.memory import MemoryFixedWindows

        return MemoryFixedWindows(options.clock, options.max_keys, options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> FixedWindowStore:
        from ferryman.algorithms.fixed_window.redis import RedisFixedWindows
        from ferryman.algorithms.fixed_window.synced import SyncedFixedWindows

        # Exact unless an op asks for synced counting (a rule's sync, REDIS_SYNC_INTERVAL).
        exact = RedisFixedWindows(connection, options.jitter_max)
        return SyncedFixedWindows(exact, options.clock)

    def memcache_store(self, servers: Sequence[Any], jitter_max: int) -> Any:
        """The counters in memcached (BACKEND_TYPE=memcache), on ``servers``."""
        from ferryman.algorithms.fixed_window.memcache import MemcacheFixedWindows

        return MemcacheFixedWindows(servers, jitter_max)

    def routed_store(self, main: Any, per_second: Any) -> FixedWindowStore:
        """Per-second counters to ``per_second``, the others to ``main`` (REDIS_PERSECOND)."""
        from ferryman.algorithms.fixed_window.redis import RoutedFixedWindows

        return RoutedFixedWindows(main, per_second)

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        limit = path[-1].limit
        assert isinstance(limit, FixedWindow)
        if limit.period is None:
            return None
        base = cache_key(options.cache_key_prefix, domain, entries, path)
        op = WindowLimiter.op(base, limit.period, 0, limit.rate.requests_per_unit, now)
        return Target(op.key, (op, limit.period))

    async def peek(self, store: FixedWindowStore, target: Target, now: float) -> dict[str, Any]:
        op: CounterOp = target.state[0]
        period: Period = target.state[1]
        (value,) = await store.peek([op])
        return {
            "count": value,
            "remaining": max(0, op.limit - value),
            "reset_after": period.reset_after(now),
        }

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "count" not in fields:
            return ""
        return (
            f"{fields['count']} counted, {fields['remaining']} left, "
            f"window resets in {fields['reset_after']}s"
        )

    async def reset(self, store: FixedWindowStore, target: Target) -> bool:
        return await store.reset([target.state[0]]) > 0


FIXED_WINDOW = FixedWindowAlgorithm()
