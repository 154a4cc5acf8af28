"""Charon's held resources: a distributed counting semaphore per tenant, group and node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.copies.limiter import HoldLimiter, node_name
from ferryman.algorithms.copies.model import CopyPolicy, CopyStore
from ferryman.algorithms.copies.spec import read_copies
from ferryman.core.algorithm import AlgorithmBase, StoreOptions
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.stats import Stats

__all__ = ["COPIES", "CopiesAlgorithm", "CopyPolicy", "node_name"]


class CopiesAlgorithm(AlgorithmBase):
    """``copies``: copies held until given back, by sessions (ferryman.v1) or by Envoy
    (hits on a request, the same negative hits when its stream ends)."""

    name = CopyPolicy.kind
    keys = ("copies",)
    #: Hits are held until given back: Envoy sends the same hits negative at stream end.
    held = True

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> CopyPolicy | None:
        return read_copies(ctx, fields, path)

    def describe(self, limit: CopyPolicy) -> dict[str, Any]:
        return {"kind": self.name, "copies": limit.describe()}

    def text(self, described: Mapping[str, Any]) -> str:
        return str(described["copies"])

    def limiter(self, options: EngineOptions, stats: Stats) -> HoldLimiter:
        return HoldLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> CopyStore:
        from ferryman.algorithms.copies.memory import MemoryCopies

        return MemoryCopies(options.clock)

    def redis_store(self, connection: Any, options: StoreOptions) -> CopyStore:
        from ferryman.algorithms.copies.redis import RedisCopies

        return RedisCopies(connection, options.server_time)


COPIES = CopiesAlgorithm()
