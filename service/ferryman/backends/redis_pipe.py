"""Pipelined commands over a few long-lived redis-py connections.

Concurrent requests queue their commands; once per event-loop turn each connection writes
everything queued in one system call, and a reader task per connection hands the replies
back in order. Many requests thus share one connection and one write per batch instead of a
connection checkout and a round trip each, which is what bounds throughput on the request
path. Time limits are kept by one sweeper per client rather than a timer per call: a
connection whose oldest reply is overdue is closed and its callers get TimeoutError.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from typing import Any

import hiredis
import redis.asyncio as aioredis
import redis.exceptions as rex

__all__ = ["PipelinedRedis"]

# A connection with this many replies outstanding is not keeping up: refuse more.
MAX_IN_FLIGHT = 10_000


def _error(reply: rex.ResponseError) -> rex.ResponseError:
    """The redis-py exception for a server error reply (NOSCRIPT matters to callers)."""
    message = str(reply)
    if message.startswith("NOSCRIPT"):
        return rex.NoScriptError(message)
    return reply


class _Channel:
    """One connection, its unsent commands, and its callers waiting for replies in order."""

    def __init__(self, conn: aioredis.Connection) -> None:
        self.conn = conn
        self.waiters: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self.pending: list[bytes] = []
        self.flush_scheduled = False
        self.reader: asyncio.Task[None] | None = None
        self.closed = False

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.closed or not self.pending:
            return
        data, self.pending = self.pending, []
        writer = self.conn._writer
        if writer is None:
            self.fail(rex.ConnectionError("connection closed"))
            return
        try:
            writer.writelines(data)
        except Exception as exc:
            self.fail(rex.ConnectionError(f"write failed: {exc}"))

    def fail(self, exc: BaseException) -> None:
        self.closed = True
        self.pending.clear()
        while self.waiters:
            _, waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)


class PipelinedRedis:
    """A minimal command client (``execute``) on ``size`` pipelined connections."""

    def __init__(self, size: int, timeout: float, **connection_kwargs: Any) -> None:
        self._size = max(1, size)
        self._timeout = timeout
        self._connection_class: type[aioredis.Connection] = connection_kwargs.pop(
            "connection_class", aioredis.Connection
        )
        self._kwargs = connection_kwargs
        self._channels: list[_Channel | None] = [None] * self._size
        self._opening: list[asyncio.Task[_Channel] | None] = [None] * self._size
        self._next = itertools.cycle(range(self._size))
        self._sweeper: asyncio.Task[None] | None = None

    async def _open(self, slot: int) -> _Channel:
        conn = self._connection_class(**self._kwargs)
        async with asyncio.timeout(self._timeout):
            await conn.connect()  # type: ignore[no-untyped-call]
        channel = _Channel(conn)
        channel.reader = asyncio.create_task(self._read(channel), name="ferryman-redis-reader")
        self._channels[slot] = channel
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="ferryman-redis-sweeper")
        return channel

    async def _channel(self) -> _Channel:
        slot = next(self._next)
        channel = self._channels[slot]
        if channel is not None and not channel.closed:
            return channel
        opening = self._opening[slot]
        if opening is None or opening.done():
            opening = self._opening[slot] = asyncio.create_task(self._open(slot))
        # Shielded: a caller that gives up must not cancel a connect that others wait on.
        return await asyncio.shield(opening)

    async def _read(self, channel: _Channel) -> None:
        # Replies are parsed here with hiredis straight from the connection's stream, in
        # whatever batches they arrive, rather than one read_response() coroutine per reply.
        parser = hiredis.Reader(protocolError=rex.InvalidResponse, replyError=rex.ResponseError)
        stream = channel.conn._reader
        waiters = channel.waiters
        try:
            if stream is None:
                raise rex.ConnectionError("connection closed")
            while True:
                data = await stream.read(65536)
                if not data:
                    raise rex.ConnectionError("redis closed the connection")
                parser.feed(data)
                while True:
                    reply = parser.gets()
                    if reply is False:
                        break
                    if not waiters:
                        continue
                    _, waiter = waiters.popleft()
                    if waiter.done():
                        continue
                    if isinstance(reply, rex.ResponseError):
                        waiter.set_exception(_error(reply))
                    else:
                        waiter.set_result(reply)
        except asyncio.CancelledError:
            channel.fail(rex.ConnectionError("connection closed"))
            raise
        except Exception as exc:
            channel.fail(exc if isinstance(exc, rex.RedisError) else rex.ConnectionError(str(exc)))
            with contextlib.suppress(Exception):
                await channel.conn.disconnect(nowait=True)

    async def _sweep(self) -> None:
        interval = min(0.05, max(self._timeout / 10, 0.005))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for i, channel in enumerate(self._channels):
                if channel is None or channel.closed or not channel.waiters:
                    continue
                if channel.waiters[0][0] <= now:
                    self._channels[i] = None
                    await self._drop(
                        channel, TimeoutError(f"redis did not answer within {self._timeout}s")
                    )

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply.

        Server error replies raise ResponseError; no reply within the timeout raises
        TimeoutError (and closes that connection); a broken connection ConnectionError.
        """
        channel = await self._channel()
        if len(channel.waiters) >= MAX_IN_FLIGHT:
            raise rex.ConnectionError("redis is not keeping up")
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        channel.pending.extend(channel.conn.pack_command(*args))
        channel.waiters.append((time.monotonic() + self._timeout, waiter))
        if not channel.flush_scheduled:
            channel.flush_scheduled = True
            asyncio.get_running_loop().call_soon(channel.flush)
        return await waiter

    async def _drop(self, channel: _Channel, exc: BaseException) -> None:
        channel.fail(exc)
        if channel.reader is not None:
            channel.reader.cancel()
        with contextlib.suppress(Exception):
            await channel.conn.disconnect(nowait=True)

    async def aclose(self) -> None:
        for task in self._opening:
            if task is not None and not task.done():
                task.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
        readers = []
        for i, channel in enumerate(self._channels):
            if channel is not None:
                self._channels[i] = None
                await self._drop(channel, rex.ConnectionError("client closed"))
                if channel.reader is not None:
                    readers.append(channel.reader)
        tasks = [t for t in (*readers, self._sweeper) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        # Let the closed transports finish closing while the loop still runs.
        await asyncio.sleep(0)

    # The few commands the backend uses, named as on redis-py's client.

    async def ping(self) -> bool:
        return bool(await self.execute("PING"))

    async def script_load(self, source: str) -> str:
        sha = await self.execute("SCRIPT", "LOAD", source)
        return sha.decode() if isinstance(sha, bytes) else str(sha)

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await self.execute("EVALSHA", sha, numkeys, *keys_and_args)

    async def mget(self, keys: list[str]) -> list[Any]:
        return list(await self.execute("MGET", *keys))
