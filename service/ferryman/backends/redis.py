"""The Redis backend: one Lua script call per Redis slot involved, shared connections.

Keys keep the reference service's format, so ferryman and envoyproxy/ratelimit pointed at
one Redis count the same hits. Single Redis, Sentinel and Cluster are supported; with
``REDIS_PERSECOND`` per-second counters go to a second Redis, as in the reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

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

from ferryman.backends.base import BurstRequest, CounterOp, CounterResult
from ferryman.backends.copy_ledger import Seized
from ferryman.backends.redis_pipe import PipelinedRedis
from ferryman.errors import (
    BackendError,
    BackendTimeoutError,
    HoldError,
    LeaseLostError,
    NotFoundError,
    SettingsError,
)
from ferryman.limits.burst import BurstOutcome
from ferryman.limits.copies import CopyGroup, CopyPolicy, ReserveOutcome

__all__ = ["RedisBackend", "RedisTarget", "parse_backend_url"]

log = logging.getLogger("ferryman.redis")

# Cluster redirections (MOVED, ASK) followed for one call before it fails.
MAX_REDIRECTS = 5


def _script(name: str) -> str:
    return resources.files("ferryman.backends").joinpath("lua", name).read_text("utf-8")


@dataclass(frozen=True)
class RedisTarget:
    """Where a Redis deployment is and how to reach it."""

    kind: str = "single"  # single | sentinel | cluster
    addresses: tuple[tuple[str, int], ...] = (("localhost", 6379),)
    unix_path: str = ""
    master_name: str = ""
    username: str | None = None
    password: str | None = None
    tls: bool = False
    db: int = 0
    pool_size: int = 10
    timeout: float = 10.0
    # Batching on a single Redis (see redis_pipe): seconds between writes on a busy
    # connection, and commands that fill a batch; 0 means off.
    pipeline_window: float = 0.0
    pipeline_limit: int = 0

    def describe(self) -> str:
        if self.unix_path:
            return f"unix:{self.unix_path}"
        where = ",".join(f"{h}:{p}" for h, p in self.addresses)
        if self.kind == "sentinel":
            return f"sentinel {where} master {self.master_name}"
        return f"{self.kind} {where}"


def _address(text: str, what: str) -> tuple[str, int]:
    if "://" in text:
        raise SettingsError(
            f"{what}: {text!r} is a URL; {what} is host:port as in the reference "
            "(a URL goes to --backend)"
        )
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise SettingsError(f"{what}: {text!r} is not host:port")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise SettingsError(f"{what}: {text!r} has no numeric port") from None


def _tcp(tls: bool) -> type[AbstractConnection]:
    return aioredis.SSLConnection if tls else aioredis.Connection


def _auth(auth: str) -> tuple[str | None, str | None]:
    if not auth:
        return None, None
    user, sep, password = auth.partition(":")
    return (user, password) if sep else (None, auth)


def parse_backend_url(url: str, pool_size: int = 10, timeout: float = 10.0) -> RedisTarget:
    """Parse ``redis://``, ``rediss://``, ``redis+cluster://``, ``redis+sentinel://``, ``unix://``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    common: dict[str, Any] = {
        "username": user,
        "password": password,
        "pool_size": pool_size,
        "timeout": timeout,
    }
    if scheme == "unix":
        return RedisTarget(unix_path=parts.path, **common)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        raise SettingsError(f"--backend {url!r}: no host")
    addresses = tuple(_address(h, "--backend") for h in hosts.split(","))
    path = parts.path.strip("/")
    if scheme in ("redis", "rediss"):
        db = int(path) if path.isdigit() else 0
        return RedisTarget("single", addresses[:1], tls=scheme == "rediss", db=db, **common)
    if scheme in ("redis+cluster", "rediss+cluster"):
        return RedisTarget("cluster", addresses, tls=scheme.startswith("rediss"), **common)
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        if not path:
            raise SettingsError(f"--backend {url!r}: name the master, e.g. .../mymaster")
        return RedisTarget(
            "sentinel", addresses, master_name=path, tls=scheme.startswith("rediss"), **common
        )
    raise SettingsError(
        f"--backend {url!r}: unknown scheme (memory, redis://, rediss://, redis+cluster://, "
        "redis+sentinel://, unix://)"
    )


def target_from_env_style(
    kind: str, url: str, socket_type: str, auth: str, tls: bool, pool_size: int, timeout: float
) -> RedisTarget:
    """A target from the reference's REDIS_TYPE / REDIS_URL / REDIS_SOCKET_TYPE / REDIS_AUTH."""
    user, password = _auth(auth)
    common: dict[str, Any] = {
        "username": user,
        "password": password,
        "tls": tls,
        "pool_size": pool_size,
        "timeout": timeout,
    }
    kind = kind.lower()
    if kind == "single":
        if socket_type == "unix":
            return RedisTarget(unix_path=url, **common)
        return RedisTarget("single", (_address(url, "REDIS_URL"),), **common)
    if kind == "cluster":
        addrs = tuple(_address(u, "REDIS_URL") for u in url.split(","))
        return RedisTarget("cluster", addrs, **common)
    if kind == "sentinel":
        master, *nodes = url.split(",")
        if not nodes:
            raise SettingsError("REDIS_URL for sentinel is 'mastername,host:port[,host:port...]'")
        addrs = tuple(_address(u, "REDIS_URL") for u in nodes)
        return RedisTarget("sentinel", addrs, master_name=master, **common)
    raise SettingsError(f"REDIS_TYPE={kind!r} must be single, sentinel or cluster")


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
class _Group:
    """The ops of one call that share a Redis slot: one script call."""

    keys: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)
    index: list[int] = field(default_factory=list)


class RedisBackend:
    """Counters in Redis. A call never waits longer than the target's timeout."""

    name = "redis"

    def __init__(
        self, target: RedisTarget, *, jitter_max: int = 0, server_time: bool = True
    ) -> None:
        self.target = target
        self._jitter_max = jitter_max
        # Burst decisions take their time from Redis (TIME) so replicas with skewed clocks
        # agree; tests that drive a clock turn this off and pass ``now``.
        self.server_time = server_time
        self._burst_source = _script("burst.lua")
        self._burst_sha: str | None = None
        self._copies_source = _script("copies.lua")
        self._copies_sha: str | None = None
        # Transfers that copies.lua expired during this backend's calls (lapsed unclaimed).
        self.transfers_expired = 0
        self._client: Any = None
        self._sentinel: Sentinel | None = None
        self._source = _script("fixed_window.lua")
        self._sha: str | None = None
        self._healthy = False
        self._monitor: asyncio.Task[None] | None = None
        self._cluster = target.kind == "cluster"
        # Cluster: one pipelined connection per primary ("host:port"), for the fixed windows.
        self._node_pipes: dict[str, PipelinedRedis] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._closing = False
        self._pipelined = False

    # -- connection -------------------------------------------------------------------------

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
                sentinel_kwargs={"socket_timeout": timeout, "password": t.password},
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
            **where,
        )

    async def start(self) -> None:
        """Connect in the background: the service starts unhealthy until Redis answers."""
        self._client = self._connect()
        self._pipelined = isinstance(self._client, PipelinedRedis)
        self._monitor = asyncio.create_task(self._watch(), name="ferryman-redis-health")

    @property
    def writes(self) -> int:
        """Batches written so far by the pipelined connections (to a single Redis, Sentinel's
        master or the Cluster's nodes), each one round trip."""
        if isinstance(self._client, PipelinedRedis):
            return self._client.writes
        return sum(pipe.writes for pipe in self._node_pipes.values())

    async def _watch(self) -> None:
        delay = 0.1
        attempt = 0
        while not self._closing:
            try:
                async with asyncio.timeout(self.target.timeout):
                    await self._call(self._client.ping)
                    if not self._healthy:
                        self._sha = await self._call(self._client.script_load, self._source)
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

    # -- the request path -------------------------------------------------------------------

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
                if not self._cluster:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.01)

    @contextlib.asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        """The one place where driver errors become BackendError."""
        try:
            async with asyncio.timeout(self.target.timeout):
                yield
        except (rex.RedisError, OSError) as exc:
            raise self._backend_error(exc) from exc

    def _backend_error(self, exc: BaseException) -> BackendError:
        """The BackendError for a driver error; a timeout or a lost connection marks us down."""
        if isinstance(exc, TimeoutError):
            self._healthy = False
            return BackendTimeoutError(
                f"redis {self.target.describe()} did not answer within {self.target.timeout}s"
            )
        if isinstance(exc, _TRANSIENT):
            self._healthy = False
        return BackendError(f"redis {self.target.describe()}: {exc}")

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

    async def _on_cluster(
        self, source: str, sha_attr: str, keys: list[str], args: list[Any]
    ) -> Any:
        """EVALSHA a script whose keys share one slot (its SHA cached in ``sha_attr``) on the
        primary that owns the slot, through that node's pipelined connection. MOVED reads
        the slot map again; ASK (a slot in migration) sends this call to the named node
        behind ASKING; NOSCRIPT loads the script on that node."""
        client = self._client
        if not client.nodes_manager.slots_cache:
            await client.initialize()
        sha = getattr(self, sha_attr)
        if sha is None:
            sha = await self._call(client.script_load, source)
            setattr(self, sha_attr, sha)
        slot = key_slot(keys[0].encode())
        command = ["EVALSHA", sha, len(keys), *keys, *args]
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
                command[1] = await pipe.script_load(source)
                setattr(self, sha_attr, command[1])
            except rex.ResponseError as exc:
                kind, _, where = str(exc).partition(" ")
                if kind == "MOVED":
                    asked = None
                    await self._refresh_slots()
                elif kind == "ASK":
                    asked = _address(where.rpartition(" ")[2], "ASK")
                else:
                    raise
        raise rex.ClusterError(f"slot {slot}: more than {MAX_REDIRECTS} redirections")

    async def _on_single(self, source: str, sha_attr: str, command: list[Any]) -> Any:
        """Run ``command``, an EVALSHA of ``source`` with the SHA cached in ``sha_attr`` at
        [1], on the single Redis (or Sentinel's master): the script is loaded first, and
        again after a NOSCRIPT (Redis restarted or failed over)."""
        client = self._client
        if command[1] is None:
            command[1] = await client.script_load(source)
            setattr(self, sha_attr, command[1])
        try:
            return await client.execute(*command)
        except rex.NoScriptError:
            command[1] = await client.script_load(source)
            setattr(self, sha_attr, command[1])
            return await client.execute(*command)

    async def fixed_window(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult]:
        client = self._client
        if client is None:
            raise BackendError("redis backend is not started")
        if self._pipelined:
            # The hot path, a single Redis: one script call built in place; the pipelined
            # client keeps the time limit.
            command: list[Any] = ["EVALSHA", self._sha, len(ops)]
            command.extend([op.key for op in ops])
            command.append("1" if stop_when_over else "0")
            for op in ops:
                command.extend((op.hits, op.limit, self._ttl(op)))
            try:
                reply = await self._on_single(self._source, "_sha", command)
            except (rex.RedisError, OSError) as exc:
                raise self._backend_error(exc) from exc
            self._healthy = True
            return [CounterResult(reply[j], reply[j + 1]) for j in range(0, 2 * len(ops), 2)]
        groups = self._groups(ops, stop_when_over)
        if stop_when_over and len(groups) > 1:
            return await self._stop_when_over_across_slots(ops)
        async with self._errors():
            # A Cluster: one script call per slot, on the slots' nodes in parallel.
            calls = [self._on_cluster(self._source, "_sha", g.keys, g.args) for g in groups]
            raw = [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)
            replies = [[int(x) for x in reply] for reply in raw]
        self._healthy = True
        out: list[CounterResult | None] = [None] * len(ops)
        for group, reply in zip(groups, replies, strict=True):
            for j, i in enumerate(group.index):
                out[i] = CounterResult(reply[2 * j], reply[2 * j + 1])
        return [r for r in out if r is not None]

    async def _read(self, keys: Sequence[str]) -> list[int]:
        """The current value of each counter (0 when absent), without changing any."""
        async with self._errors():
            if self._cluster:
                raw = await self._call(self._client.mget_nonatomic, list(keys))
            else:
                raw = await self._call(self._client.mget, list(keys))
        return [int(v or 0) for v in raw]

    async def burst(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        policy = request.policy
        tag = "{" + request.node + "}"
        tenant = request.tenant
        keys = [f"{tag}:s:{tenant}", f"{tag}:g", f"{tag}:gt", f"{tag}:q:{tenant}"]
        keys.extend(f"{tag}:l:{tenant}:{i}" for i in range(1, len(policy.tiers) + 1))
        when = "" if now is None or self.server_time else repr(float(now))
        args: list[Any] = [
            when,
            request.copies,
            request.min_copies,
            len(policy.tiers),
            -1 if policy.hard_limit is None else policy.hard_limit,
            -1 if policy.global_limit is None else policy.global_limit,
            math.ceil(policy.horizon * 1000) + 1000,
        ]
        for tier in policy.tiers:
            args.extend(
                (
                    repr(tier.limit),
                    repr(tier.window),
                    repr(tier.active),
                    repr(tier.cooldown),
                    "1" if tier.skippable else "0",
                )
            )
        reply = await self._script_call(self._burst_source, "_burst_sha", keys, args)
        self._healthy = True
        return BurstOutcome(
            granted=int(reply[0]),
            tier_index=int(reply[1]),
            tier_limit=int(reply[2]),
            tier_hits=int(reply[3]),
            tier_window=float(reply[4]),
            burst=bool(int(reply[5])),
            limited_by_hard_limit=bool(int(reply[6])),
            limited_by_global_limit=bool(int(reply[7])),
            tenant_last_second=int(reply[8]),
            global_last_second=int(reply[9]),
            retry_after=float(reply[10]),
        )

    async def _script_call(
        self, source: str, sha_attr: str, keys: list[str], args: list[Any]
    ) -> Any:
        """EVALSHA a script whose SHA is cached in ``sha_attr``, loading it when Redis lost it."""
        async with self._errors():
            if self._cluster:
                return await self._on_cluster(source, sha_attr, keys, args)
            command = ["EVALSHA", getattr(self, sha_attr), len(keys), *keys, *args]
            return await self._on_single(source, sha_attr, command)

    async def run_script(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """Run the Lua ``source`` on the slot of ``keys`` (which share one), loading it when
        Redis lacks it; driver errors become BackendError."""
        sha = hashlib.sha1(source.encode()).hexdigest()
        sha_attr = f"_script_sha_{sha}"
        if not hasattr(self, sha_attr):
            setattr(self, sha_attr, sha)
        reply = await self._script_call(source, sha_attr, keys, args)
        self._healthy = True
        return reply

    async def _copies(
        self,
        node: str,
        op: str,
        server: str,
        lease_ms: int,
        now: float | None,
        args: list[Any],
        transfer_id: str = "-",
        tenant: str = "-",
    ) -> list[Any]:
        tag = "{" + node + "}"
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
        ]
        when = "" if now is None or self.server_time else str(round(now * 1000))
        reply = await self._script_call(
            self._copies_source,
            "_copies_sha",
            keys,
            [op, server, lease_ms, tag, when, *args],
        )
        out = [x.decode() if isinstance(x, bytes) else x for x in reply]
        # The last element: transfers this call expired (copies.lua reports it in every reply).
        self.transfers_expired += int(out.pop())
        if out[0] == "lease_lost":
            raise LeaseLostError(f"the lease of server {server} lapsed; its holds were freed")
        return out

    async def reserve(
        self,
        node: str,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        min_copies: int,
        server: str,
        lease_ms: int,
        now: float | None = None,
    ) -> ReserveOutcome:
        args = _reserve_args(tenant, policy, groups, copies, min_copies)
        out = await self._copies(node, "reserve", server, lease_ms, now, args)
        return _reserve_outcome(out, groups)

    async def release(
        self,
        node: str,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        server: str,
        lease_ms: int,
        now: float | None = None,
    ) -> None:
        out = await self._copies(
            node, "release", server, lease_ms, now, [tenant, copies, len(groups), *groups]
        )
        if out[0] == "over":
            raise HoldError("copies", f"{copies} is more than this server holds ({out[1]})")

    async def transfer(
        self,
        node: str,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        ttl: float,
        transfer_id: str,
        server: str,
        lease_ms: int,
        now: float | None = None,
    ) -> None:
        args = [tenant, copies, len(groups), *groups, round(ttl * 1000), transfer_id]
        out = await self._copies(node, "transfer", server, lease_ms, now, args, transfer_id)
        if out[0] == "over":
            raise HoldError("copies", f"{copies} is more than this server holds ({out[1]})")

    async def seize(
        self, node: str, transfer_id: str, server: str, lease_ms: int, now: float | None = None
    ) -> Seized:
        out = await self._copies(node, "seize", server, lease_ms, now, [transfer_id], transfer_id)
        if out[0] == "missing":
            raise NotFoundError("transfer_id", "unknown or expired transfer")
        return Seized(node, str(out[1]), int(out[2]), tuple(str(g) for g in out[3:]))

    async def renew(self, node: str, server: str, lease_ms: int, now: float | None = None) -> None:
        await self._copies(node, "renew", server, lease_ms, now, [])

    async def envoy_reserve(
        self,
        node: str,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        hold_id: str,
        server: str,
        now: float | None = None,
    ) -> ReserveOutcome:
        args = _reserve_args(tenant, policy, groups, copies, copies)
        args.extend((hold_id, round(policy.hold_ttl * 1000)))
        out = await self._copies(node, "ereserve", server, 0, now, args, tenant=tenant)
        return _reserve_outcome(out, groups)

    async def envoy_release(
        self, node: str, tenant: str, copies: int, server: str, now: float | None = None
    ) -> int:
        out = await self._copies(node, "erelease", server, 0, now, [tenant, copies], tenant=tenant)
        return int(out[1])

    async def _stop_when_over_across_slots(self, ops: Sequence[CounterOp]) -> list[CounterResult]:
        """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT over keys in several Cluster slots.

        No script can span slots, so this reads first and applies second, as the reference
        does everywhere; it costs a second round trip and only this configuration pays it.
        """
        current = await self._read([op.key for op in ops])
        return await _apply_only_over(
            ops, current, lambda chosen: self.fixed_window(chosen, stop_when_over=False)
        )


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
    return ReserveOutcome(int(out[1]), int(out[2]), int(out[3]), held)


def _over(ops: Sequence[CounterOp], current: Sequence[int]) -> set[int]:
    """The ops that would end above their limit, replayed in order as the Lua script does."""
    trial: dict[str, int] = {}
    over: set[int] = set()
    for i, op in enumerate(ops):
        seen = trial.get(op.key, current[i])
        if op.hits > 0 and seen + op.hits > op.limit:
            over.add(i)
        trial[op.key] = max(0, seen + op.hits)
    return over


async def _apply_only_over(
    ops: Sequence[CounterOp],
    current: Sequence[int],
    apply: Callable[[list[CounterOp]], Awaitable[list[CounterResult]]],
) -> list[CounterResult]:
    """Stop-when-over from values read beforehand: apply every op, or only the over ones.

    The results are those the script (and the memory backend) give for the same values.
    """
    over = _over(ops, current)
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


class RoutedBackend:
    """Per-second counters to one backend, every other window to another (REDIS_PERSECOND)."""

    name = "redis+persecond"

    def __init__(self, main: RedisBackend, per_second: RedisBackend) -> None:
        self._main = main
        self._per_second = per_second

    async def start(self) -> None:
        await self._main.start()
        await self._per_second.start()

    def healthy(self) -> bool:
        return self._main.healthy() and self._per_second.healthy()

    async def close(self) -> None:
        await self._main.close()
        await self._per_second.close()

    async def burst(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        return await self._main.burst(request, now)

    # Held copies live on the main Redis only.
    def __getattr__(self, name: str) -> Any:
        if name in ("reserve", "release", "transfer", "seize", "renew", "envoy_reserve",
                    "envoy_release", "transfers_expired"):  # fmt: skip
            return getattr(self._main, name)
        raise AttributeError(name)

    async def fixed_window(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult]:
        fast = [i for i, op in enumerate(ops) if op.ttl == 1]
        if stop_when_over and fast and len(fast) < len(ops):
            # One script cannot see both Redis: read every counter, then apply.
            fast_set = set(fast)
            slow = [i for i in range(len(ops)) if i not in fast_set]
            main_now, fast_now = await asyncio.gather(
                self._main._read([ops[i].key for i in slow]),
                self._per_second._read([ops[i].key for i in fast]),
            )
            current = [0] * len(ops)
            for i, value in [*zip(slow, main_now, strict=True), *zip(fast, fast_now, strict=True)]:
                current[i] = value
            return await _apply_only_over(
                ops, current, lambda chosen: self._route(chosen, stop_when_over=False)
            )
        return await self._route(ops, stop_when_over=stop_when_over)

    async def _route(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult]:
        fast = [i for i, op in enumerate(ops) if op.ttl == 1]
        if not fast:
            return await self._main.fixed_window(ops, stop_when_over=stop_when_over)
        fast_set = set(fast)
        slow = [i for i in range(len(ops)) if i not in fast_set]
        if not slow:
            return await self._per_second.fixed_window(ops, stop_when_over=stop_when_over)
        a, b = await asyncio.gather(
            self._main.fixed_window([ops[i] for i in slow], stop_when_over=stop_when_over),
            self._per_second.fixed_window([ops[i] for i in fast], stop_when_over=stop_when_over),
        )
        out: list[CounterResult | None] = [None] * len(ops)
        for i, r in zip(slow, a, strict=True):
            out[i] = r
        for i, r in zip(fast, b, strict=True):
            out[i] = r
        return [r for r in out if r is not None]
