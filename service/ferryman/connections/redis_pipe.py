"""Pipelined commands over one long-lived Redis connection.

Concurrent requests queue their commands; the connection writes everything queued in one
system call per batch, and replies are parsed by hiredis in whatever chunks they arrive and
handed back in order. Many requests thus share one connection and one write instead of a
connection checkout and a round trip each, which is what bounds throughput on the request
path.

redis-py opens the connection and does the handshake (TLS, AUTH, SELECT); the connection's
transport then gets a small protocol of ours, so that a chunk of replies is parsed in the
event loop's read callback itself, with no stream buffer and no reader task in between.

Batches: by default a command is written at the end of the event-loop turn that queued it,
together with every other command queued on its connection in that turn, so the scripts
that one request starts at once (a request mixing fixed windows, burst tiers and held
copies) leave in one write, one round trip.

A pipeline window (the reference's REDIS_PIPELINE_WINDOW) makes a busy connection write at
most once per window: a command queued less than a window after the connection's last
write waits for the rest of the window, so that under heavy concurrent load each write and
each Redis wake-up carries many commands; a connection that has not written for a window
writes at once. A pipeline limit (REDIS_PIPELINE_LIMIT) writes a batch as soon as it holds
that many commands.

Time limits are kept by one sweeper per client rather than a timer per call: a connection
whose oldest reply is overdue is closed and its callers get TimeoutError. A caller with a
shorter deadline of its own (``execute(..., by=...)``) gets DeadlineError when the deadline
passes, from one timer per connection armed at the earliest deadline still to come (not a
timer per call); the connection stays open, and the command, if Redis ever runs it, finds
its own deadline passed and changes nothing (see ``LuaScript``).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import time
from collections import deque
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
import redis.exceptions as rex
from hiredis import pack_command as _hiredis_pack

__all__ = ["DeadlineError", "PipelinedRedis", "pack_command"]

# A connection with this many replies outstanding is not keeping up: refuse more.
MAX_IN_FLIGHT = 10_000
# After a failed connect, callers are refused at once for a while before the next try:
# doubling from BASE to CAP, each wait drawn between half and all of it. So a server
# (a Cluster node) that refuses connections gets a few attempts a second, not one per call.
RECONNECT_BASE = 0.05
RECONNECT_CAP = 3.0


class DeadlineError(TimeoutError):
    """No reply before the caller's own deadline (the connection is not to blame yet)."""


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(DeadlineError("no reply from redis before the caller's deadline"))


def retrieve(task: asyncio.Future[Any]) -> None:
    """Done callback: mark a shared task's exception as seen (its waiters may all be gone)."""
    if not task.cancelled():
        task.exception()


def _error(reply: rex.ResponseError) -> rex.ResponseError:
    """The redis-py exception for a server error reply (NOSCRIPT and READONLY matter)."""
    message = str(reply)
    if message.startswith("NOSCRIPT"):
        return rex.NoScriptError(message)
    if message.startswith("READONLY"):
        return rex.ReadOnlyError(message)
    return reply


def pack_command(args: tuple[Any, ...]) -> bytes:
    """One command in RESP: an array of bulk strings (str as UTF-8, int and float as text).

    hiredis packs exact str, int, float and bytes in C; anything else (subclasses such as
    enums, refused bools and objects) goes through the Python packer below."""
    try:
        packed: bytes = _hiredis_pack(args)
        return packed
    except TypeError:
        return _pack(args)


def _pack(args: tuple[Any, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    append = out.append
    for arg in args:
        kind = type(arg)
        # Exact types first: the request path sends only str and int.
        if kind is str:
            data = arg.encode()
        elif kind is int:
            data = b"%d" % arg
        elif kind is bytes:
            data = arg
        elif isinstance(arg, bool):
            raise rex.DataError(f"cannot send {kind.__name__} to redis: {arg!r}")
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, int):
            data = b"%d" % int(arg)
        elif isinstance(arg, (bytes, bytearray, memoryview)):
            data = bytes(arg)
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            raise rex.DataError(f"cannot send {kind.__name__} to redis: {arg!r}")
        append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Channel(asyncio.Protocol):
    """One connection: its unsent commands and its callers waiting for replies in order."""

    def __init__(self, conn: aioredis.Connection, window: float = 0.0, limit: int = 0) -> None:
        self.conn = conn
        self.window = window  # seconds between writes on a busy connection (0: every turn)
        self.limit = limit  # commands that make a batch full (0: no limit)
        self.transport: asyncio.Transport | None = None
        self.parser = hiredis.Reader(
            protocolError=rex.InvalidResponse, replyError=rex.ResponseError
        )
        self.waiters: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self.pending: list[bytes] = []
        self.flush_scheduled = False
        self.timer: asyncio.TimerHandle | None = None
        self.writes = 0  # batches written
        self.commands = 0  # commands written
        self.last_write = float("-inf")
        self.closed = False
        self.late = 0  # replies "LATE" to callers that had given up: scripts that did nothing
        # Callers' own deadlines: (by, sequence, waiter), the earliest first; entries whose
        # reply came are dropped when they reach the top, so the heap holds at most the
        # calls of the longest caller deadline.
        self.deadlines: list[tuple[float, int, asyncio.Future[Any]]] = []
        self.watched = 0
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.deadline_at = 0.0

    def attach(self) -> None:
        """Take over the connection's transport once redis-py's handshake is done."""
        writer, reader = self.conn._writer, self.conn._reader
        if writer is None or reader is None:
            raise rex.ConnectionError("connection closed")
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, writer.transport)
        self.transport = transport
        # Nothing was asked after the handshake, so nothing can be buffered; be safe anyway.
        leftover = bytes(getattr(reader, "_buffer", b""))
        transport.set_protocol(self)
        if leftover:
            self.data_received(leftover)

    # -- asyncio.Protocol -----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        waiters = self.waiters
        parser.feed(data)
        try:
            while True:
                reply = parser.gets()
                if reply is False:
                    break
                if not waiters:
                    continue
                _, waiter = waiters.popleft()
                if waiter.done():
                    if isinstance(reply, rex.ResponseError) and str(reply).startswith("LATE"):
                        self.late += 1
                    continue
                if isinstance(reply, rex.ResponseError):
                    error = _error(reply)
                    waiter.set_exception(error)
                    if isinstance(error, rex.ReadOnlyError):
                        # A master turned replica (a failover): connect again, which asks
                        # Sentinel (or DNS) where the master is now.
                        self.close(rex.ConnectionError(f"redis is read-only now: {error}"))
                        return
                else:
                    waiter.set_result(reply)
        except rex.RedisError as exc:
            self.close(exc)

    def eof_received(self) -> bool:
        self.close(rex.ConnectionError("redis closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection lost: {exc}" if exc is not None else "redis closed the connection"
        self.fail(rex.ConnectionError(reason))
        self._detach()

    # -- callers' deadlines -----------------------------------------------------------------

    def watch(self, by: float, waiter: asyncio.Future[Any]) -> None:
        """Give ``waiter`` DeadlineError at ``by`` (monotonic) unless its reply comes first."""
        if waiter.done():  # refused by a closed connection
            return
        self.watched += 1
        heapq.heappush(self.deadlines, (by, self.watched, waiter))
        if self.deadline_timer is None or by < self.deadline_at:
            self._arm(by)

    def _arm(self, at: float) -> None:
        if self.deadline_timer is not None:
            self.deadline_timer.cancel()
        self.deadline_at = at
        self.deadline_timer = asyncio.get_running_loop().call_at(at, self._expire_due)

    def _expire_due(self) -> None:
        self.deadline_timer = None
        heap = self.deadlines
        # The timer's own time counts as reached: uvloop rounds timers to the millisecond,
        # and one that fires a little early must not spin until the clock catches up.
        now = max(time.monotonic(), self.deadline_at)
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            _expire(heapq.heappop(heap)[2])
        if heap:
            self._arm(heap[0][0])

    # -- writing ------------------------------------------------------------------------------

    def queue(self, command: bytes, waiter: asyncio.Future[Any], deadline: float) -> None:
        if self.closed:  # closed since the caller found it open: nothing would answer
            waiter.set_exception(rex.ConnectionError("connection closed"))
            return
        pending = self.pending
        pending.append(command)
        self.waiters.append((deadline, waiter))
        if self.limit and len(pending) >= self.limit:
            self.flush()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            loop = asyncio.get_running_loop()
            wait = self.last_write + self.window - loop.time() if self.window else 0.0
            if wait > 0:
                self.timer = loop.call_later(wait, self.flush)
            else:
                loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.closed or not self.pending:
            return
        data, self.pending = self.pending, []
        if self.window:
            self.last_write = asyncio.get_running_loop().time()
        transport = self.transport
        if transport is None or transport.is_closing():
            self.fail(rex.ConnectionError("connection closed"))
            return
        self.writes += 1
        self.commands += len(data)
        try:
            transport.write(data[0] if len(data) == 1 else b"".join(data))
        except Exception as exc:
            self.close(rex.ConnectionError(f"write failed: {exc}"))

    # -- ending ------------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """Refuse new commands and give every waiting caller ``exc``."""
        self.closed = True
        self.pending.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.deadline_timer is not None:
            self.deadline_timer.cancel()
            self.deadline_timer = None
        self.deadlines.clear()
        while self.waiters:
            _, waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)

    def close(self, exc: BaseException) -> None:
        self.fail(exc)
        if self.transport is not None:
            self.transport.abort()
        self._detach()

    def _detach(self) -> None:
        # The connection object no longer owns the transport: it must not try to close it.
        self.conn._reader = None
        self.conn._writer = None


class PipelinedRedis:
    """A minimal command client (``execute``) on one pipelined connection, opened on first
    use and again after it breaks. Redis runs one command at a time, so more connections
    would add no capacity, only split the batches.

    ``window`` (seconds) and ``limit`` (commands) shape the batches, see the module's text.
    """

    def __init__(
        self,
        timeout: float,
        *,
        window: float = 0.0,
        limit: int = 0,
        **connection_kwargs: Any,
    ) -> None:
        self._timeout = timeout
        self._window = max(0.0, window)
        self._limit = max(0, limit)
        self._connection_class: type[aioredis.Connection] = connection_kwargs.pop(
            "connection_class", aioredis.Connection
        )
        self._kwargs = connection_kwargs
        self._link: _Channel | None = None
        self._opening: asyncio.Task[_Channel] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._writes_before = 0  # batches written on connections since closed
        self._commands_before = 0
        self._late_before = 0
        self.connects = 0  # connection attempts
        self._retry_at = 0.0  # monotonic: no connect attempt before, after a failed one
        self._retry_delay = 0.0
        self._last_error: BaseException | None = None

    async def _open(self) -> _Channel:
        self.connects += 1
        conn = self._connection_class(**self._kwargs)
        try:
            async with asyncio.timeout(self._timeout):
                await conn.connect()  # type: ignore[no-untyped-call]
            channel = _Channel(conn, self._window, self._limit)
            channel.attach()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                delay = self._retry_delay = min(
                    RECONNECT_CAP, max(RECONNECT_BASE, self._retry_delay * 2)
                )
                self._retry_at = time.monotonic() + random.uniform(delay / 2, delay)
                self._last_error = exc
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            raise
        self._retry_delay = 0.0
        self._forget()
        self._link = channel
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="ferryman-redis-sweeper")
        return channel

    def _forget(self) -> None:
        """Drop the connection in hand (closed or given up on), keeping its count of writes."""
        if self._link is not None:
            self._writes_before += self._link.writes
            self._commands_before += self._link.commands
            self._late_before += self._link.late
            self._link = None

    @property
    def writes(self) -> int:
        """Batches written so far (each is one round trip)."""
        return self._writes_before + (self._link.writes if self._link is not None else 0)

    @property
    def commands(self) -> int:
        """Commands written so far."""
        return self._commands_before + (self._link.commands if self._link is not None else 0)

    @property
    def late(self) -> int:
        """Scripts that Redis ran after their deadline, and that therefore changed nothing."""
        return self._late_before + (self._link.late if self._link is not None else 0)

    async def _connected(self, by: float | None = None, force: bool = False) -> _Channel:
        """The open connection, opening it (once, for every caller waiting) when needed;
        a caller waits no later than ``by`` (monotonic). Soon after a failed connect,
        ConnectionError at once (unless ``force``: a health probe)."""
        opening = self._opening
        if opening is None or opening.done():
            if not force and time.monotonic() < self._retry_at:
                raise rex.ConnectionError(f"not connecting again yet: {self._last_error}")
            opening = self._opening = asyncio.create_task(self._open())
            opening.add_done_callback(retrieve)
        # Shielded: a caller that gives up must not cancel a connect that others wait on.
        if by is None:
            return await asyncio.shield(opening)
        try:
            async with asyncio.timeout_at(by):
                return await asyncio.shield(opening)
        except TimeoutError:
            raise DeadlineError("redis did not connect before the caller's deadline") from None

    async def _sweep(self) -> None:
        interval = min(0.05, max(self._timeout / 10, 0.005))
        while True:
            await asyncio.sleep(interval)
            channel = self._link
            if channel is None or channel.closed or not channel.waiters:
                continue
            if channel.waiters[0][0] <= time.monotonic():
                self._forget()
                channel.close(TimeoutError(f"redis did not answer within {self._timeout}s"))

    async def execute_asking(self, *args: Any, by: float | None = None) -> Any:
        """Send ASKING and then one command, next to each other on the connection (a Cluster
        slot being migrated), and return the command's reply."""
        channel = self._link
        if channel is None or channel.closed:
            channel = await self._connected(by)
        loop = asyncio.get_running_loop()
        asked: asyncio.Future[Any] = loop.create_future()
        waiter: asyncio.Future[Any] = loop.create_future()
        deadline = time.monotonic() + self._timeout
        channel.queue(pack_command(("ASKING",)), asked, deadline)
        channel.queue(pack_command(args), waiter, deadline)
        if by is not None and by < deadline:
            channel.watch(by, waiter)
        replies = await asyncio.gather(asked, waiter, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return replies[1]

    def send(self, *args: Any, by: float | None = None) -> asyncio.Future[Any] | None:
        """Queue one command on the open connection, as :meth:`execute` does, and return
        the future of its reply (no task, no await: a caller sending to several nodes
        queues them all in one turn); None when no connection is open or it is full, for
        the caller to use :meth:`execute`."""
        channel = self._link
        if channel is None or channel.closed or len(channel.waiters) >= MAX_IN_FLIGHT:
            return None
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + self._timeout
        channel.queue(pack_command(args), waiter, deadline)
        if by is not None and by < deadline:
            channel.watch(by, waiter)
        return waiter

    async def execute(self, *args: Any, by: float | None = None, force: bool = False) -> Any:
        """Send one command and return its reply.

        Server error replies raise ResponseError; no reply within the timeout raises
        TimeoutError (and closes the connection); a broken connection ConnectionError; no
        reply by ``by`` (monotonic, the caller's deadline) DeadlineError. ``force``
        connects even within the backoff after a failed connect.
        """
        channel = self._link
        if channel is None or channel.closed:
            channel = await self._connected(by, force)
        if len(channel.waiters) >= MAX_IN_FLIGHT:
            raise rex.ConnectionError("redis is not keeping up")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        deadline = time.monotonic() + self._timeout
        channel.queue(pack_command(args), waiter, deadline)
        if by is not None and by < deadline:
            # The reply and the deadline are settled in the loop's order: whichever comes
            # first decides, so a reply that arrived is never thrown away for a deadline.
            channel.watch(by, waiter)
        return await waiter

    async def aclose(self) -> None:
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.wait({self._sweeper}, timeout=1.0)
        channel = self._link
        self._forget()
        if channel is not None:
            channel.close(rex.ConnectionError("client closed"))
        # Let the closed transports finish closing while the loop still runs.
        await asyncio.sleep(0)

    # The few commands the backend uses, named as on redis-py's client.

    async def ping(self) -> bool:
        return bool(await self.execute("PING"))

    async def script_load(self, source: str, by: float | None = None) -> str:
        sha = await self.execute("SCRIPT", "LOAD", source, by=by)
        return sha.decode() if isinstance(sha, bytes) else str(sha)

    async def time(self) -> tuple[int, int]:
        """The server's clock: seconds and microseconds (TIME)."""
        seconds, micros = await self.execute("TIME", force=True)
        return int(seconds), int(micros)

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await self.execute("EVALSHA", sha, numkeys, *keys_and_args)

    async def mget(self, keys: list[str]) -> list[Any]:
        return list(await self.execute("MGET", *keys))
