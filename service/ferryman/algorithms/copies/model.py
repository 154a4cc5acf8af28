"""Copy-limited nodes (Charon's held resources): a counting semaphore per tenant, group, node.

A tenant (the request's values along the node's path) may hold at most ``limit`` copies;
all tenants of a group together at most the group's ``limit`` (a tenant in several groups
takes one copy from each group's pool); all tenants of the node together at most
``global_limit``. ``None`` means unbounded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from ferryman.core.rules import Unnamed

__all__ = [
    "CopyGroup",
    "CopyPolicy",
    "CopyStore",
    "Holder",
    "ReserveOutcome",
    "Seized",
    "Wait",
    "grantable",
]


def _pattern(member: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in member.split("*")), re.DOTALL)


@dataclass(frozen=True, slots=True)
class CopyGroup:
    """A named pool shared by the tenants that match one of ``members`` ('*' wildcards)."""

    name: str
    limit: int
    members: tuple[str, ...]

    def has(self, tenant: str) -> bool:
        return any(_pattern(m).fullmatch(tenant) for m in self.members)


@dataclass(frozen=True, slots=True)
class CopyPolicy(Unnamed):
    """A copy-limited node's limits."""

    limit: int | None = None
    global_limit: int | None = None
    groups: tuple[CopyGroup, ...] = ()
    # How long a hold taken through Envoy (ShouldRateLimit) lasts if the proxy never
    # reports the stream's end.
    hold_ttl: float = 300.0
    kind: ClassVar[str] = "copies"

    def groups_of(self, tenant: str) -> tuple[CopyGroup, ...]:
        """The groups a tenant belongs to now, in config order."""
        return tuple(g for g in self.groups if g.has(tenant))

    def describe(self) -> str:
        parts = [f"copies limit={'unbounded' if self.limit is None else self.limit}"]
        if self.global_limit is not None:
            parts.append(f"global_limit={self.global_limit}")
        for g in self.groups:
            parts.append(f"group {g.name}={g.limit} [{', '.join(g.members)}]")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who calls the copy store, on which node, and when.

    ``server`` is the calling server's id and ``lease_ms`` its lease (every call renews it;
    0 for Envoy's holds, which no server owns); ``now`` is the caller's clock in seconds, or
    None for the store's own time (the Redis server's clock on Redis).
    """

    node: str
    server: str
    lease_ms: int = 0
    now: float | None = None


@dataclass(frozen=True, slots=True)
class ReserveOutcome:
    """What a reservation got, with the counts after it (Charon's reserve context)."""

    granted: int
    tenant_held: int
    global_held: int
    group_held: Mapping[str, int]
    # Not granted now, and waiting in the node's queue (a reserve with a ``Wait``).
    queued: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """How a reservation that cannot be granted now waits in its node's queue.

    ``id`` names the waiter (unique), ``priority`` orders the queue (higher first, then by
    arrival), ``max_ms`` is the longest it waits (its entry lapses then, whoever dies), and
    ``channel`` is where the store announces the waiter's grant (the waiting replica's).
    """

    id: str
    priority: int
    max_ms: int
    channel: str


@dataclass(frozen=True, slots=True)
class Seized:
    """What a seize claimed: enough to hold the copies as if they had been reserved."""

    node: str
    tenant: str
    copies: int
    groups: tuple[str, ...]


def grantable(
    policy: CopyPolicy,
    groups: tuple[CopyGroup, ...],
    tenant_held: int,
    group_held: Mapping[str, int],
    global_held: int,
    copies: int,
    min_copies: int,
) -> int:
    """The largest n in [min_copies, copies] the limits allow now, or 0."""
    room = copies
    if policy.limit is not None:
        room = min(room, policy.limit - tenant_held)
    for group in groups:
        room = min(room, group.limit - group_held.get(group.name, 0))
    if policy.global_limit is not None:
        room = min(room, policy.global_limit - global_held)
    return room if room >= max(min_copies, 1) else 0


def shared_room(
    policy: CopyPolicy,
    groups: tuple[CopyGroup, ...],
    group_held: Mapping[str, int],
    global_held: int,
) -> bool:
    """Whether the pools a tenant shares with others (its groups, the node) have a copy
    left: a waiter that finds none blocks every waiter behind it."""
    if policy.global_limit is not None and global_held >= policy.global_limit:
        return False
    return all(group_held.get(g.name, 0) < g.limit for g in groups)


def hold_fields(tenant: str, groups: tuple[str, ...]) -> list[str]:
    """The counts a held copy adds to: its tenant's, every copy's, and each group's."""
    return [f"d:{tenant}", "all", *(f"g:{g}" for g in groups)]


class CopyStore(Protocol):
    """Where held copies live. Every call renews the ``holder``'s lease and first frees what
    servers with lapsed leases held on the node (raising LeaseLostError to the caller whose
    own lease lapsed)."""

    @property
    def transfers_expired(self) -> int:
        """Transfers this process has seen lapse unclaimed (a running total, for metrics)."""
        ...

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
        """Grant copies now, in turn: waiters queued on the node are served first. With
        ``wait``, a reservation not granted now joins the queue (``queued``) and is granted
        later by whichever call frees copies (announced on the wait's channel), until it
        leaves."""
        ...

    async def peek(
        self, holder: Holder, tenant: str, groups: tuple[CopyGroup, ...]
    ) -> tuple[ReserveOutcome, int]:
        """The counts a tenant's reservation would see now (``granted`` 0) and how many
        waiters the node's queue holds, taking and renewing nothing."""
        ...

    async def leave(self, holder: Holder, waiter: str) -> int:
        """Take a waiter out of its node's queue; the copies it was granted meanwhile (now
        held by ``holder``'s server), or 0."""
        ...

    @property
    def pushes(self) -> bool:
        """Whether ``listen`` announces every grant (else ask ``granted`` now and then)."""
        ...

    async def granted(self, holder: Holder, waiters: list[str]) -> list[str]:
        """Those of ``waiters`` (queued on ``holder``'s node) granted copies."""
        ...

    def listen(self, channel: str, wake: Callable[[str], None]) -> Callable[[], None]:
        """Call ``wake(waiter id)`` (from any thread) when a waiter announced on ``channel``
        is granted or dropped; returns what stops listening."""
        ...

    async def release(
        self, holder: Holder, tenant: str, groups: tuple[str, ...], copies: int
    ) -> None: ...

    async def transfer(
        self,
        holder: Holder,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        ttl: float,
        transfer_id: str,
    ) -> None: ...

    async def seize(self, holder: Holder, transfer_id: str) -> Seized: ...

    async def renew(self, holder: Holder) -> None: ...

    async def trim(self, holder: Holder, keep: Mapping[str, int]) -> int:
        """Free what ``holder`` holds on its node beyond ``keep`` (field -> copies: what
        its sessions hold, fields as ``hold_fields``); the copies freed."""
        ...

    async def envoy_reserve(
        self,
        holder: Holder,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        hold_id: str,
    ) -> ReserveOutcome:
        """Hold all of ``copies`` for Envoy, or none; the hold expires after the policy's
        ``hold_ttl`` unless released first. No server owns it."""
        ...

    async def envoy_release(self, holder: Holder, tenant: str, copies: int) -> int:
        """Release up to ``copies`` of the tenant's Envoy holds, oldest first; how many."""
        ...
