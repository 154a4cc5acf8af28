"""What the engine tells about its decisions: the traffic no rule covers (a domain's
``allow_unconfigured``) and, to whoever watches, every decision (the decision log).

The descriptors no rule covers are kept per domain as a space-saving top-k: a bounded table
of the most frequent ones, each with its count (an over-estimate by at most its ``error``)
and its rate since it entered the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ferryman.core.answers import Decision, DescriptorRequest
from ferryman.core.rules import Rule
from ferryman.stats import Stats

__all__ = ["DecisionWatcher", "Seen", "TopK", "Unconfigured"]

#: The descriptors kept per domain, and the domains kept, by default.
TOP_K = 50
MAX_DOMAINS = 100


class Seen(NamedTuple):
    """One decision as made: when, on what, which rule each descriptor reached (None: no
    limited rule), and the answer. (A tuple: made on every decision a watcher sees.)"""

    now: float
    domain: str
    descriptors: Sequence[DescriptorRequest]
    hits_addend: int
    rules: tuple[Rule | None, ...]
    decision: Decision


class DecisionWatcher(Protocol):
    """Told every decision of ShouldRateLimit; it must return at once (the decision log
    hands the line to a writer thread)."""

    def decided(self, seen: Seen) -> None: ...


@dataclass(slots=True)
class _Entry:
    count: int
    error: int
    since: float
    last: float


class TopK:
    """The space-saving algorithm over at most ``k`` keys: a key not in a full table takes
    the place of the least counted one and inherits its count (as its ``error``)."""

    __slots__ = ("entries", "k", "total")

    def __init__(self, k: int) -> None:
        self.k = k
        self.total = 0
        self.entries: dict[tuple[tuple[str, str], ...], _Entry] = {}

    def add(self, key: tuple[tuple[str, str], ...], hits: int, now: float) -> None:
        self.total += hits
        entry = self.entries.get(key)
        if entry is not None:
            entry.count += hits
            entry.last = now
            return
        if len(self.entries) < self.k:
            self.entries[key] = _Entry(hits, 0, now, now)
            return
        # O(k), only when a new key arrives at a full table.
        least = min(self.entries, key=lambda found: self.entries[found].count)
        floor = self.entries.pop(least).count
        self.entries[key] = _Entry(floor + hits, floor, now, now)

    def top(self, now: float, limit: int | None = None) -> list[dict[str, object]]:
        """The keys by count, most first, each with its count, error and hits per second."""
        ranked = sorted(self.entries.items(), key=lambda item: -item[1].count)
        out: list[dict[str, object]] = []
        for key, entry in ranked[:limit]:
            span = max(1.0, now - entry.since)
            out.append(
                {
                    "descriptor": ",".join(f"{k}={v}" for k, v in key),
                    "entries": [list(pair) for pair in key],
                    "count": entry.count,
                    "error": entry.error,
                    "rate": round((entry.count - entry.error) / span, 3),
                    "last_seen": entry.last,
                }
            )
        return out


class Unconfigured:
    """The descriptors that reached no limited rule of a domain with ``allow_unconfigured``,
    per domain (at most ``max_domains``, each a top ``k``); the hits are also counted per
    domain as the ``unconfigured`` stat (no label carries a request's value)."""

    def __init__(self, stats: Stats, k: int = TOP_K, max_domains: int = MAX_DOMAINS) -> None:
        self._stats = stats
        self.k = k
        self.max_domains = max_domains
        self.domains: dict[str, TopK] = {}
        self.dropped = 0  # hits of domains past max_domains

    def record(
        self, domain: str, descriptors: Sequence[DescriptorRequest], hits: int, now: float
    ) -> None:
        """Count each of ``descriptors`` (all unconfigured) with the request's ``hits``."""
        table = self.domains.get(domain)
        if table is None:
            if len(self.domains) >= self.max_domains:
                self.dropped += len(descriptors)
                return
            table = self.domains[domain] = TopK(self.k)
        for desc in descriptors:
            amount = abs(desc.hits_of(hits))
            table.add(desc.entries, amount, now)
            self._stats.rule(domain, "unconfigured", amount, (domain,))

    def report(self, now: float, limit: int | None = None) -> dict[str, object]:
        """``/unconfigured``: per domain, its total and its top descriptors."""
        return {
            "domains": {
                name: {"total": table.total, "top": table.top(now, limit)}
                for name, table in sorted(self.domains.items())
            },
            "k": self.k,
            "dropped": self.dropped,
        }

    def forget(self, keep: Sequence[str]) -> None:
        """Drop the tables of domains no longer allowing unconfigured traffic."""
        for name in [n for n in self.domains if n not in keep]:
            del self.domains[name]
