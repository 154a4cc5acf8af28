"""One connection to a Redis deployment (single, Sentinel or Cluster), shared by every
algorithm's Redis store: health, script calls (one EVALSHA per slot, NOSCRIPT handled,
Cluster redirections followed) and the translation of driver errors into BackendError.

When Redis is sick:

- Every call is answered by the caller's deadline (``ferryman.connections.deadline``) or within
  ``REDIS_TIMEOUT``, whichever comes first.
- Every script carries the time by which it must run, on Redis's own clock (the offset to
  ours is measured by the health probe, TIME); one that reaches Redis later changes
  nothing (``deadline.lua``, prepended to each script by :class:`LuaScript`).
- A circuit breaker: after ``BREAKER_FAILURES`` consecutive failures (or a failed probe)
  calls are refused at once without touching the network, and one probe at a time, with
  exponential backoff and jitter, decides when Redis is back.
- A state (up, degraded, down) with the reason of the last failure, one log line per
  change.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
from redis.credentials import CredentialProvider, UsernamePasswordCredentialProvider

from ferryman.connections.deadline import ANSWER_BY
from ferryman.connections.redis_auth import FileCredentials, PasswordOf
from ferryman.connections.redis_pipe import DeadlineError, PipelinedRedis, retrieve
from ferryman.connections.redis_target import RedisTarget, address
from ferryman.errors import BackendError, BackendTimeoutError

__all__ = ["DEGRADED", "DOWN", "UP", "LuaScript", "RedisConnection", "reason_of"]

log = logging.getLogger("ferryman.redis")

# Cluster redirections (MOVED, ASK) followed for one call before it fails.
MAX_REDIRECTS = 5
_AGAIN = object()  # run_slots: a call not sent with the others


def _sent_again(reply: object) -> bool:
    """Whether a Cluster script call's error means it did not run and goes again alone."""
    if isinstance(reply, rex.NoScriptError):
        return True
    return isinstance(reply, rex.ResponseError) and str(reply).startswith(("MOVED ", "ASK "))


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


# The states of a connection.
UP, DEGRADED, DOWN = "up", "degraded", "down"
# Consecutive failed calls that open the breaker.
BREAKER_FAILURES = 5
# Backoff between probes while the breaker is open: doubling from BASE up to CAP, each
# wait drawn between half and all of it, so that replicas do not probe in step.
BACKOFF_BASE = 0.05
BACKOFF_CAP = 3.0
# Probes while the breaker is closed (they also measure the clock offset), and the longest
# a probe may take: a Redis that cannot answer TIME within it is down.
PROBE_EVERY = 1.0
PROBE_TIMEOUT = 2.0
# A degraded connection is up again after this long without a failure.
QUIET_FOR_UP = 2.0
# A script must start this long before its caller is answered: covers the reply's way back
# and the error of the measured clock offset (half the round trip of the best TIME probe,
# which is added on top).
SKEW = 0.005
# A TIME probe slower than this round trip does not update the clock offset.
OFFSET_MAX_RTT = 0.02

_DEADLINE = resources.files(__package__ or "").joinpath("deadline.lua").read_text("utf-8")


@dataclass
class LuaScript:
    """A Lua script shipped beside its algorithm, run by SHA (loaded again on NOSCRIPT).

    Every script gets ``deadline.lua`` in front of its own text: its callers pass the time
    by which it must run as the first argument (``RedisConnection.run`` does), and the
    script's own text sees its arguments from ``ARGV[1]`` on."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    @classmethod
    def of(cls, package: str, *names: str, prefix: str = "") -> LuaScript:
        """The script made of the files ``names`` in ``package`` (e.g.
        an algorithm's package), in order: shared functions first, the script last;
        ``prefix`` (functions from elsewhere) before them."""
        files = resources.files(package)
        text = "".join(files.joinpath(name).read_text("utf-8") for name in names)
        return cls(_DEADLINE + prefix + text)


# An operator's reset: the keys of one counter, deleted together.
_DELETE = LuaScript.of(__package__ or "", "delete.lua")


# What Redis says when it refuses credentials (a connect that is not tried again yet
# repeats the last refusal's text).
_AUTH_WORDS = (
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "INVALID PASSWORD",
    "INVALID USERNAME-PASSWORD",
)


def reason_of(exc: BaseException) -> tuple[str, str]:
    """The kind of a failure (timeout, refused, READONLY, CLUSTERDOWN, LOADING, auth, late,
    closed, error) and its text, never blank."""
    text = str(exc) or type(exc).__name__
    upper = text.upper()
    if isinstance(exc, TimeoutError | rex.TimeoutError):
        kind = "timeout"
    elif isinstance(exc, rex.AuthenticationError | rex.AuthorizationError) or any(
        word in upper for word in _AUTH_WORDS
    ):
        kind = "auth"
    elif isinstance(exc, rex.ReadOnlyError) or "READONLY" in upper:
        kind = "READONLY"
    elif isinstance(exc, rex.ClusterDownError) or "CLUSTERDOWN" in upper:
        kind = "CLUSTERDOWN"
    elif isinstance(exc, rex.BusyLoadingError) or upper.startswith("LOADING"):
        kind = "LOADING"
    elif upper.startswith("LATE"):
        kind = "late"
    elif isinstance(exc, ConnectionRefusedError) or any(
        word in upper for word in ("REFUSED", "ERROR 111 ", "CONNECT CALL FAILED")
    ):
        kind = "refused"
    elif isinstance(exc, rex.ConnectionError | OSError):
        kind = "closed"
    else:
        kind = "error"
    return kind, text


def credentials_of(
    target: RedisTarget,
) -> tuple[CredentialProvider | None, CredentialProvider | None]:
    """What the servers and the sentinels authenticate with (None: nothing): a file kept
    current, or the fixed user and password. The sentinels share the servers' password
    unless they have their own. SettingsError when a file cannot be read."""
    v = target.variables
    server: CredentialProvider | None = None
    if target.auth_file:
        server = FileCredentials(target.auth_file, f"{v}_AUTH_FILE", target.username)
    elif target.username or target.password:
        server = UsernamePasswordCredentialProvider(target.username, target.password)
    if target.kind != "sentinel":
        return server, None
    sentinel: CredentialProvider | None = None
    if target.sentinel_auth_file:
        sentinel = FileCredentials(target.sentinel_auth_file, f"{v}_SENTINEL_AUTH_FILE")
    elif target.sentinel_password is not None:
        sentinel = UsernamePasswordCredentialProvider(None, target.sentinel_password)
    elif isinstance(server, FileCredentials):
        sentinel = PasswordOf(server)
    elif target.password:
        sentinel = UsernamePasswordCredentialProvider(None, target.password)
    return server, sentinel


def _tcp(tls: bool) -> type[AbstractConnection]:
    return aioredis.SSLConnection if tls else aioredis.Connection


class RedisConnection:
    """The connection to one Redis deployment, its health, and the one place where scripts
    run and driver errors become BackendError. A call never waits longer than the
    target's timeout, nor past its caller's deadline."""

    def __init__(self, target: RedisTarget) -> None:
        self.target = target
        self.name = target.describe()
        self.cluster = target.kind == "cluster"
        # Scripts loaded whenever the connection (re)turns healthy, so a request rarely
        # meets NOSCRIPT (it is still handled).
        self.scripts: list[LuaScript] = []
        self._client: Any = None
        self._sentinel: Sentinel | None = None
        self._monitor: asyncio.Task[None] | None = None
        # State: down until Redis first answers (but calls may still try it).
        self.state = DOWN
        self.reason = "connecting: redis has not answered yet"
        self.since = time.time()
        self.transitions: Counter[tuple[str, str]] = Counter()  # (to, kind) -> times
        # The breaker.
        self.breaker_open = False
        self._failures = 0  # consecutive failed calls
        self._last_failure = 0.0  # monotonic
        self.breaker_opened = 0  # times it opened
        self.refused = 0  # calls answered with the failure policy without asking Redis
        self.probes = 0  # probes sent (each may open a connection)
        self._wake = asyncio.Event()
        # Redis's clock (TIME, microseconds) minus ours (monotonic), and its error bound.
        self._offset = (time.time() - time.monotonic()) * 1e6
        self._offset_error = 0.0
        self.offset_measured = False
        self._scripts_loaded = False  # on the single Redis, since the last failure
        # Cluster: one pipelined connection per primary ("host:port").
        self._node_pipes: dict[str, PipelinedRedis] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._next_refresh = 0.0
        self._closing = False
        # The single Redis (or Sentinel's master) when it is reached through one pipelined
        # connection; None on a Cluster.
        self.single: PipelinedRedis | None = None
        # What every connection (the sentinels' too) authenticates with when it connects;
        # the files among them (REDIS_AUTH_FILE...) are read again when they change.
        self.credentials, self.sentinel_credentials = credentials_of(target)
        self.rotating = [
            c
            for c in (self.credentials, self.sentinel_credentials)
            if isinstance(c, FileCredentials)
        ]

    # -- connecting -------------------------------------------------------------------------

    def _connect(self) -> Any:
        t = self.target
        timeout = t.timeout
        common: dict[str, Any] = {
            "credential_provider": self.credentials,
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
                    "credential_provider": self.sentinel_credentials,
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
            credential_provider=self.credentials,
            db=t.db,
            socket_timeout=None,
            socket_connect_timeout=t.timeout,
            health_check_interval=0,
            **(t.ssl_options() if issubclass(connection_class, aioredis.SSLConnection) else {}),
            **where,
        )

    async def start(self) -> None:
        """One probe (within ``PROBE_TIMEOUT`` at most), then the rest in the background:
        the connection is down until Redis answers."""
        self._client = self._connect()
        if isinstance(self._client, PipelinedRedis):
            self.single = self._client
        await self._probe_once()
        self._monitor = asyncio.create_task(self._watch(), name="ferryman-redis-health")

    @property
    def writes(self) -> int:
        """Batches written so far by the pipelined connections (to a single Redis, Sentinel's
        master or the Cluster's nodes), each one round trip."""
        return sum(pipe.writes for pipe in self._pipes())

    @property
    def commands(self) -> int:
        """Commands sent so far by the pipelined connections (``commands / writes``: how
        many a write carries)."""
        return sum(pipe.commands for pipe in self._pipes())

    @property
    def late(self) -> int:
        """Scripts that reached Redis after their deadline and changed nothing."""
        return sum(pipe.late for pipe in self._pipes())

    @property
    def connects(self) -> int:
        """Connections opened (or tried) by the pipelined connections."""
        return sum(pipe.connects for pipe in self._pipes())

    def _pipes(self) -> list[PipelinedRedis]:
        if self.single is not None:
            return [self.single]
        return list(self._node_pipes.values())

    # -- state, breaker, probes -----------------------------------------------------------

    def _move(self, state: str, kind: str, text: str, again: bool = False) -> None:
        """One transition, one log line (the reason is never blank); ``again``: log it even
        if the state does not change (down while connecting, then down for a reason)."""
        if state == self.state and not again:
            return
        before, self.state = self.state, state
        self.reason = f"{kind}: {text}"
        self.since = time.time()
        self.transitions[(state, kind)] += 1
        where = self.target.describe()
        if state == DOWN:
            log.warning(
                "redis %s is down (%s); calls get the failure policy without asking redis, "
                "probing with backoff up to %.1fs",
                where,
                self.reason,
                BACKOFF_CAP,
            )
        elif state == DEGRADED:
            log.warning("redis %s is degraded (%s)", where, self.reason)
        else:
            log.warning("redis %s is up (was %s: %s)", where, before, text)

    def failed(self, exc: BaseException, counts: bool = True) -> str:
        """Record a failed call; ``counts``: it tells about Redis (a caller's short deadline
        or a script error does not count towards the breaker). Returns the kind."""
        kind, text = reason_of(exc)
        self._last_failure = time.monotonic()
        if kind == "auth":
            self.credentials_refused()
        if counts:
            self._scripts_loaded = False  # Redis may have restarted empty
        if self.breaker_open:
            return kind
        if counts and not self.cluster:
            # On a Cluster one node's failure leaves the others usable: only a failed
            # probe opens the breaker (each node's connection backs off on its own).
            self._failures += 1
            if self._failures >= BREAKER_FAILURES:
                self._trip(kind, text)
                return kind
        if self.state == UP:
            self._move(DEGRADED, kind, text)
        elif self.state == DEGRADED:
            self.reason = f"{kind}: {text}"
        return kind

    def _trip(self, kind: str, text: str) -> None:
        self.breaker_open = True
        self.breaker_opened += 1
        self._move(DOWN, kind, text, again=self.breaker_opened == 1 and self.state == DOWN)
        self._wake.set()

    def answered(self) -> None:
        """A call got its reply."""
        self._failures = 0
        if self.state == DOWN and not self.breaker_open:
            # Not yet connected when the call left (an open breaker waits for its probe).
            self._move(UP, "answered", "redis answered a call")

    def credentials_refused(self) -> None:
        """Redis refused the credentials: read their files again (the next connection
        uses what they say now)."""
        for credentials in self.rotating:
            credentials.refused()

    def refuse(self) -> BackendError:
        """The error of a call refused by the open breaker (Redis is not asked)."""
        self.refused += 1
        return BackendError(
            f"redis {self.target.describe()} is down ({self.reason}); not asked until a "
            "probe succeeds"
        )

    async def _probe(self) -> None:
        """One TIME (PING on a Cluster) within PROBE_TIMEOUT; on a single Redis it also
        measures the clock offset and loads the scripts after a failure. Raises on failure."""
        self.probes += 1
        single = self.single
        async with asyncio.timeout(min(self.target.timeout, PROBE_TIMEOUT)):
            if single is None:
                await self._call(self._client.ping)
                return
            t0 = time.monotonic()
            seconds, micros = await single.time()
            t1 = time.monotonic()
            rtt = t1 - t0
            if rtt <= OFFSET_MAX_RTT or not self.offset_measured:
                self._offset = seconds * 1e6 + micros - (t0 + t1) / 2 * 1e6
                self._offset_error = rtt / 2
                self.offset_measured = True
            if not self._scripts_loaded:
                for script in self.scripts:
                    await single.script_load(script.source)
                self._scripts_loaded = True

    async def _watch(self) -> None:
        attempt = 0
        while not self._closing:
            if self.breaker_open:
                delay = min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt)
                attempt += 1
                await asyncio.sleep(random.uniform(delay / 2, delay))
            else:
                attempt = 0
                if self.state == DEGRADED and time.monotonic() - self._last_failure > QUIET_FOR_UP:
                    self._move(UP, "quiet", f"no failure for {QUIET_FOR_UP:g}s")
                # Notice a rotation (and log it) while every connection stays open.
                for credentials in self.rotating:
                    credentials.refresh()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PROBE_EVERY):
                        await self._wake.wait()
                self._wake.clear()
                if self.breaker_open:
                    continue  # just opened: the first probe waits its backoff
            await self._probe_once()

    async def _probe_once(self) -> None:
        """One probe and what follows from it: the breaker opens on failure, closes on
        success."""
        try:
            await self._probe()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            kind, text = reason_of(exc)
            if kind == "auth":
                self.credentials_refused()
            if kind == "timeout" and not str(exc):
                limit = min(self.target.timeout, PROBE_TIMEOUT)
                text = f"no answer to the health probe within {limit:g}s"
            self._last_failure = time.monotonic()
            self._scripts_loaded = False
            if not self.breaker_open:
                self._trip(kind, text)
            else:
                self.reason = f"{kind}: {text}"
            log.debug("probe of redis %s failed: %s", self.target.describe(), self.reason)
            return
        self._failures = 0
        if self.breaker_open:
            self.breaker_open = False
            self._move(UP, "probe", "a probe succeeded; the breaker is closed")
        elif self.state == DOWN:
            self._move(UP, "probe", "redis answered")

    async def check(self) -> bool:
        """Probe Redis now (as the health watch does); whether it is up afterwards."""
        await self._probe_once()
        return self.healthy()

    def healthy(self) -> bool:
        """Whether Redis is usable (not down): what health reports when it is asked to
        depend on the backend."""
        return self.state != DOWN

    def describe_state(self) -> dict[str, object]:
        """The connection's state for /status."""
        return {
            "target": self.target.describe(),
            "state": self.state,
            "reason": self.reason,
            "since": self.since,
            "breaker": {
                "open": self.breaker_open,
                "consecutive_failures": self._failures,
                "opened": self.breaker_opened,
                "refused_calls": self.refused,
                "probes": self.probes,
            },
            "connects": self.connects,
            "writes": self.writes,
            "commands": self.commands,
            "late_scripts": self.late,
            "transitions": sum(self.transitions.values()),
            "clock_offset_error_ms": round(self._offset_error * 1000, 3)
            if self.offset_measured
            else None,
            "credentials": [c.describe() for c in self.rotating],
        }

    def answer_by(self) -> float:
        """The monotonic time by which the current call must be answered."""
        return self.deadlines()[0]

    def deadlines(self) -> tuple[float, float | None]:
        """(by, own): the monotonic time by which the current call must be answered, and
        the same time again when it is the caller's own deadline, earlier than the
        connection's timeout; None when it is not (the pipelined client's timeout keeps it
        then, and the call needs no deadline of its own there)."""
        limit = time.monotonic() + self.target.timeout
        by = ANSWER_BY.get()
        if by is None or by >= limit:
            return limit, None
        return by, by

    def deadline_arg(self, by: float) -> int:
        """A script's first argument: the latest Redis time (microseconds) it may start at,
        for a call answered by ``by`` (monotonic)."""
        return int((by - SKEW - self._offset_error) * 1e6 + self._offset)

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
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
    async def errors(self, by: float) -> AsyncIterator[None]:
        """Driver errors of the calls made inside, by ``by`` (monotonic), as
        :meth:`backend_error` maps them."""
        try:
            async with asyncio.timeout_at(by):
                yield
        except DeadlineError as exc:
            raise self.backend_error(exc) from exc
        except TimeoutError as exc:
            # The time ran out here, not in the pipelined client: the caller's deadline
            # if it came before the timeout.
            if ANSWER_BY.get() == by:
                raise self.backend_error(DeadlineError(str(exc))) from exc
            raise self.backend_error(exc) from exc
        except (rex.RedisError, OSError) as exc:
            raise self.backend_error(exc) from exc

    def backend_error(self, exc: BaseException, what: str = "") -> BackendError:
        """The one place where a driver error becomes a BackendError, recorded in the
        state and the breaker (``what``: a long-lived call, such as a subscription, whose
        end is reported but not counted as a failed call)."""
        where = self.target.describe()
        if what:
            return BackendError(f"redis {where}: {what}: {exc}")
        if isinstance(exc, DeadlineError):
            self.failed(exc, counts=False)
            return BackendTimeoutError(f"redis {where} did not answer by the caller's deadline")
        if isinstance(exc, TimeoutError):
            self.failed(exc)
            return BackendTimeoutError(
                f"redis {where} did not answer within {self.target.timeout}s"
            )
        if isinstance(exc, _TRANSIENT):
            self.failed(exc)
        elif str(exc).startswith("LATE"):
            # Redis's clock ran ahead of the measured offset: nothing was counted.
            self.failed(exc, counts=False)
            return BackendTimeoutError(f"redis {where}: the script ran too late: {exc}")
        return BackendError(f"redis {where}: {exc}")

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

    def _refresh_soon(self) -> None:
        """Read the Cluster's slot map again in the background, at most every 0.25 s."""
        now = time.monotonic()
        if now < self._next_refresh:
            return
        self._next_refresh = now + 0.25
        refreshing = self._refreshing
        if refreshing is None or refreshing.done():
            refreshing = asyncio.ensure_future(self._client.nodes_manager.initialize())
            refreshing.add_done_callback(retrieve)
            self._refreshing = refreshing

    async def _refresh_slots(self) -> None:
        """Read the Cluster's slot map again: once, however many calls were redirected."""
        refreshing = self._refreshing
        if refreshing is None or refreshing.done():
            refreshing = asyncio.ensure_future(self._client.nodes_manager.initialize())
            refreshing.add_done_callback(retrieve)
            self._refreshing = refreshing
        await asyncio.shield(refreshing)

    async def _on_cluster(
        self, script: LuaScript, keys: list[str], args: list[Any], by: float | None
    ) -> Any:
        """EVALSHA a script whose keys share one slot on the primary that owns the slot,
        through that node's pipelined connection, answering by the caller's own deadline
        ``by`` (None: the time the caller's ``errors`` keeps). MOVED reads the slot map
        again; ASK (a slot in migration) sends this call to the named node behind ASKING;
        NOSCRIPT loads the script on that node."""
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
                    return await pipe.execute(*command, by=by)
                return await pipe.execute_asking(*command, by=by)
            except (rex.ConnectionError, ConnectionError) as exc:
                # The node is gone (perhaps failed over): no MOVED will ever come from it,
                # so read the slot map again in the background for the next calls.
                if not isinstance(exc, DeadlineError):
                    self._refresh_soon()
                raise
            except rex.NoScriptError:
                await pipe.script_load(script.source, by=by)
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

    async def on_single(
        self,
        single: PipelinedRedis,
        script: LuaScript,
        command: list[Any],
        deadlines: tuple[float, float | None],
    ) -> Any:
        """Run ``command``, an EVALSHA of ``script`` built by the caller (its first argument
        ``deadline_arg``), on the single Redis (or Sentinel's master), answering by
        ``deadlines`` (from :meth:`deadlines`: the call's own deadline, if any, is the
        pipelined client's to keep, so no timer is needed here); after a NOSCRIPT (Redis
        restarted or failed over) the script is loaded and the command sent again, both
        within the same time. Its reply, or BackendError."""
        try:
            try:
                reply = await single.execute(*command, by=deadlines[1])
            except rex.NoScriptError:
                by = deadlines[0]
                await single.script_load(script.source, by=by)
                reply = await single.execute(*command, by=by)
        except (rex.RedisError, OSError) as exc:
            raise self.backend_error(exc) from exc
        self.answered()
        return reply

    async def run(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA ``script`` with ``keys`` (one slot) and ``args`` (the deadline goes in
        front of them): its reply, or BackendError by the caller's deadline."""
        client = self._client
        if client is None:
            raise BackendError("redis backend is not started")
        if self.breaker_open:
            raise self.refuse()
        deadlines = by, own = self.deadlines()
        args = [self.deadline_arg(by), *args]
        single = self.single
        if single is not None:
            command = ["EVALSHA", script.sha, len(keys), *keys, *args]
            return await self.on_single(single, script, command, deadlines)
        async with self.errors(by):
            reply = await self._on_cluster(script, keys, args, own)
        self.answered()
        return reply

    async def run_slots(
        self, script: LuaScript, calls: Sequence[tuple[list[str], list[Any]]]
    ) -> list[Any]:
        """EVALSHA ``script`` once per ``(keys, args)`` of ``calls``, each call's keys on one
        slot of a Cluster: all queued in one turn on their nodes' pipelined connections, so
        each node gets one write and the nodes answer at once. A call redirected (MOVED,
        ASK), sent to a node without the script or not yet connected is sent again on its
        own (none of those ran). The replies in order, or BackendError by the caller's
        deadline."""
        client = self._client
        if client is None:
            raise BackendError("redis backend is not started")
        if self.breaker_open:
            raise self.refuse()
        by, own = self.deadlines()
        first = self.deadline_arg(by)
        async with self.errors(by):
            if not client.nodes_manager.slots_cache:
                await client.initialize()
            nodes = client.nodes_manager
            sent: list[asyncio.Future[Any] | None] = []
            for keys, args in calls:
                node = nodes.get_node_from_slot(key_slot(keys[0].encode()))
                pipe = self._node_pipe(node.host, node.port)
                sent.append(
                    pipe.send("EVALSHA", script.sha, len(keys), *keys, first, *args, by=own)
                )
            waiting = [f for f in sent if f is not None]
            replies = iter(await asyncio.gather(*waiting, return_exceptions=True))
            out = []
            for (keys, args), future in zip(calls, sent, strict=True):
                reply = _AGAIN if future is None else next(replies)
                if reply is _AGAIN or _sent_again(reply):
                    reply = await self._on_cluster(script, keys, [first, *args], own)
                elif isinstance(reply, BaseException):
                    if isinstance(reply, rex.ConnectionError | ConnectionError) and not isinstance(
                        reply, DeadlineError
                    ):
                        self._refresh_soon()
                    raise reply
                out.append(reply)
        self.answered()
        return out

    async def delete(self, keys: list[str]) -> int:
        """Delete ``keys`` (one slot) at once; how many existed."""
        if not keys:
            return 0
        return int(await self.run(_DELETE, keys, []))

    async def command(self, *args: Any, key: str) -> Any:
        """One plain command about ``key`` (off the request path: the config store), its
        reply or BackendError."""
        client = self._client
        if client is None:
            raise BackendError("redis backend is not started")
        by = self.answer_by()
        async with self.errors(by):
            if self.single is not None:
                reply = await self.single.execute(*args, by=by)
            else:
                node = client.get_node_from_key(key)
                reply = await self._call(
                    functools.partial(client.execute_command, target_nodes=node), *args
                )
        self.answered()
        return reply

    @property
    def can_subscribe(self) -> bool:
        """Whether :meth:`subscribe` works here: a single Redis (a Sentinel or Cluster
        deployment's subscribers poll instead)."""
        return self.target.kind == "single"

    async def subscribe(self, channel: str) -> AsyncIterator[bytes]:
        """The messages published on ``channel``, as they come, on a connection of their
        own (a subscribed connection can send nothing else); BackendError when it fails."""
        if not self.can_subscribe:
            raise BackendError(
                f"redis {self.target.describe()}: no pub/sub on a {self.target.kind}"
            )
        t = self.target
        common: dict[str, Any] = {
            "credential_provider": self.credentials,
            "db": t.db,
            "socket_connect_timeout": t.timeout,
        }
        if t.unix_path:
            client = aioredis.Redis(unix_socket_path=t.unix_path, **common)
        else:
            host, port = t.addresses[0]
            client = aioredis.Redis(host=host, port=port, ssl=t.tls, **common, **t.ssl_options())
        try:
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(channel)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message.get("data")
                        yield data if isinstance(data, bytes) else str(data).encode()
            except (rex.RedisError, OSError) as exc:
                raise self.backend_error(exc, f"subscription to {channel}") from exc
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def mget(self, keys: list[str]) -> list[int]:
        """The current value of each counter (0 when absent), without changing any."""
        if self.breaker_open:
            raise self.refuse()
        async with self.errors(self.answer_by()):
            if self.cluster:
                raw = await self._call(self._client.mget_nonatomic, keys)
            else:
                raw = await self._call(self._client.mget, keys)
        self.answered()
        return [int(v or 0) for v in raw]
