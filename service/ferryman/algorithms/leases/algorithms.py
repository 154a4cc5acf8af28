"""How a resource's capacity is divided among the demands on it; pure functions.

``divide`` looks at every demand once (FAIR_SHARE sorts them: O(n log n)) and returns a
Division, which then answers any one demand's share in O(1). A server asking on behalf of
``weight`` clients counts as that many clients for the equal share. FAIR_SHARE serves the
higher priorities first (a server's demand by its priority bands): a lower band shares only
what the higher ones leave; the other kinds ignore priorities.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ferryman.algorithms.leases.model import Band, Kind

__all__ = ["Demanding", "Division", "allocate", "divide"]


class Demanding(Protocol):
    """Anything with a demand's two numbers (a Demand, or a client's entry as it stands)."""

    @property
    def wants(self) -> float: ...

    @property
    def weight(self) -> int: ...

    @property
    def priority(self) -> int: ...

    @property
    def bands(self) -> tuple[Band, ...]: ...


class Division(Protocol):
    def share(self, demand: Demanding) -> float:
        """What ``demand`` gets when every demand is served at once."""
        ...


@dataclass(frozen=True)
class _AsWanted:
    def share(self, demand: Demanding) -> float:
        return demand.wants


@dataclass(frozen=True)
class _Static:
    capacity: float

    def share(self, demand: Demanding) -> float:
        return min(demand.wants, self.capacity * demand.weight)


@dataclass(frozen=True)
class _Proportional:
    per_client: float  # the equal share of one client
    unused: float  # what demands below their equal share leave over
    excess: float  # how far the others want beyond their equal share, in all

    def share(self, demand: Demanding) -> float:
        equal = self.per_client * demand.weight
        if demand.wants <= equal:
            return demand.wants
        extra = self.unused * (demand.wants - equal) / self.excess
        return min(demand.wants, equal + extra)


@dataclass(frozen=True)
class _WaterLevel:
    level: float  # per client: nobody unsatisfied gets more than this, none of them less

    def share(self, demand: Demanding) -> float:
        return min(demand.wants, self.level * demand.weight)


def _proportional(capacity: float, demands: Sequence[Demanding]) -> Division:
    clients = sum(d.weight for d in demands)
    if clients == 0:
        return _Proportional(capacity, 0.0, 1.0)
    per_client = capacity / clients
    unused = excess = 0.0
    for d in demands:
        equal = per_client * d.weight
        if d.wants < equal:
            unused += equal - d.wants
        else:
            excess += d.wants - equal
    return _Proportional(per_client, unused, excess or 1.0)


@dataclass(frozen=True)
class _Prioritized:
    levels: dict[int, float]  # per priority: the water level of _WaterLevel

    def share(self, demand: Demanding) -> float:
        return sum(min(w, self.levels.get(p, 0.0) * n) for p, w, n in _parts(demand))


def _parts(demand: Demanding) -> Iterator[tuple[int, float, int]]:
    """A demand as (priority, wants, clients): a server's bands, else the demand itself."""
    if demand.bands:
        for band in demand.bands:
            yield band.priority, band.wants, max(1, band.clients)
    else:
        yield demand.priority, demand.wants, demand.weight


def _level(capacity: float, parts: list[tuple[float, int]]) -> tuple[float, float]:
    """Max-min fairness by water filling over (wants, clients), the least hungry (per client)
    served first: the level per client and what is left once every part got its share."""
    left = capacity
    clients = sum(n for _, n in parts)
    for wants, n in sorted(parts, key=lambda p: p[0] / p[1]):
        if wants > left / clients * n:
            return left / clients, 0.0
        left -= wants
        clients -= n
    return math.inf, left


def _fair(capacity: float, demands: Sequence[Demanding]) -> Division:
    by_priority: dict[int, list[tuple[float, int]]] = {}
    for d in demands:
        for priority, wants, n in _parts(d):
            by_priority.setdefault(priority, []).append((wants, n))
    if len(by_priority) <= 1:
        parts = next(iter(by_priority.values()), [])
        return _WaterLevel(_level(capacity, parts)[0] if parts else math.inf)
    levels: dict[int, float] = {}
    left = capacity
    for priority in sorted(by_priority, reverse=True):
        levels[priority], left = _level(left, by_priority[priority])
    return _Prioritized(levels)


def divide(kind: Kind, capacity: float, demands: Sequence[Demanding]) -> Division:
    """The division of ``capacity`` among ``demands`` (every demand's weight at least 1)."""
    if kind is Kind.NO_ALGORITHM:
        return _AsWanted()
    if kind is Kind.STATIC:
        return _Static(capacity)
    if kind is Kind.PROPORTIONAL_SHARE:
        return _proportional(capacity, demands)
    return _fair(capacity, demands)


def allocate(kind: Kind, capacity: float, demands: Sequence[Demanding]) -> list[float]:
    """Every demand's share, in order (the examples and property tests read this)."""
    division = divide(kind, capacity, demands)
    return [division.share(d) for d in demands]
