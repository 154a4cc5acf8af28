"""Sliding-window counters in Redis: one ``sliding_window.lua`` call per decision, one hash
per key (the engine's keys carry their own hash tag, so a Cluster runs it on one node)."""

from __future__ import annotations

from typing import Any

from ferryman.algorithms.sliding_window.model import SlidingResult
from ferryman.connections.redis import LuaScript, RedisConnection
from ferryman.errors import BackendError

__all__ = ["RedisSlidingWindows"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisSlidingWindows:
    """``server_time`` decides on Redis time; otherwise on the ``now`` the engine sends."""

    name = "redis"

    def __init__(self, connection: RedisConnection, server_time: bool = True) -> None:
        self._connection = connection
        self._script = LuaScript.of(__package__ or "", "sliding_window.lua")
        connection.scripts.append(self._script)
        self._server_time = server_time

    async def hit(
        self, key: str, limit: int, window_us: int, hits: int, now: float
    ) -> SlidingResult:
        return await self.hit_at(
            key,
            limit,
            window_us,
            hits,
            "" if self._server_time else str(round(now * 1e6)),
        )

    async def peek(self, key: str, limit: int, window_us: int, now: float) -> SlidingResult:
        at = "" if self._server_time else str(round(now * 1e6))
        return await self.hit_at(key, limit, window_us, 0, at, peek=True)

    async def reset(self, key: str) -> int:
        return await self._connection.delete([key])

    async def hit_at(
        self, key: str, limit: int, window_us: int, hits: int, now: str, peek: bool = False
    ) -> SlidingResult:
        """``hit`` at ``now`` (microseconds as text; "" for the Redis server's clock);
        ``peek`` writes nothing."""
        args: list[Any] = [now, limit, window_us, hits]
        if peek:
            args.append("peek")
        reply = await self._connection.run(self._script, [key], args)
        try:
            return SlidingResult(int(reply[0]) == 1, float(_text(reply[1])), int(reply[2]))
        except (TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"sliding window script: unexpected reply {reply!r}") from exc
