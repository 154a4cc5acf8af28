"""GCRA as one limit of a ``rate_limits`` list: the state is the TAT's three whole
numbers, decided by the model's ``fit`` and ``commit``."""

from __future__ import annotations

from dataclasses import dataclass

from ferryman.algorithms.gcra.limiter import reported
from ferryman.algorithms.gcra.model import Tat, commit, fit
from ferryman.algorithms.gcra.spec import KIND, Gcra
from ferryman.core.algorithm import Step
from ferryman.core.rules import UnitLimit

__all__ = ["GcraStep"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GcraStep:
    """``args``: the emission interval (``step / den`` microseconds) and the burst."""

    limit: Gcra
    kind = KIND

    @property
    def reported(self) -> UnitLimit:
        return reported(self.limit)

    @property
    def window(self) -> float | None:
        return self.limit.burst * self.limit.per / self.limit.rate

    def args(self, now: float) -> tuple[float, ...]:
        params = self.limit.params
        return float(params.step), float(params.den), float(params.burst)

    def step(
        self, state: tuple[float, ...] | None, cost: int, now_us: int, args: tuple[float, ...]
    ) -> Step:
        params = self.limit.params
        tat = None if state is None else Tat(*(int(v) for v in state))
        verdict = fit(tat, params, cost, now_us)
        kept = commit(verdict, params, now_us)
        shown = verdict.after if verdict.allowed else verdict.before
        remaining = max(0, params.span - shown) // params.step
        full = float(_ceil_div(shown, params.den))
        if kept is None:
            saved = state if state is not None else (0.0, 0.0, float(params.den))
        else:
            saved = (float(kept.us), float(kept.part), float(kept.den))
        return Step(verdict.allowed, saved, remaining, full, full)
