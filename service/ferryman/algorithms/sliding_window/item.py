"""A sliding window as one limit of a ``rate_limits`` list: the state is the current
window's start and both windows' counts, decided by the model's ``decide``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ferryman.algorithms.sliding_window.model import SlidingState, decide
from ferryman.algorithms.sliding_window.spec import KIND, SlidingWindow
from ferryman.core.algorithm import Step
from ferryman.core.rules import UnitLimit

__all__ = ["SlidingStep"]


@dataclass(frozen=True)
class SlidingStep:
    """``args``: the limit and the window's length (microseconds)."""

    limit: SlidingWindow
    kind = KIND

    @property
    def reported(self) -> UnitLimit:
        return self.limit.rate

    @property
    def window(self) -> float | None:
        return None if self.limit.period.exact else self.limit.seconds

    def args(self, now: float) -> tuple[float, ...]:
        return float(self.limit.rate.requests_per_unit), float(self.limit.micros)

    def step(
        self, state: tuple[float, ...] | None, cost: int, now_us: int, args: tuple[float, ...]
    ) -> Step:
        limit, window = int(args[0]), int(args[1])
        saved = None if state is None else SlidingState(*(int(v) for v in state))
        result, after = decide(saved, limit, window, cost, now_us)
        left = max(0, math.floor(limit - result.estimate))
        kept = (float(after.start), float(after.previous), float(after.current))
        return Step(result.allowed, kept, left, float(result.left_us), 2.0 * window)
