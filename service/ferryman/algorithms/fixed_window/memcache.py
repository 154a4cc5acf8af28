"""Fixed-window counters in memcached (BACKEND_TYPE=memcache), as the reference keeps them.

Keys are the reference's (``<prefix><domain>_<key>_<value>_..._<window start>``, the same
as in Redis) and go to ``MEMCACHE_HOST_PORT``'s servers the way its client picks them (the
CRC-32 of the key, modulo the number of servers). A counter is created with ``add`` and
the window's expiry (plus jitter), then moved with ``incr`` / ``decr``, whose answer is the
value after the request: each counter is exact, though a request's counters are not
changed together as one Redis script changes them.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence

from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult, over_limit
from ferryman.connections.memcache import MemcacheServer
from ferryman.errors import BackendError

__all__ = ["MemcacheFixedWindows"]


class MemcacheFixedWindows:
    """The fixed-window store over memcached servers."""

    def __init__(self, servers: Sequence[MemcacheServer], jitter_max: int = 0) -> None:
        self._servers = list(servers)
        self._jitter_max = jitter_max
        self.healthy = True

    def _server(self, key: str) -> MemcacheServer:
        servers = self._servers
        if len(servers) == 1:
            return servers[0]
        return servers[zlib.crc32(key.encode()) % len(servers)]

    def _ttl(self, op: CounterOp) -> int:
        if self._jitter_max > 0:
            return op.ttl + random.randrange(self._jitter_max)
        return op.ttl

    async def _get(self, keys: Sequence[str]) -> dict[str, int]:
        by_server: dict[int, list[str]] = {}
        for key in dict.fromkeys(keys):
            by_server.setdefault(id(self._server(key)), []).append(key)
        found: dict[str, int] = {}
        for group in by_server.values():
            server = self._server(group[0])
            answers = await server.run([b"get " + k.encode() + b"\r\n" for k in group], len(group))
            for key, value in zip(group, answers, strict=True):
                found[key] = int(value) if value.isdigit() else 0
        return found

    async def peek(self, ops: Sequence[CounterOp]) -> list[int]:
        """The current value of each op's counter (0 when absent), changing nothing."""
        values = await self._get([op.key for op in ops])
        return [values.get(op.key, 0) for op in ops]

    async def reset(self, ops: Sequence[CounterOp]) -> int:
        held = 0
        for op in ops:
            [line] = await self._server(op.key).run([b"delete " + op.key.encode() + b"\r\n"])
            held += line == b"DELETED"
        return held

    async def _change(self, op: CounterOp) -> int:
        """Apply one op; the counter's value after it."""
        server = self._server(op.key)
        key = op.key.encode()
        if op.hits < 0:
            [line] = await server.run([b"decr %s %d\r\n" % (key, -op.hits)])
            return int(line) if line.isdigit() else 0
        for _ in range(2):
            [line] = await server.run([b"incr %s %d\r\n" % (key, op.hits)])
            if line.isdigit():
                return int(line)
            # NOT_FOUND: create it with the window's expiry; NOT_STORED means another
            # writer created it first, so increment again.
            [line] = await server.run(
                [b"add %s 0 %d %d\r\n%d\r\n" % (key, self._ttl(op), len(str(op.hits)), op.hits)]
            )
            if line == b"STORED":
                return op.hits
        raise BackendError(f"memcached {server}: counter {op.key} could not be created")

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        try:
            results = await self._apply(ops, stop_when_over)
        except BackendError:
            self.healthy = False
            raise
        self.healthy = True
        return results

    async def _apply(self, ops: Sequence[CounterOp], stop_when_over: bool) -> list[CounterResult]:
        skip: set[int] = set()
        read = [op.key for i, op in enumerate(ops) if op.hits == 0]
        if stop_when_over:
            current = await self._get([op.key for op in ops])
            over = over_limit(ops, [current[op.key] for op in ops])
            if over:
                skip = set(range(len(ops))) - over
            read = [ops[i].key for i in skip] + read
        values = await self._get(read) if read else {}
        results: list[CounterResult] = []
        for i, op in enumerate(ops):
            if i in skip or op.hits == 0:
                results.append(CounterResult(values.get(op.key, 0), 0))
                continue
            after = await self._change(op)
            # A give-back reports only the value after it (the engine reads nothing else).
            results.append(CounterResult(after, max(op.hits, 0)))
        return results

    async def close(self) -> None:
        for server in self._servers:
            await server.close()
