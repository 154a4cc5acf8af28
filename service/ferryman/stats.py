"""Counters under the reference service's stat names, kept in process and bounded."""

from __future__ import annotations

import threading
from collections.abc import Iterator

__all__ = ["Stats"]

SERVICE = "ratelimit.service"
RATE_LIMIT = "ratelimit.service.rate_limit"


class Stats:
    """A bounded set of monotonically increasing counters.

    Rule keys built from request values (``detailed_metric``) could grow without bound; past
    ``max_series`` distinct names, new names are folded into ``<prefix>.overflow`` and counted
    in ``ratelimit.service.stats_overflow``.
    """

    def __init__(self, max_series: int = 10_000) -> None:
        self._values: dict[str, int] = {}
        self._max = max_series
        self._lock = threading.Lock()

    def inc(self, name: str, amount: int = 1) -> None:
        if amount == 0:
            return
        with self._lock:
            if name in self._values:
                self._values[name] += amount
            elif len(self._values) < self._max:
                self._values[name] = amount
            else:
                overflow = RATE_LIMIT + ".overflow." + name.rsplit(".", 1)[-1]
                self._values[overflow] = self._values.get(overflow, 0) + amount
                key = SERVICE + ".stats_overflow"
                self._values[key] = self._values.get(key, 0) + 1

    def rule(self, key: str, stat: str, amount: int) -> None:
        """Add to ``ratelimit.service.rate_limit.<key>.<stat>``."""
        self.inc(f"{RATE_LIMIT}.{key}.{stat}", amount)

    def get(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(sorted(self.snapshot().items()))
