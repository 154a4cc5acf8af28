"""Nodes' limits in Redis: one ``limits.lua`` call per decision, one hash per node and
tenant (the engine's keys carry their own hash tag, so a Cluster runs it on one node). The
script is the kinds' steps followed by ``limits.lua``, put together once."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from ferryman.algorithms.limit_list.model import Checked, Part
from ferryman.connections.redis import LuaScript, RedisConnection
from ferryman.core.algorithm import Step
from ferryman.errors import BackendError

__all__ = ["RedisLimits", "script"]


def script(steps: Sequence[tuple[str, ...]]) -> LuaScript:
    """The script with the Lua steps ``steps`` (package, files) in front of its own text."""
    text = "local STEPS = {}\n" + "".join(
        resources.files(package).joinpath(name).read_text("utf-8")
        for package, *names in steps
        for name in names
    )
    return LuaScript.of(__package__ or "", "limits.lua", prefix=text)


class RedisLimits:
    """``server_time`` decides on Redis time; otherwise on the ``now`` the engine sends."""

    name = "redis"

    def __init__(
        self, connection: RedisConnection, steps: Sequence[tuple[str, ...]], server_time: bool
    ) -> None:
        self._connection = connection
        self._script = script(steps)
        connection.scripts.append(self._script)
        self._server_time = server_time

    async def check(self, key: str, parts: Sequence[Part], cost: int, now: float) -> Checked:
        args: list[Any] = ["" if self._server_time else str(round(now * 1e6)), cost, len(parts)]
        for part in parts:
            args.extend((part.field, part.stepper.kind, len(part.args)))
            args.extend(format(v, ".17g") for v in part.args)
        reply = await self._connection.run(self._script, [key], args)
        try:
            steps = tuple(
                Step(int(reply[i]) == 1, (), int(reply[i + 1]), float(_text(reply[i + 2])), 0.0)
                for i in range(1, 3 * len(parts), 3)
            )
            return Checked(int(reply[0]) == 1, steps)
        except (TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"limits script: unexpected reply {reply!r}") from exc

    async def reset(self, key: str) -> int:
        return await self._connection.delete([key])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
