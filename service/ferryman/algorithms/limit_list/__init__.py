"""Several limits on one node (``rate_limits``): a request passes only if it fits every
one, and is counted in all or none, decided in one store call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.limit_list.limiter import TAG, ListLimiter, parts, steps_text
from ferryman.algorithms.limit_list.model import ListStore
from ferryman.algorithms.limit_list.spec import KEY, KIND, LimitList, read_limits
from ferryman.core.algorithm import Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.per_tenant import TenantKeyed
from ferryman.core.rules import UnitLimit
from ferryman.stats import Stats

__all__ = ["LIMIT_LIST", "LimitList", "LimitListAlgorithm"]


def _registry() -> Any:
    # The registry lists this kind too: it is read when a file is, not when imported.
    import ferryman.algorithms as registry

    return registry


class LimitListAlgorithm(TenantKeyed):
    """``rate_limits`` on a descriptor node."""

    name = KIND
    tag = TAG
    keys = (KEY,)

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> LimitList | None:
        registry = _registry()
        plain = registry.COUNTERS
        return read_limits(ctx, fields, path, registry.ALGORITHMS, (plain, plain.parse_map))

    def _of(self, limit: Any) -> Any:
        return _registry().algorithm_of(limit.kind)

    def describe(self, limit: LimitList) -> dict[str, Any]:
        shown = []
        for item in limit.items:
            described = self._of(item.limit).describe(item.limit)
            shown.append({**described, "name": item.name, "replaces": list(item.replaces)})
        return {"kind": KIND, "limits": shown}

    def text(self, described: Mapping[str, Any]) -> str:
        registry = _registry()
        return " and ".join(
            registry.algorithm_of(d["kind"]).text(d) + f" ({d['name']})"
            for d in described["limits"]
        )

    def rate(self, limit: LimitList) -> Rate | None:
        rates = [self._of(i.limit).rate(i.limit) for i in limit.items]
        known = [r for r in rates if r is not None]
        if not known:
            return None
        return Rate(min(r.per_second for r in known), min(r.burst for r in known))

    def reported(self, limit: LimitList) -> UnitLimit | None:
        return None

    def limiter(self, options: EngineOptions, stats: Stats) -> ListLimiter:
        return ListLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> ListStore:
        from ferryman.algorithms.limit_list.memory import MemoryLimits

        return MemoryLimits(options.max_keys, options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> ListStore:
        from ferryman.algorithms.limit_list.redis import RedisLimits

        return RedisLimits(connection, self.steps(), options.server_time)

    def steps(self) -> list[tuple[str, ...]]:
        """The Lua steps of every kind that can be one of a list."""
        return [a.step_lua for a in _registry().ALGORITHMS if a.step_lua is not None]

    async def peek(self, store: ListStore, target: Target, now: float) -> dict[str, Any]:
        limit: LimitList = target.state
        checked = await store.check(target.key, parts(limit.items, now), 0, now)
        return {"limits": steps_text(limit.items, checked.steps)}

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "limits" not in fields:
            return ""
        return "; ".join(
            f"{f['name']}: {f['remaining']} left, resets in {f['reset_after']}s"
            for f in fields["limits"]
        )


LIMIT_LIST = LimitListAlgorithm()
