"""What a backend is: one store per rule kind, over one place where state lives."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ferryman.algorithms.token_bucket.model import BucketStore
from ferryman.clock import Clock

__all__ = ["Backend", "ConnectionState", "Synced", "Watched"]


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

    async def check(self) -> bool:
        """Probe the store now; whether it is up afterwards."""
        ...


@runtime_checkable
class Watched(Protocol):
    """A backend whose connections report their state (Redis; memory has none)."""

    def connections(self) -> Sequence[ConnectionState]: ...


@runtime_checkable
class Synced(Protocol):
    """A backend whose fixed windows may be counted in this process and flushed (Redis)."""

    def synced(self) -> Sequence[Any]: ...


class Backend(Protocol):
    """The stores of every rule kind, kept in one place (this process, or one Redis)."""

    name: str

    def store(self, name: str) -> Any:
        """The store of the rule kind ``name`` (``ferryman.algorithms``)."""
        ...

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
