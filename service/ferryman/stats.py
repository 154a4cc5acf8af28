"""Counters under the reference service's stat names, kept in process and bounded."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

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
    "RuleSeries",
    "Stats",
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
LOCAL_CACHE_HITS = "ratelimit.service.local_cache_hits"
TOTAL_REQUESTS = "ratelimit_server.ShouldRateLimit.total_requests"


def total_requests(method: str) -> str:
    """The counter of calls to a gRPC method (the reference's name for ShouldRateLimit)."""
    return f"ratelimit_server.{method}.total_requests"


# The per-rule stats of the reference, plus the per-domain one that shares their prefix.
RULE_STATS = (
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "over_limit_with_local_cache",
    "domain_not_found",
    "burst",
    "tier_hits",
)

# The stats a fixed-window counter updates on every hit, in Stats.rule_counts's order.
FIXED_WINDOW_STATS = ("total_hits", "within_limit", "near_limit", "over_limit")

# (stat, path, labels, value): path is (domain, level1, level2, ...), or None for the overflow
# series; labels are the series' own extra labels (a burst tier's ``tier``), as pairs.
RuleSeries = tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...], int]


class Stats:
    """Monotonically increasing counters, with the request-derived ones bounded.

    ``inc`` is for the service's fixed names, a small set known in advance. ``rule`` is for
    names built from configuration and request values (``detailed_metric`` puts request
    values in them): past ``max_series`` distinct such names, new ones are folded into
    ``ratelimit.service.rate_limit.overflow.<stat>`` and each fold counts one in
    ``ratelimit.service.stats_overflow``.
    """

    def __init__(self, max_series: int = 10_000) -> None:
        self._values: dict[str, int] = {}
        # Every rule series by name, with its stat and its parts (for exporters' labels).
        self._rules: dict[str, tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...]]] = {}
        self.max_series = max_series
        self._lock = threading.Lock()
        # The full names of a fixed-window rule's stats, by rule key (at most max_series).
        self._names: dict[str, tuple[str, ...]] = {}

    def inc(self, name: str, amount: int = 1) -> None:
        """Add to a fixed-name counter (never folded: its names are few and known)."""
        if amount == 0:
            return
        with self._lock:
            self._values[name] = self._values.get(name, 0) + amount

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
                self._new_series(name, stat, amount, parts, labels)

    def _new_series(
        self,
        name: str,
        stat: str,
        amount: int,
        path: tuple[str, ...],
        labels: tuple[tuple[str, str], ...],
    ) -> None:
        """Start the series ``name`` at ``amount``, or fold it into the overflow series when
        ``max_series`` exist already. The caller holds the lock."""
        values = self._values
        if len(self._rules) < self.max_series:
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
                        self._new_series(name, stat, amount, path, ())

    @property
    def series(self) -> int:
        """How many per-rule series exist (the overflow ones included)."""
        with self._lock:
            return len(self._rules)

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
