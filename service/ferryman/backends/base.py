"""The contract every counter store implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ferryman.backends.copy_ledger import Seized
from ferryman.limits.burst import BurstOutcome, BurstPolicy
from ferryman.limits.copies import CopyGroup, CopyPolicy, ReserveOutcome

__all__ = ["Backend", "BurstRequest", "CounterOp", "CounterResult"]


@dataclass(slots=True)
class CounterOp:
    """Add ``hits`` (negative: give back) to a fixed-window counter.

    ``expires_at`` is the end of the window (epoch seconds); ``ttl`` is the window's length
    in seconds, the key lifetime a remote store sets (plus its expiration jitter).
    """

    key: str
    hits: int
    limit: int
    expires_at: int
    ttl: int


@dataclass(slots=True)
class CounterResult:
    """The counter's value after the request and how many hits were actually stored."""

    after: int
    applied: int


@dataclass(frozen=True, slots=True)
class BurstRequest:
    """A burst-tier request: ``node`` names the configured node, ``tenant`` the values."""

    node: str
    tenant: str
    policy: BurstPolicy
    copies: int
    min_copies: int


class Backend(Protocol):
    """Stores counters. Every call is one atomic operation over all the counters it names."""

    name: str

    @property
    def transfers_expired(self) -> int:
        """Transfers this process has seen lapse unclaimed (a running total, for metrics)."""
        ...

    async def fixed_window(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult]:
        """Apply every op atomically and return one result per op, in order.

        With ``stop_when_over``, if any op with positive hits would end above its limit, only
        those ops are applied (the others are left untouched and report ``applied=0``).
        A counter never goes below zero.
        """
        ...

    async def burst(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        """Decide and record one burst-tier request atomically.

        ``now`` overrides the store's own clock (tests; the memory backend's injected clock).
        """
        ...

    # Held copies. ``server`` is the calling server's id and ``lease_ms`` its lease: every
    # call renews it, and first frees what servers with lapsed leases held on the node
    # (raising LeaseLostError to the caller whose own lease lapsed).

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
    ) -> ReserveOutcome: ...

    async def release(
        self,
        node: str,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        server: str,
        lease_ms: int,
        now: float | None = None,
    ) -> None: ...

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
    ) -> None: ...

    async def seize(
        self, node: str, transfer_id: str, server: str, lease_ms: int, now: float | None = None
    ) -> Seized: ...

    async def renew(
        self, node: str, server: str, lease_ms: int, now: float | None = None
    ) -> None: ...

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
        """Hold all of ``copies`` for Envoy, or none; the hold expires after the policy's
        ``hold_ttl`` unless released first. No server owns it."""
        ...

    async def envoy_release(
        self, node: str, tenant: str, copies: int, server: str, now: float | None = None
    ) -> int:
        """Release up to ``copies`` of the tenant's Envoy holds, oldest first; how many."""
        ...

    async def start(self) -> None:
        """Begin connecting; must not block on an unreachable store."""
        ...

    def healthy(self) -> bool:
        """Whether the store answered recently (drives /healthcheck)."""
        ...

    async def close(self) -> None: ...
