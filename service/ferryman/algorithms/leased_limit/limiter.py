"""Lease-sized limits on the request path: a ``leased_limit`` node allows, in each second,
as many hits as this server's lease on its resource (from ``--parent``), decided here with
no store call; the hits seen per second, smoothed, are the demand the lease is asked for."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.leased_limit.spec import LeasedLimit
from ferryman.core.algorithm import Algorithm, Call
from ferryman.core.answers import MAX_REMAINING, Code, EngineOptions, Status, Tally
from ferryman.core.rules import Rule, Unit, UnitLimit
from ferryman.stats import Stats

__all__ = ["LeaseReader", "LeasedItem", "LeasedLimiter", "LeasedRule"]

#: A resource's live lease capacity (None: no live lease) and the parent's safe capacity.
LeaseReader = Callable[[str], tuple[float | None, float | None]]

_SMOOTHING = 0.5  # weight of the last whole second in the demand


@dataclass(frozen=True, slots=True)
class LeasedRule:
    rule: Rule
    leased: LeasedLimit
    quota: bool


@dataclass(slots=True)
class LeasedItem:
    index: int
    rule: Rule
    leased: LeasedLimit
    hits: int
    quota: bool


class _Meter:
    """One resource's current second: hits allowed and hits seen; the smoothed demand."""

    __slots__ = ("allowed", "demand", "second", "seen")

    def __init__(self, second: int) -> None:
        self.second = second
        self.allowed = 0
        self.seen = 0
        self.demand = 0.0

    def roll(self, second: int) -> None:
        if second == self.second:
            return
        idle = second - self.second - 1  # whole seconds with no hits at all
        if self.demand == 0:  # no history: the first second is the best guess
            self.demand = float(self.seen)
        else:
            self.demand = (1 - _SMOOTHING) * self.demand + _SMOOTHING * self.seen
        if idle > 0:
            self.demand *= (1 - _SMOOTHING) ** min(idle, 64)
        self.second, self.allowed, self.seen = second, 0, 0


def _no_lease(resource: str) -> tuple[float | None, float | None]:
    return None, None


class LeasedLimiter:
    """Decides ``leased_limit`` nodes in process. ``reader`` is set by the server that
    holds the leases; without one every node runs on its safe capacity."""

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.stats = stats
        self.reader: LeaseReader = _no_lease
        self._meters: dict[str, _Meter] = {}

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> LeasedRule:
        rule = path[-1]
        assert isinstance(rule.limit, LeasedLimit)
        return LeasedRule(rule, rule.limit, quota)

    def plan(
        self,
        prepared: LeasedRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> LeasedItem:
        return LeasedItem(index, prepared.rule, prepared.leased, hits, prepared.quota)

    def calls(self, store: Any, items: Sequence[LeasedItem], now: float) -> list[Call]:
        return []  # decided here, from the lease: no store

    def capacity(self, leased: LeasedLimit) -> float:
        """Hits per second allowed now: the lease's, else the node's safe capacity, else the
        parent's, else unlimited (-1 is unlimited too)."""
        lease, parent_safe = self.reader(leased.resource)
        if lease is not None:
            return lease
        for safe in (leased.safe_capacity, parent_safe):
            if safe is not None:
                return math.inf if safe < 0 else safe
        return math.inf

    def demand(self, resource: str, now: float) -> float:
        """Hits per second seen on ``resource``'s nodes, smoothed (0 when never seen)."""
        meter = self._meters.get(resource)
        if meter is None:
            return 0.0
        meter.roll(int(now))
        # The current second counts as soon as it has seen more than the average.
        return max(meter.demand, float(meter.seen))

    def answer(
        self,
        items: Sequence[LeasedItem],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        second = int(now)
        reset = max(1, math.ceil(second + 1 - now))
        counts: list[tuple[str, tuple[str, ...], tuple[int, ...]]] = []
        for item in items:
            rule, hits = item.rule, item.hits
            meter = self._meters.get(item.leased.resource)
            if meter is None:
                meter = self._meters[item.leased.resource] = _Meter(second)
            meter.roll(second)
            capacity = self.capacity(item.leased)
            if hits < 0:  # a give-back: the second's count only
                meter.allowed = max(0, meter.allowed + hits)
                statuses[item.index] = Status(Code.OK, quota=item.quota)
                continue
            meter.seen += hits
            if math.isinf(capacity):
                meter.allowed += hits
                counts.append((rule.stats_key, rule.stats_path, (hits, hits, 0, 0)))
                statuses[item.index] = Status(Code.OK, remaining=MAX_REMAINING, quota=item.quota)
                tally.add(False, item.quota, rule.metadata)
                continue
            limit = UnitLimit(int(capacity), Unit.SECOND)
            over = meter.allowed + hits > capacity
            if over:
                counts.append((rule.stats_key, rule.stats_path, (hits, 0, 0, hits)))
            else:
                meter.allowed += hits
                counts.append((rule.stats_key, rule.stats_path, (hits, hits, 0, 0)))
            if over and rule.shadow_mode:
                self.stats.rule(rule.stats_key, "shadow_mode", hits, rule.stats_path)
                over = False
            remaining = 0 if over else max(0, int(capacity) - meter.allowed)
            code = Code.OVER_LIMIT if over else Code.OK
            statuses[item.index] = Status(code, limit, remaining, reset, item.quota)
            tally.add(over, item.quota, rule.metadata)
        if counts:
            self.stats.rule_counts(counts)
