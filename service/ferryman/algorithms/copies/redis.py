"""Held copies in Redis: one ``copies.lua`` call per operation, every key of a node on one
Cluster slot (the node name is the hash tag)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferryman.algorithms.copies.model import (
    CopyGroup,
    CopyPolicy,
    Holder,
    ReserveOutcome,
    Seized,
)
from ferryman.connections.redis import LuaScript, RedisConnection
from ferryman.errors import HoldError, LeaseLostError, NotFoundError

__all__ = ["RedisCopies"]


def _reserve_args(
    tenant: str, policy: CopyPolicy, groups: tuple[CopyGroup, ...], copies: int, min_copies: int
) -> list[Any]:
    """The ARGV tail of copies.lua's reserve and ereserve."""
    args: list[Any] = [
        tenant,
        copies,
        min_copies,
        -1 if policy.limit is None else policy.limit,
        -1 if policy.global_limit is None else policy.global_limit,
        len(groups),
    ]
    for group in groups:
        args.extend((group.name, group.limit))
    return args


def _reserve_outcome(out: list[Any], groups: tuple[CopyGroup, ...]) -> ReserveOutcome:
    held = {g.name: int(out[4 + i]) for i, g in enumerate(groups)}
    return ReserveOutcome(int(out[1]), int(out[2]), int(out[3]), held)


class RedisCopies:
    """The copy store of one Redis deployment."""

    def __init__(self, connection: RedisConnection, server_time: bool = True) -> None:
        self.connection = connection
        self.server_time = server_time
        self._script = LuaScript.of(__package__ or "", "copies.lua")
        # Transfers that copies.lua expired during this store's calls (lapsed unclaimed).
        self.transfers_expired = 0

    async def _call(
        self,
        holder: Holder,
        op: str,
        args: list[Any],
        transfer_id: str = "-",
        tenant: str = "-",
    ) -> list[Any]:
        server, now = holder.server, holder.now
        tag = "{" + holder.node + "}"
        keys = [
            f"{tag}:n",
            f"{tag}:srv",
            f"{tag}:c:{server}",
            f"{tag}:xq",
            f"{tag}:x:{transfer_id}",
            f"{tag}:dead",
            f"{tag}:eq",
            f"{tag}:eh",
            f"{tag}:et:{tenant}",
        ]
        when = "" if now is None or self.server_time else str(round(now * 1000))
        reply = await self.connection.run(
            self._script, keys, [op, server, holder.lease_ms, tag, when, *args]
        )
        out = [x.decode() if isinstance(x, bytes) else x for x in reply]
        # The last element: transfers this call expired (copies.lua reports it in every reply).
        self.transfers_expired += int(out.pop())
        if out[0] == "lease_lost":
            raise LeaseLostError(f"the lease of server {server} lapsed; its holds were freed")
        return out

    async def reserve(
        self,
        holder: Holder,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        min_copies: int,
    ) -> ReserveOutcome:
        args = _reserve_args(tenant, policy, groups, copies, min_copies)
        return _reserve_outcome(await self._call(holder, "reserve", args), groups)

    async def release(
        self, holder: Holder, tenant: str, groups: tuple[str, ...], copies: int
    ) -> None:
        out = await self._call(holder, "release", [tenant, copies, len(groups), *groups])
        if out[0] == "over":
            raise HoldError("copies", f"{copies} is more than this server holds ({out[1]})")

    async def transfer(
        self,
        holder: Holder,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        ttl: float,
        transfer_id: str,
    ) -> None:
        args = [tenant, copies, len(groups), *groups, round(ttl * 1000), transfer_id]
        out = await self._call(holder, "transfer", args, transfer_id)
        if out[0] == "over":
            raise HoldError("copies", f"{copies} is more than this server holds ({out[1]})")

    async def seize(self, holder: Holder, transfer_id: str) -> Seized:
        out = await self._call(holder, "seize", [transfer_id], transfer_id)
        if out[0] == "missing":
            raise NotFoundError("transfer_id", "unknown or expired transfer")
        return Seized(holder.node, str(out[1]), int(out[2]), tuple(str(g) for g in out[3:]))

    async def renew(self, holder: Holder) -> None:
        await self._call(holder, "renew", [])

    async def trim(self, holder: Holder, keep: Mapping[str, int]) -> int:
        args: list[Any] = [len(keep)]
        for field, copies in sorted(keep.items()):
            args.extend((field, copies))
        out = await self._call(holder, "trim", args)
        return int(out[1])

    async def envoy_reserve(
        self,
        holder: Holder,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        hold_id: str,
    ) -> ReserveOutcome:
        args = _reserve_args(tenant, policy, groups, copies, copies)
        args.extend((hold_id, round(policy.hold_ttl * 1000)))
        out = await self._call(holder, "ereserve", args, tenant=tenant)
        return _reserve_outcome(out, groups)

    async def envoy_release(self, holder: Holder, tenant: str, copies: int) -> int:
        out = await self._call(holder, "erelease", [tenant, copies], tenant=tenant)
        return int(out[1])
