"""What the console draws, kept bounded: a sampler that reads ``Stats`` every few seconds into
fixed-size rings, a backend latency recorder, and a decaying top-K of over-limit series.

Nothing here runs on the request path except :class:`LatencyRecorder`'s two clock reads per
backend call; everything else is derived from counters the service keeps anyway, by
differencing them between samples.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, TypeVar

from ferryman.engine.observe import SpaceSaving
from ferryman.stats import CALL, REQUEST_CALL, RuleSeries, Stats
from ferryman.tasks import cancel

__all__ = ["LatencyRecorder", "Sampler", "SpaceSaving", "series_label"]

log = logging.getLogger("ferryman.console")
T = TypeVar("T")

# Upper bounds in seconds; the last bucket is everything slower.
LATENCY_BOUNDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
# How many series of each kind one sample keeps (the busiest): samples stay small whatever
# the number of rules or tenants.
PER_SAMPLE = 10
ERROR_STATS = {
    "backend": (f"{CALL}.redis_error", f"{REQUEST_CALL}.redis_error"),
    "service": (f"{CALL}.service_error", f"{REQUEST_CALL}.service_error"),
    "degraded": (f"{CALL}.degraded", f"{REQUEST_CALL}.degraded"),
}


@dataclass
class _Window:
    calls: int = 0
    errors: int = 0
    total: float = 0.0
    slowest: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))


class LatencyRecorder:
    """Backend call times since the last read: count, sum, slowest and a fixed histogram."""

    def __init__(self) -> None:
        self._window = _Window()

    def record(self, seconds: float, failed: bool = False) -> None:
        w = self._window
        w.calls += 1
        w.total += seconds
        w.errors += failed
        if seconds > w.slowest:
            w.slowest = seconds
        w.buckets[bisect.bisect_left(LATENCY_BOUNDS, seconds)] += 1

    async def around(self, call: Awaitable[T]) -> T:
        """``call``'s result, its time recorded here."""
        start = perf_counter()
        failed = True
        try:
            result = await call
            failed = False
            return result
        finally:
            self.record(perf_counter() - start, failed)

    def take(self) -> dict[str, float]:
        """What was recorded since the previous take, in milliseconds; starts afresh."""
        w, self._window = self._window, _Window()
        return {
            "calls": w.calls,
            "errors": w.errors,
            "mean_ms": w.total / w.calls * 1000 if w.calls else 0.0,
            "p99_ms": _quantile(w.buckets, w.calls, 0.99, w.slowest) * 1000,
            "max_ms": w.slowest * 1000,
        }


def _quantile(buckets: list[int], count: int, q: float, slowest: float) -> float:
    """The upper bound of the bucket holding the q-quantile (never above the slowest call)."""
    if not count:
        return 0.0
    rank = q * count
    seen = 0
    for i, n in enumerate(buckets):
        seen += n
        if seen >= rank:
            bound = LATENCY_BOUNDS[i] if i < len(LATENCY_BOUNDS) else slowest
            return min(bound, slowest)
    return slowest


def series_label(path: tuple[str, ...] | None) -> str:
    """A rule series' name as people read it: ``domain: level1.level2``."""
    if path is None:
        return "(overflow)"
    return f"{path[0]}: {'.'.join(path[1:])}" if len(path) > 1 else path[0]


def _backend_sample(latency: dict[str, float], dt: float) -> dict[str, float]:
    """The backend's calls and errors per second, and its latency, over one interval."""
    return {
        "calls": round(latency["calls"] / dt, 3),
        "errors": round(latency["errors"] / dt, 3),
        "mean_ms": round(latency["mean_ms"], 4),
        "p99_ms": round(latency["p99_ms"], 4),
        "max_ms": round(latency["max_ms"], 4),
    }


def _busiest(rates: dict[str, float], n: int = PER_SAMPLE) -> dict[str, float]:
    return {k: round(v, 3) for k, v in heapq.nlargest(n, rates.items(), key=lambda kv: kv[1])}


HoldsReader = Callable[[], dict[str, int]]


class Sampler:
    """Reads ``Stats`` every ``interval`` seconds; keeps ``span`` seconds of samples in a ring.

    A sample is a small dict of per-second rates over the interval before it: decisions in
    all and by outcome (ok, over the limit, shadow), the busiest domains and rules, backend
    latency and errors, burst-tier hits per tier of the busiest burst nodes with their
    bursts, and the held-resource gauges ``holds`` returns. Over-limit series also feed a
    decaying top-K (``top``), whose half-life is a minute.
    """

    def __init__(
        self,
        stats: Stats,
        latency: LatencyRecorder,
        holds: HoldsReader | None = None,
        *,
        interval: float = 3.0,
        span: float = 900.0,
        top_capacity: int = 64,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.stats = stats
        self.latency = latency
        self.interval = interval
        self.span = span
        self.samples: deque[dict[str, Any]] = deque(maxlen=max(2, round(span / interval)))
        self.top = SpaceSaving(top_capacity, decay=0.5 ** (interval / 60.0))
        self._holds = holds
        self._wall = wall
        self._last: dict[tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...]], int] = {}
        self._last_fixed: dict[str, int] = {}
        self._last_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Take a first reading (the baseline), then sample in the background."""
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ferryman-console")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.sample()
            except Exception:  # the console must never take the service down
                log.exception("console sampler failed; trying again next interval")

    def since(self, after: float) -> list[dict[str, Any]]:
        """The samples taken after ``after`` (epoch seconds), oldest first."""
        return [s for s in self.samples if s["t"] > after]

    def sample(self) -> dict[str, Any] | None:
        """Read the counters now; append and return the sample (None for the first reading,
        which only sets the baseline)."""
        now = self._wall()
        series = self.stats.rule_series()
        fixed = {n: self.stats.get(n) for names in ERROR_STATS.values() for n in names}
        latency = self.latency.take()
        previous, self._last = self._last, {}
        last_fixed, self._last_fixed = self._last_fixed, fixed
        deltas = self._deltas(series, previous)
        started, self._last_at = self._last_at, now
        if started is None:
            return None
        dt = max(now - started, 1e-3)
        sample = self._build(now, dt, deltas, latency, fixed, last_fixed)
        self.samples.append(sample)
        return sample

    def _deltas(
        self,
        series: Iterable[RuleSeries],
        previous: dict[tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...]], int],
    ) -> list[tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...], int]]:
        out = []
        remember = self._last
        for stat, path, labels, value in series:
            key = (stat, path, labels)
            remember[key] = value
            # A series seen for the first time counts from zero: it was born this interval.
            delta = value - previous.get(key, 0)
            if delta > 0:
                out.append((stat, path, labels, delta))
        return out

    def _build(
        self,
        now: float,
        dt: float,
        deltas: list[tuple[str, tuple[str, ...] | None, tuple[tuple[str, str], ...], int]],
        latency: dict[str, float],
        fixed: dict[str, int],
        last_fixed: dict[str, int],
    ) -> dict[str, Any]:
        total = over = shadow = 0
        domains: dict[str, float] = {}
        rules: dict[str, float] = {}
        tiers: dict[str, dict[str, float]] = {}
        bursts: dict[str, int] = {}
        self.top.age()
        for stat, path, labels, delta in deltas:
            label = series_label(path)
            if stat == "total_hits":
                total += delta
                domain = path[0] if path else "(overflow)"
                domains[domain] = domains.get(domain, 0) + delta / dt
                rules[label] = rules.get(label, 0) + delta / dt
            elif stat == "over_limit":
                over += delta
                self.top.offer(label, delta)
            elif stat == "shadow_mode":
                shadow += delta
            elif stat == "tier_hits":
                tier = dict(labels).get("tier", "?")
                per_tier = tiers.setdefault(label, {})
                per_tier[tier] = per_tier.get(tier, 0) + delta / dt
            elif stat == "burst":
                bursts[label] = bursts.get(label, 0) + delta
        blocked = max(0, over - shadow)
        errors = {
            kind: max(0, sum(fixed.get(n, 0) - last_fixed.get(n, 0) for n in names)) / dt
            for kind, names in ERROR_STATS.items()
        }
        busiest_tiers = heapq.nlargest(
            PER_SAMPLE, tiers.items(), key=lambda kv: sum(kv[1].values())
        )
        return {
            "t": round(now, 3),
            "dt": round(dt, 3),
            "decisions": round(total / dt, 3),
            "ok": round(max(0, total - over) / dt, 3),
            "over_limit": round(blocked / dt, 3),
            "shadow": round(min(shadow, over) / dt, 3),
            "domains": _busiest(domains),
            "rules": _busiest(rules),
            "backend": _backend_sample(latency, dt),
            "errors": {k: round(v, 3) for k, v in errors.items()},
            "tiers": {k: {t: round(r, 3) for t, r in v.items()} for k, v in busiest_tiers},
            "bursts": dict(heapq.nlargest(PER_SAMPLE, bursts.items(), key=lambda kv: kv[1])),
            "holds": self._holds() if self._holds is not None else {},
        }
