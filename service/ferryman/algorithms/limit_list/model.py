"""A node's limits decided together: every limit steps over its own state; the request
fits when every one fits, and only then are the new states kept (all or none)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferryman.core.algorithm import Step, Stepper

__all__ = ["Checked", "ListStore", "Part", "decide_all"]


@dataclass(frozen=True, slots=True)
class Part:
    """One limit of a store call: its field in the node's state, its step and the step's
    numbers at this moment."""

    field: str
    stepper: Stepper
    args: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Checked:
    """A store's answer: whether the request fit every limit, and each limit's step."""

    fits: bool
    steps: tuple[Step, ...]


def decide_all(
    saved: Mapping[str, tuple[float, ...]],
    parts: Sequence[Part],
    cost: int,
    now_us: int,
) -> tuple[Checked, dict[str, tuple[float, ...]] | None, float]:
    """(the answer, the states to keep or None when nothing is to be written, how long
    they matter in microseconds). ``cost`` 0 only looks."""
    steps = tuple(p.stepper.step(saved.get(p.field), cost, now_us, p.args) for p in parts)
    fits = all(s.fits for s in steps)
    if not fits or cost <= 0:
        return Checked(fits, steps), None, 0.0
    kept = {p.field: s.state for p, s in zip(parts, steps, strict=True)}
    return Checked(fits, steps), kept, max(s.keep_us for s in steps)


class ListStore(Protocol):
    """Where nodes' limits live: one atomic decision per ``check``."""

    async def check(self, key: str, parts: Sequence[Part], cost: int, now: float) -> Checked:
        """Decide ``cost`` hits (0 only looks, writing nothing) against every part of the
        node at ``key``; raises BackendError when the store fails."""
        ...

    async def reset(self, key: str) -> int:
        """Forget the node's state (an operator's reset); 1 if it was held."""
        ...
