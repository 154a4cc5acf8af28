"""How a resource's capacity is divided among the demands on it; pure functions.

``divide`` looks at every demand once (FAIR_SHARE sorts them: O(n log n)) and returns a
Division, which then answers any one demand's share in O(1). A server asking on behalf of
``weight`` clients counts as that many clients for the equal share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ferryman.algorithms.leases.model import Kind

__all__ = ["Demanding", "Division", "allocate", "divide"]


class Demanding(Protocol):
    """Anything with a demand's two numbers (a Demand, or a client's entry as it stands)."""

    @property
    def wants(self) -> float: ...

    @property
    def weight(self) -> int: ...


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


def _fair(capacity: float, demands: Sequence[Demanding]) -> Division:
    """Max-min fairness by water filling: the least hungry (per client) are served first."""
    left = capacity
    clients = sum(d.weight for d in demands)
    for d in sorted(demands, key=lambda d: d.wants / d.weight):
        if d.wants > left / clients * d.weight:
            return _WaterLevel(left / clients)
        left -= d.wants
        clients -= d.weight
    return _WaterLevel(math.inf)


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
