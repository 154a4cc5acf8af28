"""Fixed windows, as the reference counts them: epoch-aligned windows, near/over stats, and
the counter operations every store applies atomically."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "CounterOp",
    "CounterResult",
    "FixedWindowStore",
    "StatDelta",
    "classify",
    "over_limit",
    "split",
]


@dataclass(slots=True)
class CounterOp:
    """Add ``hits`` (negative: give back) to a fixed-window counter.

    ``expires_at`` is the end of the window (epoch seconds); ``ttl`` is the window's length
    in seconds, the key lifetime a remote store sets (plus its expiration jitter);
    ``sync`` the interval of synced counting (0: exact), which only a Redis store reads.
    """

    key: str
    hits: int
    limit: int
    expires_at: int
    ttl: int
    sync: float = 0.0


@dataclass(slots=True)
class CounterResult:
    """The counter's value after the request and how many hits were actually stored."""

    after: int
    applied: int


class FixedWindowStore(Protocol):
    """Where fixed-window counters live."""

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        """Apply every op atomically and return one result per op, in order.

        With ``stop_when_over``, if any op with positive hits would end above its limit, only
        those ops are applied (the others are left untouched and report ``applied=0``).
        A counter never goes below zero.
        """
        ...

    async def peek(self, ops: Sequence[CounterOp]) -> list[int]:
        """The current value of each op's counter (0 when absent), changing nothing."""
        ...

    async def reset(self, ops: Sequence[CounterOp]) -> int:
        """Forget each op's counter (an operator's reset); how many were held."""
        ...


def over_limit(ops: Sequence[CounterOp], current: Sequence[int]) -> set[int]:
    """The ops that would end above their limit, replayed in order from the counters'
    ``current`` values (what STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT applies alone)."""
    trial: dict[str, int] = {}
    over: set[int] = set()
    for i, op in enumerate(ops):
        seen = trial.get(op.key, current[i])
        if op.hits > 0 and seen + op.hits > op.limit:
            over.add(i)
        trial[op.key] = max(0, seen + op.hits)
    return over


@dataclass(slots=True)
class StatDelta:
    within: int = 0
    near: int = 0
    over: int = 0


def classify(
    hits: int, limit: int, before: int, after: int, ratio: float
) -> tuple[bool, StatDelta]:
    """Decide one descriptor and split its hits into within/near/over as the reference does.

    ``before`` and ``after`` are the counter around this request's hits; the request is over
    the limit iff ``after > limit``.
    """
    over, counts = split(hits, limit, math.floor(limit * ratio), before, after)
    return over, StatDelta(within=counts[1], near=counts[2], over=counts[3])


def split(
    hits: int, limit: int, near_threshold: int, before: int, after: int
) -> tuple[bool, tuple[int, int, int, int]]:
    """:func:`classify` with the near threshold (``floor(limit * ratio)``) given: whether
    the request is over, and its hits as the fixed-window stats count them (total, within,
    near, over: ``stats.FIXED_WINDOW_STATS``'s order)."""
    if after > limit:
        if before >= limit:
            return True, (hits, 0, 0, hits)
        return True, (hits, 0, limit - max(near_threshold, before), after - limit)
    near = 0
    if after > near_threshold:
        near = hits if before >= near_threshold else after - near_threshold
    return False, (hits, hits, near, 0)
