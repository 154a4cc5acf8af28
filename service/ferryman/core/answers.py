"""What a request asks, what each descriptor gets, and the switches every algorithm reads."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from ferryman.core.rules import UNIT_SECONDS, Unit, UnitLimit

__all__ = [
    "ASKER",
    "MAX_REMAINING",
    "MAY_WAIT",
    "Asker",
    "Code",
    "Decision",
    "DescriptorRequest",
    "EngineOptions",
    "Status",
    "Tally",
    "unit_for",
]

MAX_REMAINING = 2**32 - 1


class Code(enum.IntEnum):
    """The numbers are those of the RLS proto's ``RateLimitResponse.Code``."""

    UNKNOWN = 0
    OK = 1
    OVER_LIMIT = 2


@dataclass(slots=True)
class DescriptorRequest:
    """One descriptor of a request: its entries, optional override, optional own hits."""

    entries: tuple[tuple[str, str], ...]
    limit: UnitLimit | None = None
    hits: int | None = None
    negative: bool = False

    def hits_of(self, request_hits: int) -> int:
        """The hits this descriptor adds (negative: gives back), the request's unless its own
        are given."""
        hits = request_hits if self.hits is None else self.hits
        return -hits if self.negative else hits


@dataclass(slots=True)
class Status:
    code: Code
    limit: UnitLimit | None = None
    remaining: int = 0
    reset_after: int | None = None
    quota: bool = False
    window: float | None = None  # a burst tier's exact window, for the response headers
    size: int | None = None  # a token bucket's size: the headers' limit over ``window``
    parts: tuple[Status, ...] = ()  # a node's several limits, each its own policy


@dataclass(slots=True)
class Decision:
    code: Code
    statuses: tuple[Status, ...]
    headers: tuple[tuple[str, str], ...] = ()
    metadata: Mapping[str, Any] | None = None
    # Seconds to hold the answer before sending it: the turn its hits were booked for on
    # a node with max_wait (0 unless the caller may wait, and always 0 when OVER_LIMIT).
    wait: float = 0.0


@dataclass(slots=True)
class Tally:
    """What a request's descriptors add up to: the overall code and the metadata of the
    rules that were within their limit, by descriptor index."""

    quota_total: int = 0
    quota_over: int = 0
    over_hard: bool = False
    passed: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    wait: float = 0.0  # the longest wait a descriptor's hits were booked with, seconds

    def add(
        self,
        over: bool,
        quota: bool,
        metadata: Mapping[str, Any] | None = None,
        index: int = 0,
    ) -> None:
        if quota:
            self.quota_total += 1
            self.quota_over += over
        elif over:
            self.over_hard = True
        if metadata and not over:
            self.passed.append((index, metadata))

    @property
    def metadata(self) -> dict[str, Any]:
        """The passed rules' metadata merged in request order: the first value wins, and
        two maps under one name are merged the same way, level by level."""
        merged: dict[str, Any] = {}
        for _, meta in sorted(self.passed, key=lambda p: p[0]):
            _merge(merged, meta)
        return merged

    @property
    def code(self) -> Code:
        """OVER_LIMIT when a hard limit is over, or every quota-mode limit is."""
        if self.over_hard or (self.quota_total and self.quota_over == self.quota_total):
            return Code.OVER_LIMIT
        return Code.OK


class Asker(Protocol):
    """Who asks for the request being decided, for state a kind ties to its caller (a cost
    budget's reservation is settled by whoever made it)."""

    @property
    def key(self) -> str:
        """The caller's identity, or its address when it shows none."""
        ...

    def settles_for(self, domain: str) -> bool:
        """Whether it may settle reservations others made in ``domain``."""
        ...


#: Seconds the request being decided may be held before its answer (a node's max_wait
#: bounds it further), set by the engine for a caller that waits on the server; 0: the
#: answer goes at once, and a hit that does not fit now is over the limit.
MAY_WAIT: ContextVar[float] = ContextVar("ferryman_may_wait", default=0.0)

#: The asker of the request being decided, set by the API it came through before the
#: engine is called (None: nobody in particular, as in replay and the simulators).
ASKER: ContextVar[Asker | None] = ContextVar("ferryman_asker", default=None)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The global switches of the reference service (see Settings)."""

    near_limit_ratio: float = 0.8
    shadow_mode: bool = False
    quota_mode: bool = False
    stop_when_over: bool = False
    headers: bool = False
    header_format: str = "draft"  # or "ietf": RateLimit-Policy and RateLimit
    limit_header: str = "RateLimit-Limit"
    remaining_header: str = "RateLimit-Remaining"
    reset_header: str = "RateLimit-Reset"
    dynamic_metadata: bool = False
    cache_key_prefix: str = ""
    local_cache_bytes: int = 0
    fail_open: bool = False
    sync_interval: float = 0.0  # REDIS_SYNC_INTERVAL: for windows without their own sync


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for name, value in other.items():
        if name not in into:
            into[name] = _copy(value)
        elif isinstance(into[name], dict) and isinstance(value, Mapping):
            _merge(into[name], value)


def _copy(value: Any) -> Any:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def unit_for(window: float) -> Unit:
    """The smallest unit not shorter than ``window`` (how a burst tier's limit is reported)."""
    for unit in sorted(UNIT_SECONDS, key=UNIT_SECONDS.__getitem__):
        if window <= UNIT_SECONDS[unit]:
            return unit
    return Unit.YEAR
