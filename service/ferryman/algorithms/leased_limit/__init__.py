"""Lease-sized limits (``leased_limit``): a node allows, in each second, as many hits as
this server's lease on its resource from its parent, decided in process with no store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.leased_limit.limiter import LeasedLimiter, LeaseReader
from ferryman.algorithms.leased_limit.spec import KIND, LeasedLimit, read_leased_limit
from ferryman.core.algorithm import Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.rules import Rule, UnitLimit
from ferryman.stats import Stats

__all__ = ["LEASED_LIMIT", "LeaseReader", "LeasedLimit", "LeasedLimitAlgorithm", "LeasedLimiter"]


class LeasedLimitAlgorithm:
    """``leased_limit`` on a descriptor node."""

    name = KIND
    keys = (KIND,)
    held = False
    stats: Mapping[str, str] = MappingProxyType({})

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> LeasedLimit | None:
        return read_leased_limit(ctx, fields, path)

    def describe(self, limit: LeasedLimit) -> dict[str, Any]:
        return {"kind": KIND, "resource": limit.resource, "safe_capacity": limit.safe_capacity}

    def text(self, described: Mapping[str, Any]) -> str:
        return f"per second as leased on {described['resource']}"

    def rate(self, limit: LeasedLimit) -> Rate | None:
        return None  # the lease decides it, second by second

    def reported(self, limit: LeasedLimit) -> UnitLimit | None:
        return None

    def limiter(self, options: EngineOptions, stats: Stats) -> LeasedLimiter:
        return LeasedLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> None:
        return None

    def redis_store(self, connection: Any, options: StoreOptions) -> None:
        return None

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        return None

    async def peek(self, store: Any, target: Target, now: float) -> dict[str, Any]:
        return {}

    def now_text(self, fields: Mapping[str, Any]) -> str:
        return ""

    async def reset(self, store: Any, target: Target) -> bool:
        return False


LEASED_LIMIT = LeasedLimitAlgorithm()
