"""GCRA in Redis: one ``gcra.lua`` call per decision (``gcra_core.lua`` in front of it), one
string per tenant, expiring when its bucket is full again (the engine's keys carry their
own hash tag, so a Cluster runs each call on one node)."""

from __future__ import annotations

from typing import Any

from ferryman.algorithms.gcra.model import GcraParams, GcraResult
from ferryman.connections.redis import LuaScript, RedisConnection
from ferryman.errors import BackendError

__all__ = ["RedisGcra"]


class RedisGcra:
    """``server_time`` decides on Redis time (TIME); otherwise on the ``now`` the engine
    sends."""

    name = "redis"

    def __init__(self, connection: RedisConnection, server_time: bool = True) -> None:
        self._connection = connection
        self._script = LuaScript.of(__package__ or "", "gcra_core.lua", "gcra.lua")
        connection.scripts.append(self._script)
        self._server_time = server_time

    async def take(
        self, key: str, params: GcraParams, cost: int, max_wait_us: int, now: float
    ) -> GcraResult:
        at = "" if self._server_time else str(round(now * 1_000_000))
        return await self.take_at(key, params, cost, max_wait_us, at)

    async def peek(self, key: str, params: GcraParams, now: float) -> GcraResult:
        """A take of no cost, which writes nothing."""
        return await self.take(key, params, 0, 0, now)

    async def reset(self, key: str) -> int:
        return await self._connection.delete([key])

    async def take_at(
        self, key: str, params: GcraParams, cost: int, max_wait_us: int, now: str
    ) -> GcraResult:
        """``take`` at ``now`` (microseconds as text; "" for the Redis server's clock)."""
        args: list[Any] = [now, params.step, params.den, params.burst, cost, max_wait_us]
        reply = await self._connection.run(self._script, [key], args)
        try:
            allowed, wait, remaining, full, retry = (int(v) for v in reply)
        except (TypeError, ValueError) as exc:
            raise BackendError(f"gcra script: unexpected reply {reply!r}") from exc
        return GcraResult(allowed == 1, wait, remaining, full, retry)
