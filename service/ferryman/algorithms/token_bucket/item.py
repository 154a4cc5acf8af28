"""A node's token bucket as one limit of a ``rate_limits`` list: the state is the tokens
held and the next free moment (microseconds), decided by the model's ``decide`` with no
wait (Envoy cannot wait)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ferryman.algorithms.token_bucket.limiter import sustained
from ferryman.algorithms.token_bucket.model import BucketState, TakeStatus, decide, refilled
from ferryman.algorithms.token_bucket.spec import KIND, NodeBucket
from ferryman.core.algorithm import Step
from ferryman.core.rules import UnitLimit

__all__ = ["BucketStep"]


@dataclass(frozen=True)
class BucketStep:
    """``args``: the size, the fill rate (tokens per second) and the debt allowed (ms)."""

    limit: NodeBucket
    kind = KIND

    @property
    def reported(self) -> UnitLimit:
        return sustained(self.limit.spec)

    @property
    def window(self) -> float | None:
        spec = self.limit.spec
        return spec.size / spec.fill_rate

    def args(self, now: float) -> tuple[float, ...]:
        spec = self.limit.spec
        return float(spec.size), float(spec.fill_rate), float(spec.max_debt_millis)

    def step(
        self, state: tuple[float, ...] | None, cost: int, now_us: int, args: tuple[float, ...]
    ) -> Step:
        spec = self.limit.spec
        saved = None if state is None else BucketState(state[0], state[1])
        fits, after = True, None
        if cost > 0:
            status, _, after = decide(saved, spec, cost, now_us, 0.0)
            fits = status is TakeStatus.OK
        shown = after if after is not None else refilled(saved, spec, now_us)
        debt_us = max(0.0, shown.next_free - now_us)
        full_us = debt_us + (spec.size - shown.stored) * 1e6 / spec.fill_rate
        remaining = max(0, math.floor(shown.stored))
        return Step(fits, (shown.stored, shown.next_free), remaining, full_us, full_us)
