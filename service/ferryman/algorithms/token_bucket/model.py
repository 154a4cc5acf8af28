"""The token bucket decision: lazily refilled, with debt (tokens borrowed from the future).

A bucket's state is the tokens it holds and the time its next token is free. Taking n tokens:

- tokens accrue at ``fill_rate`` per second since the next free time, up to ``size``;
- the caller waits for the debt earlier callers left: (next free time) - now, or 0;
- the tokens the bucket lacks are borrowed: the next free time moves forward by
  missing / fill_rate, so that later callers wait for them;
- the caller is refused (``REJECTED_TIMEOUT``, nothing taken) when its wait exceeds the
  allowed wait, or when the debt after this take would exceed ``max_debt_millis``.

Time is in microseconds and the arithmetic is done in IEEE doubles in a fixed order, so that
``token_bucket.lua`` (Lua numbers are doubles too) reaches the same answers bit for bit.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = [
    "DEFAULT_BUCKET",
    "GLOBAL_NAMESPACE",
    "BucketRef",
    "BucketSpec",
    "BucketState",
    "BucketStore",
    "NodeBucketStore",
    "NodeTake",
    "Recent",
    "Standing",
    "TakeResult",
    "TakeStatus",
    "decide",
    "decide_node",
    "quota_label",
    "refilled",
]

K = TypeVar("K", bound=Hashable)

# Buckets a store remembers as used lately, for the console (each a key and a spec).
RECENT = 256

# Names a request cannot use (they are outside [a-zA-Z0-9_]+): the shared buckets' keys.
DEFAULT_BUCKET = "@default"
GLOBAL_NAMESPACE = "@global"


class TakeStatus(enum.IntEnum):
    """Allow's answers; the numbers are those of ``quotaservice.AllowResponse.Status``."""

    OK = 0
    REJECTED_TIMEOUT = 1
    REJECTED_NO_BUCKET = 2
    REJECTED_TOO_MANY_BUCKETS = 3
    REJECTED_TOO_MANY_TOKENS_REQUESTED = 4
    REJECTED_INVALID_REQUEST = 5
    REJECTED_SERVER_ERROR = 6


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """One bucket's configuration, with the quota service's defaults."""

    size: int = 100
    fill_rate: float = 50.0  # tokens per second
    wait_timeout_millis: int = 1000
    max_debt_millis: int = 10_000
    max_tokens_per_request: float | None = None  # None: fill_rate
    max_idle_millis: int = -1  # dynamic buckets only; -1: never removed

    @property
    def max_tokens(self) -> float:
        if self.max_tokens_per_request is None:
            return self.fill_rate
        return self.max_tokens_per_request


@dataclass(frozen=True, slots=True)
class BucketRef:
    """Which bucket a request resolved to.

    ``name`` is ``DEFAULT_BUCKET`` for a namespace's shared default bucket; the global default
    bucket is (``GLOBAL_NAMESPACE``, ``DEFAULT_BUCKET``). A dynamic bucket counts against its
    namespace's ``max_dynamic_buckets`` (0: no limit) and is removed after ``max_idle_millis``.
    """

    namespace: str
    name: str
    dynamic: bool = False
    max_dynamic_buckets: int = 0


@dataclass(slots=True)
class BucketState:
    """Tokens held and the time (microseconds) the next token is free."""

    stored: float
    next_free: float


@dataclass(frozen=True, slots=True)
class TakeResult:
    """A store's answer: the decision, plus the dynamic buckets it created or removed."""

    status: TakeStatus
    tokens_granted: int = 0
    wait_millis: int = 0
    created: bool = False
    removed: tuple[str, ...] = ()


def decide(
    state: BucketState | None, spec: BucketSpec, tokens: int, now_us: int, max_wait_us: float
) -> tuple[TakeStatus, int, BucketState | None]:
    """(status, wait in whole milliseconds, the state to keep or None to keep the old one).

    ``state`` None is a new bucket (full). ``tokens`` is at least 1 and at most the spec's
    ``max_tokens`` (the caller checks). ``max_wait_us`` is the allowed wait.
    """
    now = float(now_us)
    if state is None:
        stored, next_free = float(spec.size), now
    else:
        stored, next_free = min(state.stored, float(spec.size)), state.next_free
    if now > next_free:
        if spec.fill_rate > 0:
            stored = min(float(spec.size), stored + (now - next_free) * spec.fill_rate / 1e6)
        next_free = now
    wait = next_free - now
    if wait > max_wait_us:
        return TakeStatus.REJECTED_TIMEOUT, 0, None
    spend = min(float(tokens), stored)
    missing = float(tokens) - spend
    if missing > 0:
        if spec.fill_rate <= 0:
            return TakeStatus.REJECTED_TIMEOUT, 0, None
        next_free = next_free + missing * 1e6 / spec.fill_rate
    if next_free - now > spec.max_debt_millis * 1000.0:
        return TakeStatus.REJECTED_TIMEOUT, 0, None
    return TakeStatus.OK, math.floor(wait / 1000.0), BucketState(stored - spend, next_free)


@dataclass(frozen=True, slots=True)
class Standing:
    """A bucket as it stands now: the tokens it holds, and its debt as the time until its
    next free moment (microseconds, 0 when it owes nothing)."""

    stored: float
    debt_us: float

    @classmethod
    def of(cls, state: BucketState, now_us: int) -> Standing:
        return cls(state.stored, max(0.0, state.next_free - now_us))


class Recent(Generic[K]):
    """The buckets taken from lately, least recent first, each with its spec: at most
    ``limit`` of them (the console reads them; the oldest are forgotten)."""

    __slots__ = ("_seen", "limit")

    def __init__(self, limit: int = RECENT) -> None:
        self.limit = limit
        self._seen: OrderedDict[K, BucketSpec] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, key: K, spec: BucketSpec) -> None:
        seen = self._seen
        seen[key] = spec
        seen.move_to_end(key)
        if len(seen) > self.limit:
            seen.popitem(last=False)

    def discard(self, key: K) -> None:
        self._seen.pop(key, None)

    def items(self) -> list[tuple[K, BucketSpec]]:
        return list(self._seen.items())


class BucketStore(Protocol):
    """Where buckets live: one atomic decision per ``take``."""

    @property
    def recent(self) -> Recent[BucketRef]: ...

    async def take(
        self, ref: BucketRef, spec: BucketSpec, tokens: int, max_wait_millis: int
    ) -> TakeResult:
        """Take ``tokens`` (>= 1) from the bucket, waiting at most ``max_wait_millis``.

        Refuses with ``REJECTED_TOO_MANY_TOKENS_REQUESTED`` above the spec's
        ``max_tokens`` and ``REJECTED_TOO_MANY_BUCKETS`` when a new dynamic bucket would
        exceed its namespace's limit. Raises BackendError when the store fails.
        """
        ...

    async def peek(self, ref: BucketRef, spec: BucketSpec) -> Standing | None:
        """The bucket now, taking nothing; None when it is gone (a dynamic bucket removed).
        Raises BackendError when the store fails."""
        ...

    async def reset(self, ref: BucketRef) -> int:
        """Forget the bucket's tokens and debt (an operator's reset): it is full again. A
        dynamic bucket stays registered. 1 if it held any state, else 0."""
        ...

    async def close(self) -> None:
        """Release what the store holds."""
        ...


# -- token buckets on descriptor nodes ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeTake:
    """A node bucket's answer: the decision, and the bucket as it stands after it (the
    state kept, or on a refusal the refilled state that was left unchanged): the tokens it
    holds and its debt, the time until its next free moment (microseconds, >= 0)."""

    status: TakeStatus
    wait_millis: int
    stored: float
    debt_us: float

    def next_token(self, spec: BucketSpec) -> float:
        """Seconds until the bucket holds one more whole token (0 when full)."""
        if self.stored >= spec.size and self.debt_us <= 0:
            return 0.0
        part = self.stored - math.floor(self.stored)
        return self.debt_us / 1e6 + (1.0 - part) / spec.fill_rate


def refilled(state: BucketState | None, spec: BucketSpec, now_us: int) -> BucketState:
    """The bucket at ``now_us`` with the tokens accrued since its next free time (the first
    steps of ``decide``, in the same order)."""
    now = float(now_us)
    if state is None:
        return BucketState(float(spec.size), now)
    stored, next_free = min(state.stored, float(spec.size)), state.next_free
    if now > next_free:
        if spec.fill_rate > 0:
            stored = min(float(spec.size), stored + (now - next_free) * spec.fill_rate / 1e6)
        next_free = now
    return BucketState(stored, next_free)


def decide_node(
    state: BucketState | None, spec: BucketSpec, tokens: int, now_us: int, max_wait_millis: int
) -> tuple[NodeTake, BucketState | None]:
    """A node bucket's decision: ``decide`` for ``tokens`` (>= 0; 0 only looks; more than
    the size only with enough debt allowed), and the bucket as it then stands."""
    if tokens <= 0:
        now = refilled(state, spec, now_us)
        return NodeTake(TakeStatus.OK, 0, now.stored, now.next_free - now_us), None
    status, wait, after = decide(state, spec, tokens, now_us, max_wait_millis * 1000.0)
    shown = after if after is not None else refilled(state, spec, now_us)
    return NodeTake(status, wait, shown.stored, shown.next_free - now_us), after


class NodeBucketStore(Protocol):
    """Token buckets of descriptor nodes, by key: one atomic decision per ``take``."""

    @property
    def recent(self) -> Recent[str]: ...

    async def peek(self, key: str, spec: BucketSpec, now: float) -> Standing:
        """The bucket at ``key`` now, taking nothing (full when it has no state)."""
        ...

    async def take(
        self, key: str, spec: BucketSpec, tokens: int, max_wait_millis: int, now: float
    ) -> NodeTake:
        """Take ``tokens`` from the bucket at ``key`` (the store's own clock or Redis time
        may stand in for ``now``, seconds). Raises BackendError when the store fails."""
        ...

    async def reset(self, key: str) -> int:
        """Forget the bucket at ``key``: it is full again (an operator's reset); 1 if held."""
        ...


def quota_label(ref: BucketRef) -> str:
    """``namespace/bucket`` as the quota service names it."""
    namespace = "(global)" if ref.namespace == GLOBAL_NAMESPACE else ref.namespace
    name = "(default)" if ref.name == DEFAULT_BUCKET else ref.name
    return f"{namespace}/{name}"
