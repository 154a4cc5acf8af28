"""Fixed-window counters in Redis: one ``fixed_window.lua`` call per slot a request touches.

Keys are the reference's (``<prefix><domain>_<key>_<value>_..._<window start>``), so
ferryman and envoyproxy/ratelimit pointed at one Redis count the same hits.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.crc import key_slot

from ferryman.algorithms.fixed_window.model import (
    CounterOp,
    CounterResult,
    FixedWindowStore,
    over_limit,
)
from ferryman.connections.redis import LuaScript, RedisConnection

__all__ = ["RedisFixedWindows", "RoutedFixedWindows"]


@dataclass
class _Group:
    """The ops of one call that share a Redis slot: one script call."""

    keys: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)
    index: list[int] = field(default_factory=list)


class RedisFixedWindows:
    """The fixed-window store of one Redis deployment."""

    def __init__(self, connection: RedisConnection, jitter_max: int = 0) -> None:
        self.connection = connection
        self._jitter_max = jitter_max
        self._script = LuaScript.of(__package__ or "", "fixed_window.lua")
        connection.scripts.append(self._script)

    def _ttl(self, op: CounterOp) -> int:
        if self._jitter_max > 0:
            # A whole number of seconds in [0, max): randrange does the same, more slowly.
            return op.ttl + int(random.random() * self._jitter_max)
        return op.ttl

    def _groups(self, ops: Sequence[CounterOp], stop_when_over: bool) -> list[_Group]:
        """A Cluster call's ops by slot, each group one script call."""
        flag = "1" if stop_when_over else "0"
        by_slot: dict[int, _Group] = {}
        for i, op in enumerate(ops):
            slot = key_slot(op.key.encode())
            group = by_slot.get(slot)
            if group is None:
                group = by_slot[slot] = _Group()
                group.args.append(flag)
            group.keys.append(op.key)
            group.args.extend((op.hits, op.limit, self._ttl(op)))
            group.index.append(i)
        return list(by_slot.values())

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        conn = self.connection
        single = conn.single
        if single is not None:
            # The hot path, a single Redis: one script call built in place; the pipelined
            # client keeps the time limit.
            if conn.breaker_open:
                raise conn.refuse()
            deadlines = conn.deadlines()
            command: list[Any] = ["EVALSHA", self._script.sha, len(ops)]
            command.extend([op.key for op in ops])
            command.append(conn.deadline_arg(deadlines[0]))
            command.append("1" if stop_when_over else "0")
            for op in ops:
                command.extend((op.hits, op.limit, self._ttl(op)))
            reply = await conn.on_single(single, self._script, command, deadlines)
            return [CounterResult(reply[j], reply[j + 1]) for j in range(0, 2 * len(ops), 2)]
        groups = self._groups(ops, stop_when_over)
        if stop_when_over and len(groups) > 1:
            # No script can span slots: read first, apply second, as the reference does
            # everywhere; a second round trip that only this configuration pays.
            current = await self.peek(ops)
            return await apply_only_over(
                ops, current, lambda chosen: self.apply(chosen, stop_when_over=False)
            )
        # A Cluster: one script call per slot, on the slots' nodes at once (one write each).
        if len(groups) == 1:
            raw = [await conn.run(self._script, groups[0].keys, groups[0].args)]
        else:
            raw = await conn.run_slots(self._script, [(g.keys, g.args) for g in groups])
        replies = [[int(x) for x in reply] for reply in raw]
        out: list[CounterResult | None] = [None] * len(ops)
        for group, reply in zip(groups, replies, strict=True):
            for j, i in enumerate(group.index):
                out[i] = CounterResult(reply[2 * j], reply[2 * j + 1])
        return [r for r in out if r is not None]

    async def peek(self, ops: Sequence[CounterOp]) -> list[int]:
        """The current value of each op's counter (0 when absent), without changing any."""
        if not ops:
            return []
        return await self.connection.mget([op.key for op in ops])

    async def reset(self, ops: Sequence[CounterOp]) -> int:
        # One call per key: on a Cluster the keys of a request may be on different slots.
        held = 0
        for op in ops:
            held += await self.connection.delete([op.key])
        return held


async def apply_only_over(
    ops: Sequence[CounterOp],
    current: Sequence[int],
    apply: Callable[[list[CounterOp]], Awaitable[list[CounterResult]]],
) -> list[CounterResult]:
    """Stop-when-over from values read beforehand: apply every op, or only the over ones.

    The results are those the script (and the memory store) give for the same values.
    """
    over = over_limit(ops, current)
    if not over:
        return await apply(list(ops))
    chosen = sorted(over)
    applied = dict(zip(chosen, await apply([ops[i] for i in chosen]), strict=True))
    values: dict[str, int] = {}
    out: list[CounterResult] = []
    for i, op in enumerate(ops):
        result = applied.get(i)
        if result is None:
            out.append(CounterResult(values.get(op.key, current[i]), 0))
        else:
            values[op.key] = result.after
            out.append(result)
    return out


class RoutedFixedWindows:
    """Per-second counters to one store, every other window to another (REDIS_PERSECOND)."""

    def __init__(self, main: FixedWindowStore, per_second: FixedWindowStore) -> None:
        self._main = main
        self._per_second = per_second

    @staticmethod
    def _split(ops: Sequence[CounterOp]) -> tuple[list[int], list[int]]:
        """Indexes of the ops for the main store and for the per-second store."""
        slow: list[int] = []
        fast: list[int] = []
        for i, op in enumerate(ops):
            (fast if op.ttl == 1 else slow).append(i)
        return slow, fast

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        slow, fast = self._split(ops)
        if stop_when_over and fast and slow:
            # One script cannot see both Redis: read every counter, then apply.
            current = await self.peek(ops)
            return await apply_only_over(
                ops, current, lambda chosen: self._route(chosen, stop_when_over=False)
            )
        return await self._route(ops, stop_when_over=stop_when_over)

    async def peek(self, ops: Sequence[CounterOp]) -> list[int]:
        slow, fast = self._split(ops)
        main_now, fast_now = await asyncio.gather(
            self._main.peek([ops[i] for i in slow]),
            self._per_second.peek([ops[i] for i in fast]),
        )
        current = [0] * len(ops)
        for i, value in [*zip(slow, main_now, strict=True), *zip(fast, fast_now, strict=True)]:
            current[i] = value
        return current

    async def reset(self, ops: Sequence[CounterOp]) -> int:
        slow, fast = self._split(ops)
        a = await self._main.reset([ops[i] for i in slow])
        return a + await self._per_second.reset([ops[i] for i in fast])

    async def _route(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult]:
        slow, fast = self._split(ops)
        if not fast:
            return await self._main.apply(ops, stop_when_over=stop_when_over)
        if not slow:
            return await self._per_second.apply(ops, stop_when_over=stop_when_over)
        a, b = await asyncio.gather(
            self._main.apply([ops[i] for i in slow], stop_when_over=stop_when_over),
            self._per_second.apply([ops[i] for i in fast], stop_when_over=stop_when_over),
        )
        out: list[CounterResult | None] = [None] * len(ops)
        for i, r in zip(slow, a, strict=True):
            out[i] = r
        for i, r in zip(fast, b, strict=True):
            out[i] = r
        return [r for r in out if r is not None]
