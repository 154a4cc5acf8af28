"""Cost budgets in Redis: one ``cost_budget.lua`` call per request (per slot on a Cluster).

A tenant's four keys share its hash tag, so a Cluster runs a tenant's operations on one
node. A request whose budgets sit on several slots sends one call per slot at once; when
any of them refuses, the reservations the others took are cancelled by a second call (the
refusal's price, paid only on a Cluster).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from redis.crc import key_slot

from ferryman.algorithms.cost_budget.model import (
    CANCEL,
    RESERVE,
    BudgetOp,
    BudgetResult,
    BudgetView,
)
from ferryman.connections.redis import LuaScript, RedisConnection
from ferryman.errors import BackendError

__all__ = ["RedisBudgets", "tenant_keys"]

_FIELDS = 9


def tenant_keys(key: str) -> list[str]:
    """A tenant's hash, open reservations, estimates and settled ids."""
    return [key, key + ":open", key + ":estimates", key + ":settled"]


def _args(op: BudgetOp) -> list[Any]:
    return [
        op.mode,
        op.request_id,
        op.amount,
        op.cap,
        op.window,
        op.start_ms,
        op.end_ms,
        op.ttl_ms,
        op.max_open,
        op.owner,
        1 if op.delegate else 0,
    ]


class RedisBudgets:
    """``server_time`` expires reservations on Redis time; otherwise on the ``now`` the
    engine sends."""

    name = "redis"

    def __init__(self, connection: RedisConnection, server_time: bool = True) -> None:
        self._connection = connection
        self._script = LuaScript.of(__package__ or "", "cost_budget.lua")
        connection.scripts.append(self._script)
        self._server_time = server_time

    def _now(self, now: float) -> str:
        return "" if self._server_time else str(round(now * 1000))

    async def _run(self, ops: Sequence[BudgetOp], now: float) -> list[BudgetResult]:
        keys: list[str] = []
        args: list[Any] = [self._now(now), "apply"]
        for op in ops:
            keys.extend(tenant_keys(op.key))
            args.extend(_args(op))
        reply = await self._connection.run(self._script, keys, args)
        try:
            values = [int(v) for v in reply]
            return [
                BudgetResult(bool(v[0]), bool(v[1]), v[2], v[3], v[4], v[5], v[6], v[7], bool(v[8]))
                for v in (values[i : i + _FIELDS] for i in range(0, len(values), _FIELDS))
            ]
        except (TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"cost budget script: unexpected reply {reply!r}") from exc

    async def apply(self, ops: Sequence[BudgetOp], now: float) -> list[BudgetResult]:
        if self._connection.single is not None:
            return await self._run(ops, now)
        slots: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            slots.setdefault(key_slot(op.key.encode()), []).append(i)
        groups = list(slots.values())
        if len(groups) == 1:
            return await self._run(ops, now)
        replies = await asyncio.gather(*(self._run([ops[i] for i in g], now) for g in groups))
        out: list[BudgetResult | None] = [None] * len(ops)
        for group, results in zip(groups, replies, strict=True):
            for i, result in zip(group, results, strict=True):
                out[i] = result
        found = [r for r in out if r is not None]
        return await self._undo(ops, found, now)

    async def _undo(
        self, ops: Sequence[BudgetOp], results: list[BudgetResult], now: float
    ) -> list[BudgetResult]:
        """All or none across slots: the reservations taken beside a refusal, cancelled."""
        if all(r.admitted for r in results):
            return results
        taken = [i for i, op in enumerate(ops) if op.mode == RESERVE and results[i].applied]
        if taken:
            await asyncio.gather(*(self._run([replace(ops[i], mode=CANCEL)], now) for i in taken))
        for i in taken:
            r = results[i]
            left = r.reserved - ops[i].amount
            results[i] = replace(r, applied=False, reserved=left, open=r.open - 1)
        return results

    async def peek(self, op: BudgetOp, now: float) -> BudgetView:
        args = [self._now(now), "peek", *_args(op)]
        reply = await self._connection.run(self._script, tenant_keys(op.key), args)
        try:
            return BudgetView(int(reply[0]), int(reply[1]), int(reply[2]))
        except (TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"cost budget script: unexpected reply {reply!r}") from exc

    async def reset(self, key: str) -> int:
        return 1 if await self._connection.delete(tenant_keys(key)) else 0
