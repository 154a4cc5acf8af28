"""Token buckets with debt and waits: the quota service's Allow API, and ``token_bucket``
on descriptor nodes.

``model`` decides, pure and clock-free; ``memory`` and ``redis`` are the two stores behind
the ``BucketStore`` (quota buckets) and ``NodeBucketStore`` (node buckets) Protocols, each
making one atomic decision per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.token_bucket.item import BucketStep
from ferryman.algorithms.token_bucket.limiter import TAG, BucketLimiter, sustained
from ferryman.algorithms.token_bucket.model import (
    BucketRef,
    BucketSpec,
    BucketState,
    BucketStore,
    NodeBucketStore,
    TakeResult,
    TakeStatus,
    decide,
)
from ferryman.algorithms.token_bucket.spec import KIND, NodeBucket, read_node_bucket
from ferryman.core.algorithm import Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.per_tenant import WAIT_STATS, TenantKeyed
from ferryman.core.rules import UnitLimit
from ferryman.stats import Stats

__all__ = [
    "TOKEN_BUCKET",
    "BucketRef",
    "BucketSpec",
    "BucketState",
    "BucketStore",
    "NodeBucket",
    "TakeResult",
    "TakeStatus",
    "TokenBucketAlgorithm",
    "decide",
]


class TokenBucketAlgorithm(TenantKeyed):
    """``token_bucket`` on a descriptor node."""

    name = KIND
    tag = TAG
    keys = (KIND,)
    shapes = True
    step_lua = (__name__, "bucket.lua", "item.lua")
    stats = WAIT_STATS

    def cannot_hold(self, limit: NodeBucket) -> str:
        if limit.spec.max_debt_millis > 0:
            return ""
        # A hit waits for the debt the hits before it left; with none allowed, none waits.
        return (
            "a token_bucket holds a hit only for the debt earlier hits left, and its "
            "max_debt_millis is 0: set max_debt_millis (at least max_wait)"
        )

    def state(self, limit: NodeBucket) -> BucketSpec:
        return limit.spec

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> NodeBucket | None:
        return read_node_bucket(ctx, fields, path)

    def describe(self, limit: NodeBucket) -> dict[str, Any]:
        spec = limit.spec
        return {
            "kind": KIND,
            "size": spec.size,
            "fill_rate": spec.fill_rate,
            "max_debt_millis": spec.max_debt_millis,
            "wait_timeout_millis": spec.wait_timeout_millis,
        }

    def text(self, described: Mapping[str, Any]) -> str:
        return (
            f"token bucket size {described['size']}, {described['fill_rate']:g} per second, "
            f"debt up to {described['max_debt_millis']}ms, "
            f"waits up to {described['wait_timeout_millis']}ms"
        )

    def rate(self, limit: NodeBucket) -> Rate | None:
        return Rate(limit.spec.fill_rate, float(limit.spec.size))

    def stepper(self, limit: NodeBucket) -> BucketStep:
        return BucketStep(limit)

    def reported(self, limit: NodeBucket) -> UnitLimit | None:
        return sustained(limit.spec)

    def limiter(self, options: EngineOptions, stats: Stats) -> BucketLimiter:
        return BucketLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> NodeBucketStore:
        from ferryman.algorithms.token_bucket.memory import MemoryNodeBuckets

        return MemoryNodeBuckets(options.clock, options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> NodeBucketStore:
        from ferryman.algorithms.token_bucket.redis import RedisNodeBuckets

        return RedisNodeBuckets(connection, options.server_time)

    async def peek(self, store: NodeBucketStore, target: Target, now: float) -> dict[str, Any]:
        spec: BucketSpec = target.state
        standing = await store.peek(target.key, spec, now)
        tokens = standing.stored - standing.debt_us * spec.fill_rate / 1e6
        return {
            "tokens": round(tokens, 3),
            "remaining": max(0, int(tokens // 1)),
            "debt_ms": round(standing.debt_us / 1000),
        }

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "tokens" not in fields:
            return ""
        text = f"{fields['tokens']:g} tokens, {fields['remaining']} left"
        if fields["debt_ms"]:
            text += f", in debt: {fields['debt_ms']}ms to wait"
            max_wait = fields.get("rule", {}).get("max_wait")
            if max_wait:
                verdict = "held" if fields["debt_ms"] <= max_wait * 1000 else "refused"
                text += f" ({verdict}: max_wait {max_wait:g}s)"
        return text


TOKEN_BUCKET = TokenBucketAlgorithm()
