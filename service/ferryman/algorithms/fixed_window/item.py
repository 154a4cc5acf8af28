"""A fixed window as one limit of a ``rate_limits`` list: its state is the window's start
and its count (microseconds and hits), a count from an earlier window is forgotten."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ferryman.algorithms.fixed_window.spec import KIND, FixedWindow
from ferryman.core.algorithm import Step
from ferryman.core.periods import Period
from ferryman.core.rules import UnitLimit

__all__ = ["WindowStep"]


@dataclass(frozen=True)
class WindowStep:
    """``args``: the limit, the window's start and end (microseconds) at ``now``; the
    window is worked out here so that calendar windows need no zone database in Redis."""

    limit: FixedWindow
    period: Period
    kind = KIND

    @property
    def reported(self) -> UnitLimit:
        return self.limit.rate

    @property
    def window(self) -> float | None:
        return None if self.period.exact else self.period.seconds

    def args(self, now: float) -> tuple[float, ...]:
        _, start, end = self.period.window(now)
        return float(self.limit.rate.requests_per_unit), round(start * 1e6), round(end * 1e6)

    def step(
        self, state: tuple[float, ...] | None, cost: int, now_us: int, args: tuple[float, ...]
    ) -> Step:
        limit, start, end = args
        count = state[1] if state is not None and state[0] == start else 0.0
        fits = count + cost <= limit
        if fits:
            count += cost
        reset = math.ceil((end - now_us) / 1e6) * 1e6
        return Step(fits, (start, count), int(max(0.0, limit - count)), reset, end - now_us)
