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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from ferryman.access.signing import Signer
from ferryman.algorithms.copies import COPIES, node_name
from ferryman.algorithms.copies.model import (
    CopyGroup,
    CopyPolicy,
    CopyStore,
    Holder,
    ReserveOutcome,
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
)
from ferryman.stats import Stats

__all__ = ["HoldManager", "Session"]

log = logging.getLogger("ferryman.holds")

HoldKey = tuple[str, str, tuple[str, ...]]  # node, tenant, groups at reserve time


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
        self._pending: set[asyncio.Task[None]] = set()
        self._renewed_at = time.monotonic()
        # Operations in flight, and the gate a trim closes while it counts what is held.
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open_gate = asyncio.Event()
        self._open_gate.set()

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._renewer = asyncio.create_task(self._renew(), name="ferryman-lease")

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
                for node in [n for n, held in self._nodes.items() if held > 0]:
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
    ) -> Reservation:
        rule = self._node(domain, entries)
        policy = rule.limit
        assert isinstance(policy, CopyPolicy)
        tenant = _tenant(entries)
        groups = policy.groups_of(tenant)
        node = self._name(rule)
        async with self._operation(session):
            outcome = await self._copies.reserve(
                self._holder(node), tenant, policy, groups, copies, min_copies
            )
            if outcome.granted:
                key = (node, tenant, tuple(g.name for g in groups))
                self._hold(session, key, outcome.granted)
        return Reservation(policy, groups, outcome)

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
        }
