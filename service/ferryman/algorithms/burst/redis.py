"""Burst-tier state in Redis: one ``burst.lua`` call per decision, every key of a node on one
Cluster slot (the node name is the hash tag)."""

from __future__ import annotations

import math
from typing import Any

from ferryman.algorithms.burst.model import (
    BurstOutcome,
    BurstPolicy,
    BurstRequest,
    TenantView,
    view,
)
from ferryman.connections.redis import LuaScript, RedisConnection

__all__ = ["RedisBursts"]


class RedisBursts:
    """The burst-tier store of one Redis deployment."""

    def __init__(self, connection: RedisConnection, server_time: bool = True) -> None:
        self.connection = connection
        self.server_time = server_time
        self._script = LuaScript.of(__package__ or "", "burst.lua")
        self._peek = LuaScript.of(__package__ or "", "peek.lua")

    async def decide(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        policy = request.policy
        tag = "{" + request.node + "}"
        tenant = request.tenant
        keys = [f"{tag}:s:{tenant}", f"{tag}:g", f"{tag}:gt", f"{tag}:q:{tenant}"]
        keys.extend(f"{tag}:l:{tenant}:{i}" for i in range(1, len(policy.tiers) + 1))
        when = "" if now is None or self.server_time else repr(float(now))
        args: list[Any] = [
            when,
            request.copies,
            request.min_copies,
            len(policy.tiers),
            -1 if policy.hard_limit is None else policy.hard_limit,
            -1 if policy.global_limit is None else policy.global_limit,
            math.ceil(policy.horizon * 1000) + 1000,
        ]
        for tier in policy.tiers:
            args.extend(
                (
                    repr(tier.limit),
                    repr(tier.window),
                    repr(tier.active),
                    repr(tier.cooldown),
                    "1" if tier.skippable else "0",
                )
            )
        reply = await self.connection.run(self._script, keys, args)
        return BurstOutcome(
            granted=int(reply[0]),
            tier_index=int(reply[1]),
            tier_limit=int(reply[2]),
            tier_hits=int(reply[3]),
            tier_window=float(reply[4]),
            burst=bool(int(reply[5])),
            limited_by_hard_limit=bool(int(reply[6])),
            limited_by_global_limit=bool(int(reply[7])),
            tenant_last_second=int(reply[8]),
            global_last_second=int(reply[9]),
            retry_after=float(reply[10]),
        )

    async def reset(self, node: str, tenant: str, tiers: int) -> int:
        tag = "{" + node + "}"
        keys = [f"{tag}:s:{tenant}", f"{tag}:q:{tenant}"]
        keys.extend(f"{tag}:l:{tenant}:{i}" for i in range(1, tiers + 1))
        return await self.connection.delete(keys)

    async def peek(
        self, node: str, tenant: str, policy: BurstPolicy, now: float | None = None
    ) -> TenantView:
        tag = "{" + node + "}"
        n = len(policy.tiers)
        keys = [f"{tag}:s:{tenant}", f"{tag}:q:{tenant}"]
        keys.extend(f"{tag}:l:{tenant}:{i}" for i in range(1, n + 1))
        when = "" if now is None or self.server_time else repr(float(now))
        reply = await self.connection.run(self._peek, keys, [when, n])
        at = float(reply[0])
        entered = [None if not e else float(e) for e in reply[1]]
        logs = [_entries(log) for log in reply[2 : 2 + n]]
        return view(policy, entered, logs, _entries(reply[2 + n]), at)


def _entries(raw: list[Any]) -> list[tuple[float, int]]:
    """A list of "time:count" entries, as burst.lua writes them."""
    out = []
    for item in raw:
        text = item.decode() if isinstance(item, bytes) else str(item)
        when, _, count = text.partition(":")
        out.append((float(when), int(count)))
    return out
