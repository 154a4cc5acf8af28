"""Counters under the reference service's stat names, kept in process and bounded."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "CALL",
    "CONFIG_LOAD_ERROR",
    "CONFIG_LOAD_SUCCESS",
    "FIXED_WINDOW_STATS",
    "GLOBAL_SHADOW_MODE",
    "LOCAL_CACHE_HITS",
    "RATE_LIMIT",
    "REQUEST_CALL",
    "RULE_STATS",
    "SERVICE",
    "STATS_OVERFLOW",
    "TOTAL_REQUESTS",
    "VALUES_FOLDED",
    "CappedRule",
    "RuleSeries",
    "Stats",
    "ValuePath",
    "total_requests",
]

SERVICE = "ratelimit.service"
RATE_LIMIT = "ratelimit.service.rate_limit"
CALL = "ratelimit.service.call.should_rate_limit"
# Charon's Request (ferryman.v1.Limiter/Request): its own errors and degraded answers.
REQUEST_CALL = "ratelimit.service.call.request"
CONFIG_LOAD_SUCCESS = "ratelimit.service.config_load_success"
CONFIG_LOAD_ERROR = "ratelimit.service.config_load_error"
GLOBAL_SHADOW_MODE = "ratelimit.service.global_shadow_mode"
STATS_OVERFLOW = "ratelimit.service.stats_overflow"
VALUES_FOLDED = "ratelimit.service.stats_values_folded"
LOCAL_CACHE_HITS = "ratelimit.service.local_cache_hits"
TOTAL_REQUESTS = "ratelimit_server.ShouldRateLimit.total_requests"


def total_requests(method: str) -> str:
    """The counter of calls to a gRPC method (the reference's name for ShouldRateLimit)."""
    return f"ratelimit_server.{method}.total_requests"


# The per-rule stats every rule counts, plus the per-domain one that shares their prefix;
# each rule kind names its own besides (``Algorithm.stats``).
RULE_STATS = (
    "total_hits",
    "over_limit",
    "within_limit",
    "shadow_mode",
    "domain_not_found",
    "unconfigured",
)

# The stats a fixed-window counter updates on every hit, in Stats.rule_counts's order.
FIXED_WINDOW_STATS = ("total_hits", "within_limit", "near_limit", "over_limit")

# The last level of a rule's series for the request values past its MAX_METRIC_SERIES.
OTHER = "_other_"
# MAX_METRIC_SERIES's default (settings).
MAX_METRIC_SERIES = 10_000


class ValuePath(tuple[str, ...]):
    """A series' path (domain, level1, ...) that holds request values (``detailed_metric``,
    ``value_to_metric``), with the path of the rule it counts for: a tuple still, so that
    it travels with the request as any path does and Stats can cap the rule's values."""

    rule: tuple[str, ...]

    def __new__(cls, parts: Iterable[str], rule: tuple[str, ...]) -> ValuePath:
        path = super().__new__(cls, parts)
        path.rule = rule
        return path


@dataclass(frozen=True, slots=True, order=True)
class CappedRule:
    """A rule that reached MAX_METRIC_SERIES: its series for further values are folded."""

    rule: str
    values: int
    folded: int


# (stat, path, labels, value): path is (domain, level1, level2, ...), or None for the overflow
# series; labels are the series' own extra labels (a burst tier's ``tier``), as pairs.
RuleSeries = tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...], int]


class Stats:
    """Monotonically increasing counters, with the request-derived ones bounded.

    ``inc`` is for the service's fixed names, a small set known in advance. ``rule`` is for
    names built from configuration and request values (``detailed_metric`` puts request
    values in them), bounded twice:

    - per rule: a series whose path is a ``ValuePath`` counts one of its rule's request
      values; past ``max_values`` values (MAX_METRIC_SERIES), a rule's further values are
      folded into its ``<rule>._other_.<stat>`` series, each fold counted in
      ``ratelimit.service.stats_values_folded`` and in ``capped()``. Domains that no
      configuration defines (``domain_not_found``) are one such rule, ``_other_`` its fold;
    - in all: past ``max_series`` distinct names, new ones are folded into
      ``ratelimit.service.rate_limit.overflow.<stat>`` and each fold counts one in
      ``ratelimit.service.stats_overflow``.
    """

    def __init__(self, max_series: int = 10_000, max_values: int | None = None) -> None:
        self._values: dict[str, int] = {}
        # Every rule series by name, with its stat and its parts (for exporters' labels).
        self._rules: dict[str, tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...]]] = {}
        self.max_series = max_series
        self.max_values = MAX_METRIC_SERIES if max_values is None else max_values
        self._lock = threading.Lock()
        # The full names of a fixed-window rule's stats, by rule key (at most max_series).
        self._names: dict[str, tuple[str, ...]] = {}
        # Per rule path: the request values (series keys) with series of their own, and how
        # many increments were folded once there were max_values of them.
        self._rule_values: dict[tuple[str, ...], set[str]] = {}
        self._folded: dict[tuple[str, ...], int] = {}

    def inc(self, name: str, amount: int = 1) -> None:
        """Add to a fixed-name counter (never folded: its names are few and known)."""
        if amount == 0:
            return
        with self._lock:
            self._values[name] = self._values.get(name, 0) + amount

    def outcome(
        self,
        key: str,
        path: tuple[str, ...],
        hits: int,
        granted: bool,
        shadow: bool,
        waited: bool = False,
    ) -> None:
        """One decision's hits on a rule: ``total_hits``, then ``within_limit`` (and
        ``served_with_wait`` after a wait) or ``over_limit`` (and ``shadow_mode`` when the
        rule only counts)."""
        self.rule(key, "total_hits", hits, path)
        if granted:
            self.rule(key, "within_limit", hits, path)
            if waited:
                self.rule(key, "served_with_wait", hits, path)
            return
        self.rule(key, "over_limit", hits, path)
        if shadow:
            self.rule(key, "shadow_mode", hits, path)

    def rule(
        self,
        key: str,
        stat: str,
        amount: int,
        path: tuple[str, ...] | None = None,
        labels: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Add to ``ratelimit.service.rate_limit.<key>.<stat>``.

        ``path`` is ``key`` in parts, ``(domain, level1, ...)``; it is stored once, when the
        series appears, so that exporters can label it even when a part contains a dot.
        Without it the key is split at its dots. ``labels`` are extra (name, value) labels
        whose values come from configuration (a burst tier's index): each pair adds
        ``.<name>_<value>`` before the stat in the name; the overflow series drops them.
        """
        if amount == 0:
            return
        extra = "".join(f".{k}_{v}" for k, v in labels)
        name = f"{RATE_LIMIT}.{key}{extra}.{stat}"
        with self._lock:
            if name in self._values:
                self._values[name] += amount
            else:
                parts = tuple(key.split(".")) if path is None else path
                self._new_series(key, name, stat, amount, parts, labels)

    def _new_series(
        self,
        key: str,
        name: str,
        stat: str,
        amount: int,
        path: tuple[str, ...],
        labels: tuple[tuple[str, str], ...],
    ) -> None:
        """Start the series ``name`` (of the series key ``key``) at ``amount``, unless its
        rule has series for ``max_values`` other values already: then fold it into the
        rule's ``_other_`` series. The caller holds the lock."""
        if isinstance(path, ValuePath):
            rule: tuple[str, ...] | None = path.rule
        else:
            # Every domain that no configuration defines counts for one rule: ().
            rule = () if stat == "domain_not_found" else None
        if rule is None or self._admit(rule, key):
            self._add_series(name, stat, amount, path, labels)
            return
        self._folded[rule] = self._folded.get(rule, 0) + 1
        self._values[VALUES_FOLDED] = self._values.get(VALUES_FOLDED, 0) + 1
        other = (*rule, OTHER)
        extra = "".join(f".{k}_{v}" for k, v in labels)
        self._add_series(
            f"{RATE_LIMIT}.{'.'.join(other)}{extra}.{stat}", stat, amount, other, labels
        )

    def _admit(self, rule: tuple[str, ...], key: str) -> bool:
        """Whether the value ``key`` of ``rule`` has series of its own (the first
        ``max_values`` values of a rule have). The caller holds the lock."""
        admitted = self._rule_values.get(rule)
        if admitted is None:
            admitted = self._rule_values[rule] = set()
        if key in admitted:
            return True
        if len(admitted) < self.max_values:
            admitted.add(key)
            return True
        return False

    def _add_series(
        self,
        name: str,
        stat: str,
        amount: int,
        path: tuple[str, ...],
        labels: tuple[tuple[str, str], ...],
    ) -> None:
        """Add to the series ``name``, starting it if need be, or fold it into the overflow
        series when ``max_series`` exist already. The caller holds the lock."""
        values = self._values
        if name in values:
            values[name] += amount
        elif len(self._rules) < self.max_series:
            values[name] = amount
            self._rules[name] = (stat, path, labels)
        else:
            overflow = f"{RATE_LIMIT}.overflow.{stat}"
            if overflow not in values:
                self._rules[overflow] = (stat, None, ())
            values[overflow] = values.get(overflow, 0) + amount
            values[STATS_OVERFLOW] = values.get(STATS_OVERFLOW, 0) + 1

    def rule_counts(self, rows: Sequence[tuple[str, tuple[str, ...], tuple[int, ...]]]) -> None:
        """For each (key, path, counts), add counts to the fixed-window stats of key in the
        order of ``FIXED_WINDOW_STATS`` (total_hits, within_limit, near_limit, over_limit):
        the hot path's ``rule`` calls for all the counters of a request under one lock, with
        the names built once per key."""
        known = self._names
        values = self._values
        with self._lock:
            for key, path, counts in rows:
                names = known.get(key)
                if names is None:
                    names = tuple(f"{RATE_LIMIT}.{key}.{stat}" for stat in FIXED_WINDOW_STATS)
                    if len(known) < self.max_series:
                        known[key] = names
                for name, stat, amount in zip(names, FIXED_WINDOW_STATS, counts, strict=True):
                    if not amount:
                        continue
                    if name in values:
                        values[name] += amount
                    else:
                        self._new_series(key, name, stat, amount, path, ())

    @property
    def series(self) -> int:
        """How many per-rule series exist (the overflow ones included)."""
        with self._lock:
            return len(self._rules)

    def capped(self) -> list[CappedRule]:
        """The rules that reached MAX_METRIC_SERIES, by name (unknown domains as one rule,
        ``domain_not_found``)."""
        with self._lock:
            return sorted(
                CappedRule(".".join(rule) or "domain_not_found", len(self._rule_values[rule]), n)
                for rule, n in self._folded.items()
            )

    def status(self) -> dict[str, object]:
        """/status's view: the series, both caps and the rules that reached MAX_METRIC_SERIES
        (each with the values it keeps and the increments folded since)."""
        capped = [{"rule": c.rule, "values": c.values, "folded": c.folded} for c in self.capped()]
        return {
            "series": self.series,
            "max_series": self.max_series,
            "max_metric_series": self.max_values,
            "capped_rules": capped,
        }

    def rule_series(self) -> list[RuleSeries]:
        """Every per-rule series as (stat, path, labels, value), at one instant."""
        with self._lock:
            values = self._values
            return [
                (stat, path, labels, values[name])
                for name, (stat, path, labels) in self._rules.items()
            ]

    def get(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(sorted(self.snapshot().items()))
