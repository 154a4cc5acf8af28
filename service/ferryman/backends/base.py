"""What a backend is: one store per algorithm, over one place where state lives."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ferryman.algorithms.burst.model import BurstStore
from ferryman.algorithms.copies.model import CopyStore
from ferryman.algorithms.fixed_window.model import FixedWindowStore
from ferryman.algorithms.sliding_window.model import SlidingStore
from ferryman.algorithms.token_bucket.model import BucketStore, NodeBucketStore
from ferryman.clock import Clock

__all__ = ["Backend", "ConnectionState", "Watched"]


class ConnectionState(Protocol):
    """What a backend connection reports about itself (state, breaker, transitions)."""

    name: str  # where it connects
    state: str  # up | degraded | down
    reason: str
    refused: int
    probes: int
    breaker_opened: int

    @property
    def transitions(self) -> Counter[tuple[str, str]]: ...

    def describe_state(self) -> dict[str, object]: ...


@runtime_checkable
class Watched(Protocol):
    """A backend whose connections report their state (Redis; memory has none)."""

    def connections(self) -> Sequence[ConnectionState]: ...


class Backend(Protocol):
    """The stores of every algorithm, kept in one place (this process, or one Redis)."""

    name: str

    @property
    def windows(self) -> FixedWindowStore: ...

    @property
    def bursts(self) -> BurstStore: ...

    @property
    def copies(self) -> CopyStore: ...

    @property
    def buckets(self) -> NodeBucketStore: ...

    @property
    def sliding(self) -> SlidingStore: ...

    def quota_store(self, prefix: str, clock: Clock) -> BucketStore:
        """The quota service's buckets, where this backend keeps its state (keys under
        ``prefix``; ``clock`` decides when the store does not take its time from itself)."""
        ...

    async def start(self) -> None:
        """Begin connecting; must not block on an unreachable store."""
        ...

    def healthy(self) -> bool:
        """Whether the store answered recently (drives /healthcheck)."""
        ...

    async def close(self) -> None: ...
