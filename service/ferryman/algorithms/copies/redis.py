"""Held copies in Redis: one ``copies.lua`` call per operation, every key of a node on one
Cluster slot (the node name is the hash tag)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ferryman.algorithms.copies.model import (
    CopyGroup,
    CopyPolicy,
    Holder,
    ReserveOutcome,
    Seized,
    Wait,
)
from ferryman.connections.redis import LuaScript, RedisConnection
from ferryman.errors import BackendError, HoldError, LeaseLostError, NotFoundError

__all__ = ["RedisCopies"]

log = logging.getLogger("ferryman.holds")


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
    queued = int(out[4 + len(groups)]) == 1
    return ReserveOutcome(int(out[1]), int(out[2]), int(out[3]), held, queued)


class RedisCopies:
    """The copy store of one Redis deployment."""

    def __init__(self, connection: RedisConnection, server_time: bool = True) -> None:
        self.connection = connection
        self.server_time = server_time
        self._script = LuaScript.of(__package__ or "", "copies.lua")
        # Transfers that copies.lua expired during this store's calls (lapsed unclaimed).
        self.transfers_expired = 0
        self._listeners: set[asyncio.Task[None]] = set()

    @property
    def pushes(self) -> bool:
        """Whether grants are announced (pub/sub on a single Redis); elsewhere the waiting
        replica asks (``granted``) now and then."""
        return self.connection.can_subscribe

    def listen(self, channel: str, wake: Callable[[str], None]) -> Callable[[], None]:
        if not self.pushes:
            return lambda: None
        task = asyncio.get_running_loop().create_task(self._listen(channel, wake))
        self._listeners.add(task)
        task.add_done_callback(self._listeners.discard)

        def stop() -> None:
            task.cancel()

        return stop

    async def _listen(self, channel: str, wake: Callable[[str], None]) -> None:
        """One subscription per replica; a lost one is made again (meanwhile a waiter learns
        of its grant when it leaves the queue, at its deadline)."""
        while True:
            try:
                async for message in self.connection.subscribe(channel):
                    wake(message.decode())
            except BackendError as exc:
                log.warning("wake-ups of held copies' waiters: %s", exc)
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        for task in list(self._listeners):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
            f"{tag}:q",
            f"{tag}:qw",
            f"{tag}:qd",
            f"{tag}:qg",
            f"{tag}:qs",
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
        wait: Wait | None = None,
    ) -> ReserveOutcome:
        args = _reserve_args(tenant, policy, groups, copies, min_copies)
        w = wait or Wait("", 0, 0, "")
        args.extend((w.id, w.priority, w.max_ms, w.channel))
        return _reserve_outcome(await self._call(holder, "reserve", args), groups)

    async def peek(
        self, holder: Holder, tenant: str, groups: tuple[CopyGroup, ...]
    ) -> tuple[ReserveOutcome, int]:
        names = [g.name for g in groups]
        out = await self._call(holder, "peek", [tenant, len(names), *names])
        held = {g.name: int(out[3 + i]) for i, g in enumerate(groups)}
        return ReserveOutcome(0, int(out[1]), int(out[2]), held), int(out[3 + len(groups)])

    async def leave(self, holder: Holder, waiter: str) -> int:
        out = await self._call(holder, "leave", [waiter])
        return int(out[1])

    async def granted(self, holder: Holder, waiters: list[str]) -> list[str]:
        """Those of ``waiters`` (queued on ``holder``'s node) granted copies."""
        out = await self._call(holder, "granted", [len(waiters), *waiters])
        return [str(w) for w in out[1:]]

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
