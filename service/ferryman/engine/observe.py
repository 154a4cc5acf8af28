"""What the engine tells about its decisions: the traffic no rule covers (a domain's
``allow_unconfigured``) and, to whoever watches (the decision log, replay), every decision.

A watcher is told each decision as it is made, by the kind of call: a ShouldRateLimit
decision as a :class:`Seen` (to :meth:`DecisionWatcher.decided`), a ferryman.v1 ``Request``
as a :class:`Requested` (to :meth:`DecisionWatcher.requested`). Both carry the time the
engine decided at and the rule reached, so that a replay on a virtual clock decides again
at the same instant.

The descriptors no rule covers are kept per domain as a space-saving top-k: a bounded table
of the most frequent ones, each with its count (an over-estimate by at most its ``error``)
and its rate since it entered the table.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from ferryman.core.answers import Decision, DescriptorRequest
from ferryman.core.rules import Rule
from ferryman.stats import Stats

__all__ = ["DecisionWatcher", "Requested", "Seen", "SpaceSaving", "TopK", "Unconfigured"]

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


class Requested(NamedTuple):
    """One ferryman.v1 ``Request`` as answered: when, on what, the node reached (None: none,
    granted under the domain's ``allow_unconfigured``), and the copies granted (those of an
    ``ignore_limits`` domain included)."""

    now: float
    domain: str
    entries: tuple[tuple[str, str], ...]
    copies: int
    min_copies: int
    max_wait_millis: int
    rule: Rule | None
    granted: int

    @property
    def refused(self) -> bool:
        """Granted fewer than ``min_copies``: none (a kind grants at least that many, or none)."""
        return self.granted < max(1, self.min_copies)


class DecisionWatcher(Protocol):
    """Told every decision: ShouldRateLimit's and ferryman.v1 Request's. Each method must
    return at once (the decision log hands the line to a writer thread)."""

    def decided(self, seen: Seen) -> None: ...

    def requested(self, seen: Requested) -> None: ...


class SpaceSaving:
    """The heaviest keys of a stream in ``capacity`` counters (Metwally et al.'s space-saving),
    with every count multiplied by ``decay`` at each :meth:`age`, so that the ranking follows
    what is heavy now rather than since the start.

    A key that enters a full table takes the place of the lightest one and inherits its count
    as ``error``: a key's true weight lies between ``count - error`` and ``count``.
    """

    def __init__(self, capacity: int, decay: float = 1.0) -> None:
        self.capacity = capacity
        self.decay = decay
        self._counts: dict[str, float] = {}
        self._errors: dict[str, float] = {}

    def offer(self, key: str, weight: float) -> None:
        counts = self._counts
        if key in counts:
            counts[key] += weight
            return
        if len(counts) < self.capacity:
            counts[key] = weight
            self._errors[key] = 0.0
            return
        lightest = min(counts, key=counts.__getitem__)
        floor = counts.pop(lightest)
        self._errors.pop(lightest, None)
        counts[key] = floor + weight
        self._errors[key] = floor

    def age(self) -> None:
        """Decay every count; forget keys whose weight has faded below a hundredth of a hit."""
        if self.decay == 1.0:
            return
        d = self.decay
        for key in list(self._counts):
            count = self._counts[key] * d
            if count < 0.01:
                del self._counts[key]
                self._errors.pop(key, None)
            else:
                self._counts[key] = count
                self._errors[key] *= d

    def top(self, n: int) -> list[tuple[str, float, float]]:
        """The ``n`` heaviest keys as (key, count, error), heaviest first."""
        best = heapq.nlargest(n, self._counts.items(), key=lambda item: item[1])
        return [(key, count, self._errors.get(key, 0.0)) for key, count in best]

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, key: str) -> bool:
        return key in self._counts


class TopK:
    """The most frequent descriptors of one domain (a plain :class:`SpaceSaving` of ``k``
    counters), each with when it entered the table and when it was last seen."""

    __slots__ = ("counts", "k", "seen", "total")

    def __init__(self, k: int) -> None:
        self.k = k
        self.total = 0
        self.counts = SpaceSaving(k)
        # descriptor -> [entries, since, last]; pruned to the counted keys as it grows
        self.seen: dict[str, list[Any]] = {}

    def add(self, key: tuple[tuple[str, str], ...], hits: int, now: float) -> None:
        self.total += hits
        name = ",".join(f"{k}={v}" for k, v in key)
        known = name in self.counts
        self.counts.offer(name, hits)
        if known:
            self.seen[name][2] = now
            return
        self.seen[name] = [key, now, now]  # new, or back after it was pushed out
        if len(self.seen) > 4 * self.k:
            self.seen = {n: v for n, v in self.seen.items() if n in self.counts}

    def top(self, now: float, limit: int | None = None) -> list[dict[str, object]]:
        """The keys by count, most first, each with its count, error and hits per second."""
        out: list[dict[str, object]] = []
        for name, count, error in self.counts.top(limit or self.k):
            key, since, last = self.seen[name]
            span = max(1.0, now - since)
            out.append(
                {
                    "descriptor": name,
                    "entries": [list(pair) for pair in key],
                    "count": round(count),
                    "error": round(error),
                    "rate": round((count - error) / span, 3),
                    "last_seen": last,
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
