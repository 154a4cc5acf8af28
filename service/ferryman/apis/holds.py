"""Client sessions and the copies they hold (Charon's hold sets and server-fault handling).

Each session keeps, in this process, how many copies it holds per (node, tenant, groups):
that is what is released when the session ends, whatever the reason. In the shared store
every count also carries this server's contribution under a lease that a background task
renews; if this server dies, the next operation on each node frees what it held. If the
lease cannot be renewed in time (or turns out to have lapsed), every session is ended: their
holds may already be free, so serving them on would corrupt the counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace

from ferryman.access.signing import Signer
from ferryman.algorithms.copies import COPIES, node_name
from ferryman.algorithms.copies.model import (
    CopyGroup,
    CopyPolicy,
    CopyStore,
    Holder,
    ReserveOutcome,
    Wait,
    hold_fields,
)
from ferryman.backends.base import Backend
from ferryman.clock import Clock
from ferryman.core.rules import Rule
from ferryman.engine import RateLimitEngine
from ferryman.errors import (
    AccessDeniedError,
    BackendError,
    FerrymanError,
    HoldError,
    LeaseLostError,
    NotFoundError,
    SessionError,
    TooManyStreamsError,
)
from ferryman.stats import Stats

__all__ = ["HoldManager", "Session"]

log = logging.getLogger("ferryman.holds")

HoldKey = tuple[str, str, tuple[str, ...]]  # node, tenant, groups at reserve time

#: How long a waiter's entry outlives the wait it asked for, so that the store never drops
#: a live waiter first; a dead replica's waiters lapse this long after their wait.
QUEUE_GRACE_MS = 2000
#: How often a replica asks the store which of its waiters were granted: rarely where
#: grants are announced (a safety net for a lost announcement), often where they are not.
POLL_PUSHED = 1.0
POLL_UNPUSHED = 0.02


@dataclass
class Session:
    """One client's stream and the copies it holds."""

    id: str
    client: str
    holds: dict[HoldKey, int] = field(default_factory=dict)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    # One operation at a time per session, and none once it is closed: a call still running
    # when the stream ends must finish (and be accounted) before the hold set is released.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    # Who opened it (identity and connection): only calls from there may use it.
    owner: str = ""

    @property
    def held(self) -> int:
        return sum(self.holds.values())


@dataclass(frozen=True, slots=True)
class Reservation:
    policy: CopyPolicy
    groups: tuple[CopyGroup, ...]
    outcome: ReserveOutcome


@dataclass
class _Queues:
    """This replica's waiters: per waiter its node and what wakes it, the caps, and what
    became of the waits."""

    max_per_node: int
    max_all: int
    waiters: dict[str, tuple[str, asyncio.Future[None]]] = field(default_factory=dict)
    per_node: dict[str, int] = field(default_factory=dict)
    granted: int = 0  # waits that ended with copies
    timed_out: int = 0  # waits that ended with none, at their deadline
    left: int = 0  # waiters that went away (the call was cancelled)
    full: int = 0  # waiters refused because a queue was full
    waited_ms: int = 0  # time waited, all waits together

    def nodes(self) -> set[str]:
        return set(self.per_node)

    def join(self, node: str, waiter: str, loop: asyncio.AbstractEventLoop) -> None:
        """Count a waiter in (its future made before the store can announce its grant), or
        TooManyStreamsError past a cap."""
        here = self.per_node.get(node, 0)
        if here >= self.max_per_node or len(self.waiters) >= self.max_all:
            self.full += 1
            most, what = (
                (self.max_per_node, f"waiters on {node}")
                if here >= self.max_per_node
                else (self.max_all, "waiters on held copies")
            )
            raise TooManyStreamsError(
                f"{what}: this server already queues {most}, the most it may "
                "(HOLD_QUEUE_MAX_PER_NODE, HOLD_QUEUE_MAX); try later"
            )
        self.waiters[waiter] = (node, loop.create_future())
        self.per_node[node] = here + 1

    def drop(self, waiter: str) -> None:
        node, _ = self.waiters.pop(waiter)
        here = self.per_node[node] - 1
        if here:
            self.per_node[node] = here
        else:
            del self.per_node[node]

    def wake(self, waiter: str) -> None:
        found = self.waiters.get(waiter)
        if found is not None and not found[1].done():
            found[1].set_result(None)

    def status(self) -> dict[str, object]:
        return {
            "waiting": len(self.waiters),
            "nodes": dict(sorted(self.per_node.items())),
            "max_per_node": self.max_per_node,
            "max": self.max_all,
            "granted": self.granted,
            "timed_out": self.timed_out,
            "left": self.left,
            "full": self.full,
            "waited_seconds": self.waited_ms / 1000,
        }


def _tenant(entries: Sequence[tuple[str, str]]) -> str:
    return "_".join(v for _, v in entries)


class HoldManager:
    """Sessions, their hold sets, and this server's lease on the shared copy log."""

    def __init__(
        self,
        engine: RateLimitEngine,
        backend: Backend,
        clock: Clock,
        stats: Stats,
        *,
        lease_seconds: float = 10.0,
        signer: Signer | None = None,
        queue_max_per_node: int = 1000,
        queue_max: int = 10000,
    ) -> None:
        self._signer = signer or Signer(b"")
        self._engine = engine
        self._backend = backend
        self._clock = clock
        self._stats = stats
        self.lease_ms = max(1, round(lease_seconds * 1000))
        self.server_id = uuid.uuid4().hex[:16]
        self.sessions: dict[str, Session] = {}
        self._nodes: dict[str, int] = {}  # node -> copies this server holds there
        self._renewer: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[object]] = set()
        self._renewed_at = time.monotonic()
        # Operations in flight, and the gate a trim closes while it counts what is held.
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open_gate = asyncio.Event()
        self._open_gate.set()
        self.queue = _Queues(queue_max_per_node, queue_max)
        # Where the store announces this replica's waiters' grants (stable across leases).
        self.channel = f"{engine.options.cache_key_prefix}ferryman_copies_wake:{uuid.uuid4().hex}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unlisten: Callable[[], None] = lambda: None

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._renewer = asyncio.create_task(self._background(), name="ferryman-lease")

    async def _background(self) -> None:
        """The lease's renewal and the waiters' wake-ups, stopped together."""
        self._unlisten = self._copies.listen(self.channel, self._woken)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._renew())
                group.create_task(self._poll())
        finally:
            self._unlisten()

    async def stop(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.wait({self._renewer}, timeout=1)
        for session in list(self.sessions.values()):
            await self.close(session)
        if self._pending:
            await asyncio.wait(self._pending, timeout=5)

    async def _renew(self) -> None:
        interval = self.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                nodes = {n for n, held in self._nodes.items() if held > 0}
                for node in sorted(nodes | self.queue.nodes()):
                    await self._copies.renew(self._holder(node))
                self._renewed_at = time.monotonic()
            except LeaseLostError:
                self._lose("this server's lease on the copy log lapsed; its holds were freed")
            except BackendError as exc:
                late = time.monotonic() - self._renewed_at
                if late * 1000 >= self.lease_ms:
                    self._lose(f"cannot renew the lease for {late:.1f}s: {exc}")

    def _lose(self, reason: str) -> None:
        """End every session: their holds are (or may be) freed already."""
        if self.sessions:
            log.error("ending %d sessions: %s", len(self.sessions), reason)
        for session in self.sessions.values():
            session.holds.clear()
            session.closed = True
            session.reason = reason
            session.ended.set()
        self.sessions.clear()
        self._nodes.clear()
        self.server_id = uuid.uuid4().hex[:16]
        self._renewed_at = time.monotonic()
        self._stats.inc("ratelimit.service.holds.lease_lost")

    def end_all(self, reason: str) -> None:
        """End every session's stream, telling its client ``reason`` (the server stops):
        unlike a lapsed lease, what each holds is still counted, and is released once, as
        its stream ends (or by stop(), whichever comes first)."""
        for session in self.sessions.values():
            session.reason = reason
            session.ended.set()

    def _node(self, domain: str, entries: Sequence[tuple[str, str]]) -> Rule:
        """The copy-limited node ``entries`` reach, or a client error."""
        return self._engine.resolve(domain, entries, (COPIES.name,), "copies (held resources)")[-1]

    @property
    def _copies(self) -> CopyStore:
        return self._backend.store(COPIES.name)  # type: ignore[no-any-return]

    def _name(self, rule: Rule) -> str:
        return node_name(self._engine.options.cache_key_prefix, rule)

    def _holder(self, node: str) -> Holder:
        """This server, on ``node``, now (its lease renewed by the call)."""
        return Holder(node, self.server_id, self.lease_ms, self._clock.now())

    # -- sessions -----------------------------------------------------------------------

    def open(self, client: str, owner: str = "") -> Session:
        session = Session(uuid.uuid4().hex, client, owner=owner)
        self.sessions[session.id] = session
        self._stats.inc("ratelimit.service.holds.sessions_opened")
        return session

    def get(self, session_id: str | None, owner: str | None = None) -> Session:
        """The open session ``session_id``; with ``owner``, only when that caller (identity
        and connection) opened it: a session id is not a bearer value."""
        if not session_id:
            raise SessionError(
                "ferryman-session",
                "no session: open a Session stream and send its id in the "
                "'ferryman-session' metadata",
            )
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError(
                "ferryman-session", f"session {session_id!r} is not open on this server"
            )
        if owner is not None and session.owner != owner:
            self._stats.inc("ratelimit.service.holds.foreign_session")
            raise AccessDeniedError(
                "use a session", "ferryman-session", owner.split(" ", 1)[0] or "a caller"
            )
        return session

    async def close(self, session: Session) -> None:
        """End a session and release everything it still holds (one call per hold)."""
        if self.sessions.pop(session.id, None) is None:
            return
        session.closed = True
        self._stats.inc("ratelimit.service.holds.sessions_closed")
        async with session.lock:
            await self._release_all(session)

    async def _release_all(self, session: Session) -> None:
        holds, session.holds = dict(session.holds), {}
        for (node, tenant, groups), copies in holds.items():
            try:
                await self._copies.release(self._holder(node), tenant, groups, copies)
                self._count(node, -copies)
            except LeaseLostError:
                self._lose("this server's lease lapsed")
                return
            except (BackendError, HoldError) as exc:
                # The lease makes these copies free once this server stops renewing them
                # (no session holds them now: they no longer count towards the renewal),
                # so retrying forever is not needed; say what happened.
                self._count(node, -copies)
                log.warning("could not release %d copies of %s for %s: %s", copies, node,
                            tenant, exc)  # fmt: skip

    def spawn_close(self, session: Session) -> None:
        """Close a session in the background (from a stream that is being cancelled)."""
        task = asyncio.get_running_loop().create_task(self.close(session))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _count(self, node: str, delta: int) -> None:
        held = self._nodes.get(node, 0) + delta
        if held <= 0:
            self._nodes.pop(node, None)
        else:
            self._nodes[node] = held

    def _hold(self, session: Session, key: HoldKey, delta: int) -> None:
        held = session.holds.get(key, 0) + delta
        if held <= 0:
            session.holds.pop(key, None)
        else:
            session.holds[key] = held
        self._count(key[0], delta)

    @contextlib.asynccontextmanager
    async def _operation(self, session: Session) -> AsyncIterator[None]:
        """Run one operation of a session: serialized, refused once the session is closed;
        a lapsed lease seen by the call ends every session."""
        async with session.lock:
            if session.closed:
                raise SessionError("ferryman-session", f"session {session.id!r} has ended")
            await self._open_gate.wait()
            self._inflight += 1
            self._idle.clear()
            try:
                yield
            except LeaseLostError:
                self._lose("this server's lease on the copy log lapsed; its holds were freed")
                raise
            finally:
                self._inflight -= 1
                if not self._inflight:
                    self._idle.set()

    def reaches_copies(self, domain: str, entries: Sequence[tuple[str, str]]) -> bool:
        """Whether ``entries`` reach a copy-limited node (what a reset then frees)."""
        try:
            self._node(domain, entries)
        except FerrymanError:
            return False
        return True

    async def free_stranded(self, domain: str, entries: Sequence[tuple[str, str]]) -> int:
        """Free the copies this server holds on the node ``entries`` reach that none of its
        sessions holds (a release that failed when its session ended); how many. Operations
        wait meanwhile, so that none is counted half done."""
        node = self._name(self._node(domain, entries))
        self._open_gate.clear()
        try:
            await self._idle.wait()
            keep: dict[str, int] = {}
            for session in self.sessions.values():
                for (n, tenant, groups), copies in session.holds.items():
                    if n == node:
                        for f in hold_fields(tenant, groups):
                            keep[f] = keep.get(f, 0) + copies
            freed = await self._copies.trim(self._holder(node), keep)
        finally:
            self._open_gate.set()
        self._stats.inc("ratelimit.service.holds.stranded_freed", freed)
        return freed

    # -- operations ---------------------------------------------------------------------

    async def reserve(
        self,
        session: Session,
        domain: str,
        entries: Sequence[tuple[str, str]],
        copies: int,
        min_copies: int,
        wait: float = 0.0,
        priority: int = 0,
    ) -> Reservation:
        """Reserve copies now; with ``wait`` (seconds), wait in the node's queue (in turn,
        by ``priority``) for copies that cannot be had now, answered with 0 at its end."""
        rule = self._node(domain, entries)
        policy = rule.limit
        assert isinstance(policy, CopyPolicy)
        tenant = _tenant(entries)
        groups = policy.groups_of(tenant)
        node = self._name(rule)
        key = (node, tenant, tuple(g.name for g in groups))
        waiter = None
        if wait > 0 and self._loop is not None:
            waiter = Wait(uuid.uuid4().hex, priority, round(wait * 1000) + QUEUE_GRACE_MS,
                          self.channel)  # fmt: skip
            try:
                self.queue.join(node, waiter.id, self._loop)
            except TooManyStreamsError:
                self._stats.inc("ratelimit.service.holds.queue_full")
                raise
        try:
            try:
                async with self._operation(session):
                    outcome = await self._copies.reserve(
                        self._holder(node), tenant, policy, groups, copies, min_copies, waiter
                    )
                    if outcome.granted:
                        self._hold(session, key, outcome.granted)
            except BaseException:
                # Cut short (cancelled, a backend error) the call may still have joined the
                # queue: leave it, so that nothing is granted to a waiter nobody collects.
                if waiter is not None:
                    self._abandon(session, key, waiter.id)
                raise
            if outcome.queued and waiter is not None:
                got = await self._waited(session, key, waiter.id, wait)
                outcome = replace(outcome, granted=got)
        finally:
            if waiter is not None:
                self.queue.drop(waiter.id)
        return Reservation(policy, groups, outcome)

    async def _waited(self, session: Session, key: HoldKey, waiter: str, wait: float) -> int:
        """Wait for a queued reservation's grant, at most ``wait`` seconds; the copies its
        session now holds. A cancelled call leaves the queue (what it was granted freed)."""
        future = self.queue.waiters[waiter][1]
        start = time.monotonic()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await future
        except asyncio.CancelledError:
            self.queue.left += 1
            self._abandon(session, key, waiter)
            raise
        got = await self._leave(session, key, waiter, True)
        self.queue.waited_ms += round((time.monotonic() - start) * 1000)
        if got:
            self.queue.granted += 1
            self._stats.inc("ratelimit.service.holds.queue_granted")
        else:
            self.queue.timed_out += 1
            self._stats.inc("ratelimit.service.holds.queue_timed_out")
        return got

    def _abandon(self, session: Session, key: HoldKey, waiter: str) -> None:
        """Leave the queue in a task of its own (the call is going away), freeing any grant."""
        task = asyncio.get_running_loop().create_task(self._leave(session, key, waiter, False))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _leave(self, session: Session, key: HoldKey, waiter: str, keep: bool) -> int:
        """Take the waiter out of the queue; what it was granted is held by the session
        (``keep``, and the session still open) or released at once."""
        node, tenant, groups = key
        async with session.lock:
            try:
                got = await self._copies.leave(self._holder(node), waiter)
                if not got:
                    return 0
                if keep and not session.closed:
                    self._hold(session, key, got)
                    return got
                await self._copies.release(self._holder(node), tenant, groups, got)
            except LeaseLostError:
                self._lose("this server's lease on the copy log lapsed; its holds were freed")
                if keep:
                    raise
            except (BackendError, HoldError) as exc:
                # The copies are this server's, under its lease: freed with it at worst.
                if keep and isinstance(exc, BackendError):
                    raise
                log.warning("a waiter on %s could not leave its queue: %s", node, exc)
            return 0

    def _woken(self, waiter: str) -> None:
        """A waiter's grant was announced (from any thread)."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self.queue.wake, waiter)

    async def _poll(self) -> None:
        """Ask the store which waiters were granted: often where grants are not announced
        (one call per node with waiters), rarely where they are (a lost announcement)."""
        interval = POLL_PUSHED if self._copies.pushes else POLL_UNPUSHED
        while True:
            await asyncio.sleep(interval)
            by_node: dict[str, list[str]] = {}
            for waiter, (node, _) in list(self.queue.waiters.items()):
                by_node.setdefault(node, []).append(waiter)
            for node, waiters in by_node.items():
                try:
                    for waiter in await self._copies.granted(self._holder(node), waiters):
                        self.queue.wake(waiter)
                except (BackendError, LeaseLostError) as exc:
                    log.debug("asking for %s's grants: %s", node, exc)

    def _held(self, session: Session, key: HoldKey, copies: int) -> None:
        held = session.holds.get(key, 0)
        if copies > held:
            groups = ", ".join(key[2]) or "no groups"
            raise HoldError(
                "copies",
                f"{copies} is more than this session holds for {key[1]!r} in [{groups}] ({held})",
            )

    async def release(
        self,
        session: Session,
        domain: str,
        entries: Sequence[tuple[str, str]],
        copies: int,
        groups: Sequence[str],
    ) -> None:
        rule = self._node(domain, entries)
        key = (
            self._name(rule),
            _tenant(entries),
            tuple(groups),
        )
        async with self._operation(session):
            self._held(session, key, copies)
            await self._copies.release(self._holder(key[0]), key[1], key[2], copies)
            self._hold(session, key, -copies)

    async def transfer(
        self,
        session: Session,
        domain: str,
        entries: Sequence[tuple[str, str]],
        copies: int,
        groups: Sequence[str],
        ttl: float,
    ) -> str:
        rule = self._node(domain, entries)
        key = (
            self._name(rule),
            _tenant(entries),
            tuple(groups),
        )
        secret = uuid.uuid4().hex
        payload = json.dumps([domain, [list(e) for e in entries], secret], separators=(",", ":"))
        transfer_id = self._signer.sign(payload.encode())
        async with self._operation(session):
            self._held(session, key, copies)
            await self._copies.transfer(self._holder(key[0]), key[1], key[2], copies, ttl, secret)
            self._hold(session, key, -copies)
        self._stats.inc("ratelimit.service.holds.transfers_staged")
        return transfer_id

    def _opened(self, transfer_id: str) -> tuple[str, tuple[tuple[str, str], ...], str]:
        """(domain, entries, secret) of a transfer id this service signed."""
        payload = self._signer.open(transfer_id)
        try:
            if payload is None:
                raise ValueError("not signed by this service")
            domain, raw_entries, secret = json.loads(payload)
            entries = tuple((str(k), str(v)) for k, v in raw_entries)
        except (ValueError, TypeError):
            self._stats.inc("ratelimit.service.holds.transfer_id_refused")
            raise NotFoundError("transfer_id", "unknown or expired transfer") from None
        return str(domain), entries, str(secret)

    def transfer_domain(self, transfer_id: str) -> str:
        """The domain a transfer id names (NotFoundError for one this service did not sign)."""
        return self._opened(transfer_id)[0]

    async def seize(
        self, session: Session, transfer_id: str
    ) -> tuple[str, tuple[tuple[str, str], ...], tuple[str, ...], int]:
        domain, entries, secret = self._opened(transfer_id)
        rule = self._node(domain, entries)
        node = self._name(rule)
        async with self._operation(session):
            seized = await self._copies.seize(self._holder(node), secret)
            copies, groups = seized.copies, seized.groups
            # Held as the store recorded the transfer (its tenant), so that the session
            # releases exactly what was seized.
            self._hold(session, (node, seized.tenant, groups), copies)
        self._stats.inc("ratelimit.service.holds.transfers_seized")
        return domain, entries, groups, copies

    @property
    def transfers_expired(self) -> int:
        """Transfers that lapsed unclaimed in operations made through this server's backend
        (expiry happens at the start of the next operation on the node, whoever makes it)."""
        return self._copies.transfers_expired

    def by_node(self) -> list[tuple[dict[str, str], int]]:
        """Copies held per node by this server's sessions, as (labels, value)."""
        return [({"node": node}, held) for node, held in sorted(self._nodes.items())]

    def by_group(self) -> list[tuple[dict[str, str], int]]:
        """Copies held per (node, group) by this server's sessions; nodes and groups come
        from configuration, so the set is bounded."""
        held: dict[tuple[str, str], int] = {}
        for session in list(self.sessions.values()):
            for (node, _tenant, groups), copies in list(session.holds.items()):
                for group in groups:
                    held[node, group] = held.get((node, group), 0) + copies
        return [({"node": n, "group": g}, c) for (n, g), c in sorted(held.items())]

    def session_count(self) -> int:
        return len(self.sessions)

    def copies_count(self) -> int:
        return self.copies_held

    @property
    def copies_held(self) -> int:
        """Copies this server's sessions hold, all nodes together."""
        return sum(self._nodes.values())

    def status(self) -> dict[str, object]:
        return {
            "server_id": self.server_id,
            "lease_seconds": self.lease_ms / 1000,
            "sessions": len(self.sessions),
            "copies_held": self.copies_held,
            # Per node: what this server's sessions hold there (a bounded set: nodes come
            # from configuration).
            "nodes": dict(sorted(self._nodes.items())),
            # This server's waiters: how many per node, and what became of the waits.
            "queue": self.queue.status(),
        }
