"""The contract every counter store implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ferryman.limits.burst import BurstOutcome, BurstPolicy

__all__ = ["Backend", "BurstRequest", "CounterOp", "CounterResult"]


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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

    async def start(self) -> None:
        """Begin connecting; must not block on an unreachable store."""
        ...

    def healthy(self) -> bool:
        """Whether the store answered recently (drives /healthcheck)."""
        ...

    async def close(self) -> None: ...
