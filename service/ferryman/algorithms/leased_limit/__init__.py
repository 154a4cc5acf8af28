"""Lease-sized limits (``leased_limit``): a node allows, in each second, as many hits as
this server's lease on its resource from its parent, decided in process with no store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.leased_limit.limiter import LeasedLimiter, LeaseReader
from ferryman.algorithms.leased_limit.spec import KIND, LeasedLimit, read_leased_limit
from ferryman.core.algorithm import AlgorithmBase, StoreOptions
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.stats import Stats

__all__ = ["LEASED_LIMIT", "LeaseReader", "LeasedLimit", "LeasedLimitAlgorithm", "LeasedLimiter"]


class LeasedLimitAlgorithm(AlgorithmBase):
    """``leased_limit`` on a descriptor node."""

    name = KIND
    keys = (KIND,)

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> LeasedLimit | None:
        return read_leased_limit(ctx, fields, path)

    def describe(self, limit: LeasedLimit) -> dict[str, Any]:
        return {"kind": KIND, "resource": limit.resource, "safe_capacity": limit.safe_capacity}

    def text(self, described: Mapping[str, Any]) -> str:
        return f"per second as leased on {described['resource']}"

    def limiter(self, options: EngineOptions, stats: Stats) -> LeasedLimiter:
        return LeasedLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> None:
        return None

    def redis_store(self, connection: Any, options: StoreOptions) -> None:
        return None


LEASED_LIMIT = LeasedLimitAlgorithm()
