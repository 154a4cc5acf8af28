"""The GCRA decision (generic cell rate algorithm), pure and clock-free.

A limit of ``rate`` requests per ``per`` with a ``burst`` has an emission interval
``T = per / rate``: a full bucket takes ``burst`` requests at once, then one per ``T``. A
tenant keeps one value, its theoretical arrival time (TAT): the time its bucket is full
again. A request of ``cost`` at ``now`` fits when ``max(TAT, now) + cost * T - now`` (the
debt it would leave) is at most ``burst * T``; it then moves the TAT to
``max(TAT, now) + cost * T``. A caller that may wait (a shaper) also fits when the excess is
at most its wait, and is told to wait that long.

Exact: ``T`` is a fraction of microseconds, so times are kept in ``1/den`` microseconds
(``per_us / rate = step / den`` in lowest terms) and every sum is a whole number. The TAT is
a whole microsecond ``us`` and a part ``part / den``; debts are relative to ``now`` and stay
below 2**53, so the Lua twin in ``gcra_core.lua`` (Lua numbers are doubles) reaches the same
integers.

The decision is two steps, :func:`fit` ("would this request fit?", nothing changed) and
:func:`commit` (the TAT it leaves), so that a script deciding several limits at once can
ask every limit first and then commit all or none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DEBT_MAX",
    "SPAN_MAX",
    "GcraParams",
    "GcraResult",
    "GcraStore",
    "Tat",
    "Verdict",
    "commit",
    "debt",
    "decide",
    "fit",
    "look",
]

#: The largest full burst, in ``1/den`` microseconds, a limit may have (its check refuses
#: more), and the largest debt a decision may leave: both keep sums exact in doubles.
SPAN_MAX = 2**50
DEBT_MAX = 2**52


@dataclass(frozen=True, slots=True)
class GcraParams:
    """A limit in whole numbers: the emission interval is ``step / den`` microseconds."""

    step: int
    den: int
    burst: int

    @classmethod
    def of(cls, rate: int, per_us: int, burst: int) -> GcraParams:
        g = math.gcd(per_us, rate)
        return cls(per_us // g, rate // g, burst)

    @property
    def span(self) -> int:
        """A full burst's debt, in ``1/den`` microseconds."""
        return self.burst * self.step


@dataclass(frozen=True, slots=True)
class Tat:
    """A theoretical arrival time: ``us + part / den`` microseconds since the epoch."""

    us: int
    part: int
    den: int

    def text(self) -> str:
        """How a Redis store keeps it: ``"<us> <part> <den>"``."""
        return f"{self.us} {self.part} {self.den}"

    @classmethod
    def parse(cls, text: str) -> Tat:
        us, part, den = text.split()
        return cls(int(us), int(part), int(den))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`fit` found: whether the request fits, the wait it needs (microseconds,
    rounded up), the debt before it and the debt it leaves if committed (``1/den`` µs)."""

    allowed: bool
    wait_us: int
    before: int
    after: int
    cost: int


@dataclass(frozen=True, slots=True)
class GcraResult:
    """A decision as the limiter reads it: whether it passed, the wait given, the burst
    left and the microseconds until the bucket is full again (after the decision), and the
    microseconds until the same request would fit (-1: never, it is over the burst)."""

    allowed: bool
    wait_us: int
    remaining: int
    full_us: int
    retry_us: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def debt(tat: Tat | None, params: GcraParams, now_us: int) -> int:
    """``max(TAT, now) - now`` in ``1/den`` microseconds (0: the bucket is full). A TAT kept
    under another ``den`` (the limit changed) is rounded up to its next microsecond."""
    if tat is None or tat.us < now_us:
        return 0
    part = tat.part
    us = tat.us
    if tat.den != params.den and part > 0:
        us, part = us + 1, 0
    return min((us - now_us) * params.den + part, DEBT_MAX)


def fit(
    tat: Tat | None, params: GcraParams, cost: int, now_us: int, max_wait_us: int = 0
) -> Verdict:
    """Whether ``cost`` (>= 0) fits now, or after a wait of at most ``max_wait_us``;
    nothing is changed. More than the burst never fits; nothing (a look) always does."""
    before = debt(tat, params, now_us)
    if cost <= 0:
        return Verdict(True, 0, before, before, 0)
    after = before + cost * params.step
    excess = after - params.span
    wait_us = _ceil_div(excess, params.den) if excess > 0 else 0
    allowed = cost <= params.burst and wait_us <= max_wait_us and after <= DEBT_MAX
    return Verdict(allowed, wait_us if allowed else 0, before, after, cost)


def commit(verdict: Verdict, params: GcraParams, now_us: int) -> Tat | None:
    """The TAT to keep after a fitting request (None: keep what is kept)."""
    if not verdict.allowed or verdict.cost <= 0:
        return None
    part = verdict.after % params.den
    return Tat(now_us + verdict.after // params.den, part, params.den)


def _result(verdict: Verdict, params: GcraParams) -> GcraResult:
    shown = verdict.after if verdict.allowed else verdict.before
    remaining = max(0, params.span - shown) // params.step
    retry = -1
    if not verdict.allowed and verdict.cost <= params.burst:
        retry = _ceil_div(verdict.after - params.span, params.den)
    return GcraResult(
        verdict.allowed, verdict.wait_us, remaining, _ceil_div(shown, params.den), retry
    )


def decide(
    tat: Tat | None, params: GcraParams, cost: int, now_us: int, max_wait_us: int = 0
) -> tuple[GcraResult, Tat | None]:
    """(the decision, the TAT to keep or None to keep the old one): :func:`fit` then
    :func:`commit`. ``cost`` 0 only looks."""
    verdict = fit(tat, params, cost, now_us, max_wait_us)
    return _result(verdict, params), commit(verdict, params, now_us)


def look(tat: Tat | None, params: GcraParams, now_us: int) -> GcraResult:
    """The bucket now (a decision on no cost), changing nothing."""
    return decide(tat, params, 0, now_us)[0]


class GcraStore(Protocol):
    """Where TATs live: one atomic decision per ``take``."""

    async def take(
        self, key: str, params: GcraParams, cost: int, max_wait_us: int, now: float
    ) -> GcraResult:
        """Decide ``cost`` (>= 0; 0 only looks) for ``key`` at ``now`` (seconds; a Redis
        store on server time uses Redis's clock). Raises BackendError when the store fails."""
        ...

    async def peek(self, key: str, params: GcraParams, now: float) -> GcraResult:
        """The bucket at ``key`` now, writing nothing. Raises BackendError on failure."""
        ...

    async def reset(self, key: str) -> int:
        """Forget the TAT at ``key``: the bucket is full again; 1 if it was held."""
        ...
