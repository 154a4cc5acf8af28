"""The sliding-window counter decision, pure and clock-free.

Windows are epoch-aligned, ``window`` microseconds long. A key keeps the count of its
current window and of the one before. At a moment ``elapsed`` into the current window the
sliding window covers ``(window - elapsed) / window`` of the previous one, so its estimated
count is ``previous * (window - elapsed) / window + current``. ``hits`` pass when that
estimate plus ``hits`` is at most the limit; they are then added to the current window.
Refused hits are not counted (unlike the survey's sketch), so a client that keeps retrying
does not lock itself out.

The arithmetic is done in IEEE doubles in a fixed order, so that ``sliding_window.lua``
(Lua numbers are doubles) reaches the same answers bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["SlidingResult", "SlidingState", "SlidingStore", "decide", "roll"]


@dataclass(slots=True)
class SlidingState:
    """A key's two windows: the current one's start (microseconds) and both counts."""

    start: int
    previous: int
    current: int


@dataclass(frozen=True, slots=True)
class SlidingResult:
    """A decision and the key after it: the estimate (the sliding window's count) and the
    microseconds left in the current window."""

    allowed: bool
    estimate: float
    left_us: int


def roll(state: SlidingState | None, window_us: int, now_us: int) -> SlidingState:
    """The key's windows at ``now_us``: moved on by one window (the current one becomes the
    previous) or by more (both empty)."""
    start = now_us - now_us % window_us
    if state is None or state.start <= start - 2 * window_us:
        return SlidingState(start, 0, 0)
    if state.start == start - window_us:
        return SlidingState(start, state.current, 0)
    if state.start == start:
        return SlidingState(start, state.previous, state.current)
    return SlidingState(start, 0, 0)  # a start in the future: a clock went back; start over


def decide(
    state: SlidingState | None, limit: int, window_us: int, hits: int, now_us: int
) -> tuple[SlidingResult, SlidingState]:
    """(the decision, the state to keep). ``hits`` 0 only looks."""
    now = roll(state, window_us, now_us)
    elapsed = now_us - now.start
    weight = float(window_us - elapsed) / float(window_us)
    estimate = float(now.previous) * weight + float(now.current)
    allowed = estimate + float(hits) <= float(limit)
    if allowed and hits > 0:
        now.current += hits
        estimate = estimate + float(hits)
    return SlidingResult(allowed, estimate, window_us - elapsed), now


class SlidingStore(Protocol):
    """Where sliding-window counters live: one atomic decision per ``hit``."""

    async def hit(
        self, key: str, limit: int, window_us: int, hits: int, now: float
    ) -> SlidingResult:
        """Add ``hits`` (>= 0) to ``key`` if the sliding window (``window_us``
        microseconds long) allows them (``now`` in seconds; a Redis store on server time
        uses Redis's clock). Raises BackendError when the store fails."""
        ...

    async def peek(self, key: str, limit: int, window_us: int, now: float) -> SlidingResult:
        """The sliding window of ``key`` now (a decision on no hits), writing nothing.
        Raises BackendError when the store fails."""
        ...

    async def reset(self, key: str) -> int:
        """Forget the counter at ``key`` (an operator's reset); 1 if it was held."""
        ...
