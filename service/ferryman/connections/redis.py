"""One connection to a Redis deployment (single, Sentinel or Cluster), shared by every
algorithm's Redis store: health, script calls (one EVALSHA per slot, NOSCRIPT handled,
Cluster redirections followed) and the translation of driver errors into BackendError."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.crc import key_slot

from ferryman.connections.redis_pipe import PipelinedRedis
from ferryman.connections.redis_target import RedisTarget, address
from ferryman.errors import BackendError, BackendTimeoutError

__all__ = ["LuaScript", "RedisConnection"]

log = logging.getLogger("ferryman.redis")

# Cluster redirections (MOVED, ASK) followed for one call before it fails.
MAX_REDIRECTS = 5

_TRANSIENT = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.BusyLoadingError,
    rex.ReadOnlyError,
    rex.ClusterDownError,
    rex.TryAgainError,
    rex.RedisClusterException,
    OSError,
)


@dataclass
class LuaScript:
    """A Lua script shipped beside its algorithm, run by SHA (loaded again on NOSCRIPT)."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    @classmethod
    def of(cls, package: str, name: str) -> LuaScript:
        """The script ``name`` in ``package`` (e.g. ``ferryman.algorithms.burst``)."""
        return cls(resources.files(package).joinpath(name).read_text("utf-8"))


def _tcp(tls: bool) -> type[AbstractConnection]:
    return aioredis.SSLConnection if tls else aioredis.Connection


class RedisConnection:
    """The connection to one Redis deployment, its health, and the one place where scripts
    run and driver errors become BackendError. A call never waits longer than the
    target's timeout."""

    def __init__(self, target: RedisTarget) -> None:
        self.target = target
        self.cluster = target.kind == "cluster"
        # Scripts loaded whenever the connection (re)turns healthy, so a request rarely
        # meets NOSCRIPT (it is still handled).
        self.scripts: list[LuaScript] = []
        self._client: Any = None
        self._sentinel: Sentinel | None = None
        self._healthy = False
        self._monitor: asyncio.Task[None] | None = None
        # Cluster: one pipelined connection per primary ("host:port").
        self._node_pipes: dict[str, PipelinedRedis] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._closing = False
        # The single Redis (or Sentinel's master) when it is reached through one pipelined
        # connection; None on a Cluster.
        self.single: PipelinedRedis | None = None

    # -- connecting -------------------------------------------------------------------------

    def _connect(self) -> Any:
        t = self.target
        timeout = t.timeout
        common: dict[str, Any] = {
            "username": t.username,
            "password": t.password,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "health_check_interval": 0,
        }
        common.update(t.ssl_options())
        if t.kind == "cluster":
            return RedisCluster(
                startup_nodes=[ClusterNode(h, p) for h, p in t.addresses],
                ssl=t.tls,
                max_connections=max(t.pool_size, 1),
                require_full_coverage=False,
                **common,
            )
        if t.kind == "sentinel":
            self._sentinel = Sentinel(  # type: ignore[no-untyped-call]
                list(t.addresses),
                sentinel_kwargs={
                    "socket_timeout": timeout,
                    "password": t.password if t.sentinel_password is None else t.sentinel_password,
                },
                ssl=t.tls,
                **common,
            )
            # Each (re)connect asks the sentinels where the master is now.
            master = SentinelConnectionPool(t.master_name, self._sentinel)  # type: ignore[no-untyped-call]
            managed = SentinelManagedSSLConnection if t.tls else SentinelManagedConnection
            return self._pipelined_to(managed, connection_pool=master)
        if t.unix_path:
            return self._pipelined_to(aioredis.UnixDomainSocketConnection, path=t.unix_path)
        host, port = t.addresses[0]
        return self._pipelined_to(_tcp(t.tls), host=host, port=port)

    def _pipelined_to(
        self, connection_class: type[AbstractConnection], **where: Any
    ) -> PipelinedRedis:
        """A pipelined client of one server (``where``: host and port, a socket path or a
        Sentinel pool) with the target's credentials, database, batching and time limit.
        Replies are never waited on past the caller's own timeout, so the connections
        need no socket timeout."""
        t = self.target
        return PipelinedRedis(
            t.timeout,
            window=t.pipeline_window,
            limit=t.pipeline_limit,
            connection_class=connection_class,
            username=t.username,
            password=t.password,
            db=t.db,
            socket_timeout=None,
            socket_connect_timeout=t.timeout,
            health_check_interval=0,
            **(t.ssl_options() if issubclass(connection_class, aioredis.SSLConnection) else {}),
            **where,
        )

    async def start(self) -> None:
        """Connect in the background: the service starts unhealthy until Redis answers."""
        self._client = self._connect()
        if isinstance(self._client, PipelinedRedis):
            self.single = self._client
        self._monitor = asyncio.create_task(self._watch(), name="ferryman-redis-health")

    @property
    def writes(self) -> int:
        """Batches written so far by the pipelined connections (to a single Redis, Sentinel's
        master or the Cluster's nodes), each one round trip."""
        if self.single is not None:
            return self.single.writes
        return sum(pipe.writes for pipe in self._node_pipes.values())

    async def _watch(self) -> None:
        delay = 0.1
        attempt = 0
        while not self._closing:
            try:
                async with asyncio.timeout(self.target.timeout):
                    await self._call(self._client.ping)
                    if not self._healthy and self.single is not None:
                        for script in self.scripts:
                            await self.single.script_load(script.source)
                if not self._healthy:
                    log.warning("redis %s is reachable", self.target.describe())
                self._healthy = True
                attempt = 0
                delay = 0.1
                await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                attempt += 1
                if self._healthy or attempt == 1 or attempt % 10 == 0:
                    log.warning(
                        "waiting for redis %s (attempt %d): %s; retrying in %.1fs",
                        self.target.describe(),
                        attempt,
                        exc,
                        delay,
                    )
                self._healthy = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def healthy(self) -> bool:
        return self._healthy

    def answered(self) -> None:
        """A call got its reply: the connection is up."""
        self._healthy = True

    async def close(self) -> None:
        self._closing = True
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.wait({self._monitor}, timeout=self.target.timeout)
            self._monitor = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
            self.single = None
        for pipe in self._node_pipes.values():
            with contextlib.suppress(Exception):
                await pipe.aclose()
        self._node_pipes.clear()
        if self._sentinel is not None:
            # The clients that talk to the sentinels themselves have their own connections.
            for client in self._sentinel.sentinels:
                with contextlib.suppress(Exception):
                    await client.aclose()
            self._sentinel = None

    # -- errors -----------------------------------------------------------------------------

    async def _call(self, command: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run one client command, waiting while a Cluster node's pool is full.

        redis-py's async Cluster raises MaxConnectionsError at once when a node already has
        REDIS_POOL_SIZE connections in use, where the single-Redis pool waits. The error comes
        before anything is sent, so trying again cannot count twice; the caller's timeout
        still bounds the wait.
        """
        delay = 0.0005
        while True:
            try:
                return await command(*args)
            except rex.MaxConnectionsError:
                if not self.cluster:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.01)

    @contextlib.asynccontextmanager
    async def errors(self) -> AsyncIterator[None]:
        """The one place where driver errors become BackendError, within the timeout."""
        try:
            async with asyncio.timeout(self.target.timeout):
                yield
        except (rex.RedisError, OSError) as exc:
            raise self.backend_error(exc) from exc

    def backend_error(self, exc: BaseException) -> BackendError:
        """The BackendError for a driver error; a timeout or a lost connection marks us down."""
        if isinstance(exc, TimeoutError):
            self._healthy = False
            return BackendTimeoutError(
                f"redis {self.target.describe()} did not answer within {self.target.timeout}s"
            )
        if isinstance(exc, _TRANSIENT):
            self._healthy = False
        return BackendError(f"redis {self.target.describe()}: {exc}")

    # -- running scripts --------------------------------------------------------------------

    def _node_pipe(self, host: str, port: int) -> PipelinedRedis:
        """The pipelined connection to one Cluster node, opened on first use."""
        name = f"{host}:{port}"
        pipe = self._node_pipes.get(name)
        if pipe is None:
            pipe = self._node_pipes[name] = self._pipelined_to(
                _tcp(self.target.tls), host=host, port=port
            )
        return pipe

    async def _refresh_slots(self) -> None:
        """Read the Cluster's slot map again: once, however many calls were redirected."""
        refreshing = self._refreshing
        if refreshing is None or refreshing.done():
            refreshing = asyncio.ensure_future(self._client.nodes_manager.initialize())
            self._refreshing = refreshing
        await asyncio.shield(refreshing)

    async def _on_cluster(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA a script whose keys share one slot on the primary that owns the slot,
        through that node's pipelined connection. MOVED reads the slot map again; ASK (a
        slot in migration) sends this call to the named node behind ASKING; NOSCRIPT loads
        the script on that node."""
        client = self._client
        if not client.nodes_manager.slots_cache:
            await client.initialize()
        slot = key_slot(keys[0].encode())
        command = ["EVALSHA", script.sha, len(keys), *keys, *args]
        asked: tuple[str, int] | None = None
        for _ in range(MAX_REDIRECTS):
            if asked is None:
                node = client.nodes_manager.get_node_from_slot(slot)
                pipe = self._node_pipe(node.host, node.port)
            else:
                pipe = self._node_pipe(*asked)
            try:
                if asked is None:
                    return await pipe.execute(*command)
                return await pipe.execute_asking(*command)
            except rex.NoScriptError:
                await pipe.script_load(script.source)
            except rex.ResponseError as exc:
                kind, _, where = str(exc).partition(" ")
                if kind == "MOVED":
                    asked = None
                    await self._refresh_slots()
                elif kind == "ASK":
                    asked = address(where.rpartition(" ")[2], "ASK")
                else:
                    raise
        raise rex.ClusterError(f"slot {slot}: more than {MAX_REDIRECTS} redirections")

    async def on_single(self, single: PipelinedRedis, script: LuaScript, command: list[Any]) -> Any:
        """Run ``command``, an EVALSHA of ``script`` built by the caller, on the single Redis
        (or Sentinel's master); after a NOSCRIPT (Redis restarted or failed over) the script
        is loaded and the command sent again. Driver errors pass through."""
        try:
            return await single.execute(*command)
        except rex.NoScriptError:
            await single.script_load(script.source)
            return await single.execute(*command)

    async def run(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA ``script`` with ``keys`` (one slot) and ``args``: its reply, or BackendError."""
        client = self._client
        if client is None:
            raise BackendError("redis backend is not started")
        async with self.errors():
            if self.single is None:
                reply = await self._on_cluster(script, keys, args)
            else:
                command = ["EVALSHA", script.sha, len(keys), *keys, *args]
                reply = await self.on_single(self.single, script, command)
        self._healthy = True
        return reply

    async def mget(self, keys: list[str]) -> list[int]:
        """The current value of each counter (0 when absent), without changing any."""
        async with self.errors():
            if self.cluster:
                raw = await self._call(self._client.mget_nonatomic, keys)
            else:
                raw = await self._call(self._client.mget, keys)
        return [int(v or 0) for v in raw]
