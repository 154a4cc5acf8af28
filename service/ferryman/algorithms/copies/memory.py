"""Held copies in this process: the twin of copies.lua beside this file.

Counts per node ("d:<tenant>", "g:<group>", "all"), each server's contribution to them, the
servers' lease expiries, and staged transfers. Every operation first takes back what servers
with lapsed leases held and what transfers nobody seized in time still hold.

What a node keeps (its counts, Envoy holds and the tenants that have some, servers' leases
and lapsed servers, staged transfers, grants not collected yet) counts against the memory
backend's cap (``MEMORY_MAX_KEYS``, ``core.memory_cap``; ``copies`` in its shares). To make
room, only what nothing holds any more goes: holds, leases, transfers and grants past their
time (as the next operation on their node would take them back) and tenants whose Envoy
holds are all gone; a live hold is never forgotten. A new hold that finds no room is
refused (no copies granted), as when the node is full.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ferryman.algorithms.copies.model import (
    CopyGroup,
    CopyPolicy,
    Holder,
    ReserveOutcome,
    Seized,
    Wait,
    grantable,
    hold_fields,
    shared_room,
)
from ferryman.clock import Clock
from ferryman.core.memory_cap import MemoryCap
from ferryman.errors import HoldError, LeaseLostError, NotFoundError

__all__ = ["MemoryCopies"]


@dataclass
class _Transfer:
    tenant: str
    copies: int
    groups: tuple[str, ...]
    expires_ms: int


@dataclass
class _Waiter:
    server: str
    channel: str
    tenant: str
    policy: CopyPolicy
    groups: tuple[CopyGroup, ...]
    copies: int
    min_copies: int
    deadline_ms: int


@dataclass
class _Queue:
    """A node's waiters: priority -> waiter id -> waiter, in arrival order; and the copies
    granted to waiters that have not left yet."""

    by_priority: dict[int, dict[str, _Waiter]] = field(default_factory=dict)
    # id -> (server, fields of the copies, n, deadline): held by that server, not collected
    # yet; forgotten at the waiter's deadline (its copies then stranded, a trim frees them).
    granted: dict[str, tuple[str, list[str], int, int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(w) for w in self.by_priority.values())

    def remove(self, waiter: str) -> _Waiter | None:
        for priority, waiters in self.by_priority.items():
            found = waiters.pop(waiter, None)
            if found is not None:
                if not waiters:
                    del self.by_priority[priority]
                return found
        return None


@dataclass
class _Node:
    counts: dict[str, int] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    contributions: dict[str, dict[str, int]] = field(default_factory=dict)
    transfers: dict[str, _Transfer] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)  # lapsed server -> when (kept a day)
    # Envoy holds (no server owns them): id -> (expiry, tenant, copies, groups), and each
    # tenant's hold ids, oldest first.
    envoy: dict[str, tuple[int, str, int, tuple[str, ...]]] = field(default_factory=dict)
    envoy_order: dict[str, deque[str]] = field(default_factory=dict)
    queue: _Queue = field(default_factory=_Queue)

    def __len__(self) -> int:
        return (
            len(self.counts)
            + len(self.leases)
            + len(self.dead)
            + len(self.transfers)
            + len(self.envoy)
            + len(self.envoy_order)
            + len(self.queue.granted)
        )


_fields = hold_fields


def _live(state: _Node, ids: deque[str]) -> bool:
    """Whether any of a tenant's Envoy hold ids is still held."""
    return any(hid in state.envoy for hid in ids)


class MemoryCopies:
    """The copy store of the memory backend: held copies of every copy-limited node, each
    operation atomic under one lock."""

    def __init__(self, clock: Clock, cap: MemoryCap | None = None) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._now_ms = 0  # the last operation's time, for making room between operations
        self.cap = MemoryCap() if cap is None else cap
        self.cap.join("copies", self)
        # Transfers that lapsed unclaimed, all nodes together (copies.lua reports the same
        # count per call, which the Redis backend adds up under the same name).
        self.transfers_expired = 0
        self._wakers: dict[str, Callable[[str], None]] = {}

    #: Grants are announced in this process, as they happen.
    pushes = True

    def __len__(self) -> int:
        """Entries held over every node (nodes are configured: a handful)."""
        return sum(len(state) for state in self._nodes.values())

    def make_room(self, want: int) -> int:
        with self._lock:
            return self._make_room(want)

    def _make_room(self, want: int) -> int:
        """Take back what is past its time on every node and forget the tenants with no
        Envoy hold left; how many entries went (``want`` is a floor, not a bound: what is
        past its time goes at once)."""
        before = len(self)
        for state in self._nodes.values():
            self._clean(state, "", self._now_ms)
            for tenant in [t for t, ids in state.envoy_order.items() if not _live(state, ids)]:
                del state.envoy_order[tenant]
            if before - len(self) >= want:
                break
        return max(0, before - len(self))

    def _admit(
        self, state: _Node, tenant: str, groups: tuple[CopyGroup, ...], envoy: bool = False
    ) -> bool:
        """Whether a hold of ``tenant`` may be kept: the counts it starts (a tenant or
        group holding nothing yet) and, for Envoy, its hold id and tenant, fit the cap."""
        if not self.cap.max_keys:
            return True
        counts = state.counts
        need = sum(f not in counts for f in _fields(tenant, tuple(g.name for g in groups)))
        if envoy:
            need += 1 + (tenant not in state.envoy_order)
        elif not need:
            return True
        return self.cap.admit(self, need, self._make_room)

    async def granted(self, holder: Holder, waiters: list[str]) -> list[str]:
        with self._lock:
            state = self._node(holder, self._ms(holder.now))
            return [w for w in waiters if w in state.queue.granted]

    def listen(self, channel: str, wake: Callable[[str], None]) -> Callable[[], None]:
        self._wakers[channel] = wake
        return lambda: self._wakers.pop(channel, None) and None

    def _wake(self, channel: str, waiter: str) -> None:
        wake = self._wakers.get(channel)
        if wake is not None:
            wake(waiter)

    def _serve(self, state: _Node, now_ms: int, quiet: str = "") -> None:
        """Grant what the node's queue can have now, in order: higher priority first, then
        by arrival. A waiter that does not fit keeps its own tenant's later waiters waiting;
        one that finds the shared pools empty keeps everyone behind it waiting."""
        queue = state.queue
        for wid, (*_, deadline_ms) in list(queue.granted.items()):
            if deadline_ms < now_ms:
                del queue.granted[wid]
        blocked: set[str] = set()
        for priority in sorted(queue.by_priority, reverse=True):
            for wid, w in list(queue.by_priority[priority].items()):
                if w.deadline_ms < now_ms or w.server not in state.leases:
                    queue.remove(wid)
                    if wid != quiet:
                        self._wake(w.channel, wid)
                    continue
                if w.tenant in blocked:
                    continue
                n = self._room(state, w.tenant, w.policy, w.groups, w.copies, w.min_copies)
                if n:
                    self._grant(state, w.server, w.tenant, w.groups, n)
                    queue.remove(wid)
                    names = tuple(g.name for g in w.groups)
                    fields = _fields(w.tenant, names)
                    queue.granted[wid] = (w.server, fields, n, w.deadline_ms)
                    if wid != quiet:
                        self._wake(w.channel, wid)
                    continue
                counts = state.counts
                held = {g.name: counts.get(f"g:{g.name}", 0) for g in w.groups}
                if not shared_room(w.policy, w.groups, held, counts.get("all", 0)):
                    return
                blocked.add(w.tenant)

    def _grant(
        self, state: _Node, server: str, tenant: str, groups: tuple[CopyGroup, ...], n: int
    ) -> None:
        mine = state.contributions.setdefault(server, {})
        for f in _fields(tenant, tuple(g.name for g in groups)):
            self._add(state.counts, f, n)
            self._add(mine, f, n)

    def _node(self, holder: Holder, now_ms: int, serving: bool = True) -> _Node:
        """The node, cleared of lapsed leases and expired transfers and Envoy holds, with
        our lease renewed (``serving``: the call acts on this server's own holds)."""
        server = holder.server
        state = self._nodes.setdefault(holder.node, _Node())
        self._now_ms = now_ms
        lost = self._clean(state, server, now_ms)
        if serving and (lost or server in state.dead):
            raise LeaseLostError(f"the lease of server {server} lapsed; its holds were freed")
        if serving:
            state.leases[server] = now_ms + holder.lease_ms
        if state.queue.by_priority or state.queue.granted:
            self._serve(state, now_ms)
        return state

    def _clean(self, state: _Node, server: str, now_ms: int) -> bool:
        """Take back what lapsed leases, expired transfers and Envoy holds held; whether
        ``server``'s own lease was one."""
        lost = False
        for sid, expiry in list(state.leases.items()):
            if expiry < now_ms:
                if self._forget(state, sid):
                    state.dead[sid] = now_ms
                    lost = lost or sid == server
                del state.leases[sid]
        for sid, when in list(state.dead.items()):
            if when < now_ms - 86_400_000:
                del state.dead[sid]
        for tid, transfer in list(state.transfers.items()):
            if transfer.expires_ms < now_ms:
                for f in _fields(transfer.tenant, transfer.groups):
                    self._add(state.counts, f, -transfer.copies)
                del state.transfers[tid]
                self.transfers_expired += 1
        for hid, (expiry, *_rest) in list(state.envoy.items()):
            if expiry < now_ms:
                self._drop_envoy(state, hid, None)
        return lost

    def _drop_envoy(self, state: _Node, hold_id: str, count: int | None) -> int:
        expiry, tenant, held, groups = state.envoy[hold_id]
        n = held if count is None or count >= held else count
        for f in _fields(tenant, groups):
            self._add(state.counts, f, -n)
        if n == held:
            del state.envoy[hold_id]
        else:
            state.envoy[hold_id] = (expiry, tenant, held - n, groups)
        return n

    async def envoy_reserve(
        self,
        holder: Holder,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        hold_id: str,
    ) -> ReserveOutcome:
        """Hold copies for Envoy: no server owns them; they expire after the policy's
        ``hold_ttl``."""
        now_ms = self._ms(holder.now)
        hold_ttl_ms = round(policy.hold_ttl * 1000)
        with self._lock:
            state = self._node(holder, now_ms, serving=False)
            granted = self._room(state, tenant, policy, groups, copies, copies)
            if granted and not self._admit(state, tenant, groups, envoy=True):
                granted = 0  # no room to keep the hold: refused as when the node is full
            if granted:
                names = tuple(g.name for g in groups)
                for f in _fields(tenant, names):
                    self._add(state.counts, f, granted)
                state.envoy[hold_id] = (now_ms + hold_ttl_ms, tenant, granted, names)
                order = state.envoy_order.setdefault(tenant, deque())
                while order and order[0] not in state.envoy:
                    order.popleft()
                order.append(hold_id)
            return self._outcome(state, tenant, groups, granted)

    async def envoy_release(self, holder: Holder, tenant: str, copies: int) -> int:
        """Release up to ``copies`` of a tenant's Envoy holds, oldest first."""
        now_ms = self._ms(holder.now)
        with self._lock:
            state = self._node(holder, now_ms, serving=False)
            order = state.envoy_order.get(tenant, deque())
            released = 0
            while released < copies and order:
                hold_id = order.popleft()
                if hold_id in state.envoy:
                    released += self._drop_envoy(state, hold_id, copies - released)
                    if hold_id in state.envoy:
                        order.appendleft(hold_id)
            if not order:
                state.envoy_order.pop(tenant, None)
            self._serve(state, now_ms)
            return released

    @staticmethod
    def _room(
        state: _Node,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        min_copies: int,
    ) -> int:
        counts = state.counts
        return grantable(
            policy,
            groups,
            counts.get(f"d:{tenant}", 0),
            {g.name: counts.get(f"g:{g.name}", 0) for g in groups},
            counts.get("all", 0),
            copies,
            min_copies,
        )

    @staticmethod
    def _outcome(
        state: _Node, tenant: str, groups: tuple[CopyGroup, ...], granted: int
    ) -> ReserveOutcome:
        counts = state.counts
        return ReserveOutcome(
            granted,
            counts.get(f"d:{tenant}", 0),
            counts.get("all", 0),
            {g.name: counts.get(f"g:{g.name}", 0) for g in groups},
        )

    @staticmethod
    def _add(table: dict[str, int], key: str, delta: int) -> None:
        value = table.get(key, 0) + delta
        if value <= 0:
            table.pop(key, None)
        else:
            table[key] = value

    def _forget(self, state: _Node, server: str) -> bool:
        held = state.contributions.pop(server, {})
        for f, n in held.items():
            self._add(state.counts, f, -n)
        return bool(held)

    async def reserve(
        self,
        holder: Holder,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        min_copies: int,
        wait: Wait | None = None,
    ) -> ReserveOutcome:
        now_ms = self._ms(holder.now)
        with self._lock:
            state = self._node(holder, now_ms)
            queue = state.queue
            if not queue.by_priority:
                granted = self._room(state, tenant, policy, groups, copies, min_copies)
                if granted and not self._admit(state, tenant, groups):
                    return self._outcome(state, tenant, groups, 0)  # no room to keep it
                if granted:
                    self._grant(state, holder.server, tenant, groups, granted)
                    return self._outcome(state, tenant, groups, granted)
                if wait is None or wait.max_ms <= 0:
                    return self._outcome(state, tenant, groups, 0)
            # Behind the queue: join it, at the back of its priority, and see what is served.
            w = wait or Wait("", 0, 0, "")
            wid = w.id or "-"  # answered within this call: no other waiter has it then
            entry = _Waiter(
                holder.server, w.channel, tenant, policy, groups, copies, min_copies,
                now_ms + max(w.max_ms, 0),
            )  # fmt: skip
            queue.by_priority.setdefault(w.priority, {})[wid] = entry
            self._serve(state, now_ms, quiet=wid)
            got = queue.granted.pop(wid, ("", [], 0, 0))[2]
            if got or w.max_ms <= 0:
                queue.remove(wid)
                return self._outcome(state, tenant, groups, got)
            return replace(self._outcome(state, tenant, groups, 0), queued=True)

    async def peek(
        self, holder: Holder, tenant: str, groups: tuple[CopyGroup, ...]
    ) -> tuple[ReserveOutcome, int]:
        with self._lock:
            state = self._node(holder, self._ms(holder.now), serving=False)
            return self._outcome(state, tenant, groups, 0), len(state.queue)

    async def leave(self, holder: Holder, waiter: str) -> int:
        now_ms = self._ms(holder.now)
        with self._lock:
            state = self._node(holder, now_ms)
            state.queue.remove(waiter)
            got = state.queue.granted.pop(waiter, ("", [], 0, 0))[2]
            self._serve(state, now_ms)
            return got

    def _take(
        self, state: _Node, server: str, tenant: str, groups: tuple[str, ...], n: int
    ) -> None:
        mine = state.contributions.get(server, {})
        for f in _fields(tenant, groups):
            if mine.get(f, 0) < n:
                raise HoldError(
                    "copies", f"{n} is more than this server holds for {f[2:] or 'all'}"
                )
        for f in _fields(tenant, groups):
            self._add(mine, f, -n)

    async def release(
        self, holder: Holder, tenant: str, groups: tuple[str, ...], copies: int
    ) -> None:
        now_ms = self._ms(holder.now)
        with self._lock:
            state = self._node(holder, now_ms)
            self._take(state, holder.server, tenant, groups, copies)
            for f in _fields(tenant, groups):
                self._add(state.counts, f, -copies)
            self._serve(state, now_ms)

    async def transfer(
        self,
        holder: Holder,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        ttl: float,
        transfer_id: str,
    ) -> None:
        now_ms = self._ms(holder.now)
        ttl_ms = round(ttl * 1000)
        with self._lock:
            state = self._node(holder, now_ms)
            self._take(state, holder.server, tenant, groups, copies)
            state.transfers[transfer_id] = _Transfer(tenant, copies, groups, now_ms + ttl_ms)

    async def seize(self, holder: Holder, transfer_id: str) -> Seized:
        now_ms = self._ms(holder.now)
        with self._lock:
            state = self._node(holder, now_ms)
            transfer = state.transfers.pop(transfer_id, None)
            if transfer is None:
                raise NotFoundError("transfer_id", "unknown or expired transfer")
            mine = state.contributions.setdefault(holder.server, {})
            for f in _fields(transfer.tenant, transfer.groups):
                self._add(mine, f, transfer.copies)
            return Seized(holder.node, transfer.tenant, transfer.copies, transfer.groups)

    async def trim(self, holder: Holder, keep: Mapping[str, int]) -> int:
        now_ms = self._ms(holder.now)
        with self._lock:
            state = self._node(holder, now_ms)
            mine = state.contributions.get(holder.server, {})
            keep = dict(keep)
            # Granted to this server's waiters and not collected yet: theirs, not stranded.
            for server, fields, n, _ in state.queue.granted.values():
                if server == holder.server:
                    for f in fields:
                        keep[f] = keep.get(f, 0) + n
            freed = 0
            for f, n in list(mine.items()):
                surplus = n - min(n, keep.get(f, 0))
                if surplus > 0:
                    self._add(mine, f, -surplus)
                    self._add(state.counts, f, -surplus)
                    freed = surplus if f == "all" else freed
            self._serve(state, now_ms)
            return freed

    async def renew(self, holder: Holder) -> None:
        now_ms = self._ms(holder.now)
        with self._lock:
            self._node(holder, now_ms)

    def _ms(self, now: float | None) -> int:
        return round((self._clock.now() if now is None else now) * 1000)

    def queued(self, node: str) -> int:
        """Waiters queued on a node (for status pages and tests)."""
        state = self._nodes.get(node)
        return len(state.queue) if state is not None else 0

    def counts(self, node: str) -> dict[str, int]:
        """A copy of a node's counts (for status pages and tests)."""
        state = self._nodes.get(node)
        return dict(state.counts) if state is not None else {}
