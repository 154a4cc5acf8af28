"""Charon's held resources: a distributed counting semaphore per tenant, group and node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.copies.limiter import HoldLimiter, node_name
from ferryman.algorithms.copies.model import CopyPolicy, CopyStore, Holder
from ferryman.algorithms.copies.spec import read_copies
from ferryman.core.algorithm import AlgorithmBase, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.rules import Rule
from ferryman.errors import RequestError
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

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        node = node_name(options.cache_key_prefix, path[-1])
        tenant = "_".join(v for _, v in entries)
        return Target(f"{node} {tenant}", (node, tenant, path[-1].limit))

    async def peek(self, store: CopyStore, target: Target, now: float) -> dict[str, Any]:
        node, tenant, policy = target.state
        groups = policy.groups_of(tenant)
        seen, waiting = await store.peek(Holder(node, "explain", 0, now), tenant, groups)
        return {
            "tenant": tenant,
            "tenant_held": seen.tenant_held,
            "global_held": seen.global_held,
            "groups": dict(seen.group_held),
            "waiting": waiting,
        }

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "waiting" not in fields:
            return ""
        groups = "".join(f", {n} in group {g}" for g, n in fields["groups"].items())
        return (
            f"{fields['tenant_held']} held by the tenant, {fields['global_held']} by all"
            f"{groups}; {fields['waiting']} waiting in the node's queue"
        )

    async def reset(self, store: CopyStore, target: Target) -> bool:
        raise RequestError(
            "descriptor",
            f"{target.key} is held copies, which live sessions hold; they are freed when the "
            "sessions release them or end, not reset",
        )

    def limiter(self, options: EngineOptions, stats: Stats) -> HoldLimiter:
        return HoldLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> CopyStore:
        from ferryman.algorithms.copies.memory import MemoryCopies

        return MemoryCopies(options.clock, options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> CopyStore:
        from ferryman.algorithms.copies.redis import RedisCopies

        return RedisCopies(connection, options.server_time)


COPIES = CopiesAlgorithm()
