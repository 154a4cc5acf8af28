"""The arithmetic of Envoy's rate limit quota service, pure: an Envoy's demand from its usage
reports, the split of a bucket's global rate among the Envoys by demand (Doorman's
algorithms), and a share as the token bucket Envoy 1.40 enforces.

What Envoy 1.40 does shapes it: reports come every 5 s whatever the filter says, with
``time_elapsed`` in whole seconds and possibly 0; a token bucket's ``fill_interval`` below
one second is truncated to 0 and limits nothing; a changed bucket starts full; an assignment
whose time to live runs out falls back to the filter's expired behaviour.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from ferryman.algorithms.leases.algorithms import divide
from ferryman.algorithms.leases.model import Demand, Kind

__all__ = [
    "MAX_FILL_SECONDS",
    "REPORT_SECONDS",
    "TTL_SECONDS",
    "WINDOW_REPORTS",
    "Bucket",
    "Meter",
    "bucket_of",
    "buckets_of",
    "observe",
    "split",
    "split_by_claimant",
]

K = TypeVar("K")

#: How often Envoy 1.40 reports, whatever ``reporting_interval`` says.
REPORT_SECONDS = 5
#: An assignment lives three report cadences: a lost report or two keeps the bucket.
TTL_SECONDS = 3 * REPORT_SECONDS
#: Demand is the rate over the last reports that covered time: steady demand settles in this
#: many reports.
WINDOW_REPORTS = 3
#: A report whose rate departs from the window's by more than this share of it is a step
#: in demand, taken at once: a step reaches the shares within one report and one tick.
STEP = 0.25
#: The longest fill interval handed out; a share below one token per this long gets one.
MAX_FILL_SECONDS = 60
#: A token count is rounded down; a fill interval longer than one second is taken when it
#: keeps the share this much closer (6.5/s is 13 per 2 s, not 6 per 1 s).
_CLOSE_ENOUGH = 0.02
_MAX_TRIED_SECONDS = 10


@dataclass(frozen=True, slots=True)
class Meter:
    """One Envoy's demand on one bucket: the last reports that covered time (hits, seconds),
    newest last, the hits of 0 s reports waiting for the next one, and ``rate``: requests
    per second (allowed and denied) over the window, None before any report covered time."""

    window: tuple[tuple[int, int], ...] = ()
    pending: int = 0
    rate: float | None = None


def observe(meter: Meter, hits: int, seconds: int) -> Meter:
    """``meter`` after a report of ``hits`` (allowed + denied) over ``seconds`` (whole, as
    Envoy sends them): a 0 s report's hits count toward the next report. The rate is the
    window's, smoothing a demand that wavers; a report that departs from it by more than
    STEP is a step in demand, taken at once (the window catches up over its reports)."""
    if seconds <= 0:
        return Meter(meter.window, meter.pending + hits, meter.rate)
    latest = (hits + meter.pending) / seconds
    window = (*meter.window, (hits + meter.pending, seconds))[-WINDOW_REPORTS:]
    rate = sum(h for h, _ in window) / sum(s for _, s in window)
    if abs(latest - rate) > STEP * max(rate, 1.0):
        rate = latest
    return Meter(window, 0, rate)


def split(kind: Kind, per_second: float, demands: Mapping[K, float | None]) -> dict[K, float]:
    """Each Envoy's share of ``per_second`` by its demand (None: not known yet, counted as
    wanting it all). What the algorithm leaves over is spread evenly, so that the shares add
    up to the whole rate and a rising demand finds room before the next report."""
    if not demands:
        return {}
    wants = {name: Demand(per_second if d is None else max(0.0, d)) for name, d in demands.items()}
    division = divide(kind, per_second, list(wants.values()))
    shares = {name: min(per_second, division.share(w)) for name, w in wants.items()}
    left = per_second - sum(shares.values())
    if left > 0:
        extra = left / len(shares)
        shares = {name: share + extra for name, share in shares.items()}
    return shares


def split_by_claimant(
    kind: Kind,
    per_second: float,
    demands: Mapping[K, float | None],
    claimants: Mapping[K, str],
) -> dict[K, float]:
    """:func:`split` with every claimant's Envoys counted as one: the rate is divided among
    the claimants by their Envoys' summed demand (no more than the rate), then each
    claimant's share among its own Envoys by their demand. Opening more streams, or
    claiming more than the whole rate, buys a claimant no larger share."""
    members: dict[str, dict[K, float | None]] = {}
    for k, demand in demands.items():
        members.setdefault(claimants[k], {})[k] = demand
    if len(members) == len(demands):
        return split(kind, per_second, demands)
    wants: dict[str, float | None] = {}
    for claimant, own in members.items():
        known = [d for d in own.values() if d is not None]
        wants[claimant] = None if len(known) < len(own) else min(per_second, sum(known))
    shares: dict[K, float] = {}
    for claimant, share in split(kind, per_second, wants).items():
        shares.update(split(kind, share, members[claimant]))
    return shares


@dataclass(frozen=True, slots=True)
class Bucket:
    """A share as Envoy's token bucket: ``tokens_per_fill`` every ``fill_seconds`` (whole),
    at most ``max_tokens`` at once; ``tokens_per_fill`` 0 denies everything."""

    max_tokens: int
    tokens_per_fill: int
    fill_seconds: int

    @property
    def per_second(self) -> float:
        return self.tokens_per_fill / self.fill_seconds


@functools.lru_cache(maxsize=4096)  # a bucket's Envoys mostly keep their shares
def bucket_of(share: float, burst: float | None = None) -> Bucket:
    """The token bucket that enforces ``share`` per second, never more (but one token per
    MAX_FILL_SECONDS at least): the shortest whole fill interval that keeps it within 2% (a
    share below one per second gets the interval of one token). A bucket holds one fill
    (Envoy starts a changed bucket full, and caps the fill at ``max_tokens``); a longer
    interval is not taken when its fill would pass ``burst``, the share of the limit's burst."""
    if share <= 0 or not math.isfinite(share):
        return Bucket(0, 0, 1)
    if share * MAX_FILL_SECONDS < 1:
        return Bucket(1, 1, MAX_FILL_SECONDS)
    if share < 1:
        seconds = min(MAX_FILL_SECONDS, math.ceil(1 / share))
        return Bucket(1, 1, seconds)
    longest = _MAX_TRIED_SECONDS
    if burst is not None:
        longest = max(1, min(longest, math.floor(burst / share)))
    best = (1, math.floor(share))
    for seconds in range(1, longest + 1):
        tokens = math.floor(share * seconds)
        if tokens / seconds >= share * (1 - _CLOSE_ENOUGH):
            best = (seconds, tokens)
            break
        if tokens / seconds > best[1] / best[0]:
            best = (seconds, tokens)
    seconds, tokens = best
    return Bucket(tokens, tokens, seconds)


def buckets_of(shares: Mapping[K, float], burst_ratio: float | None = None) -> dict[K, Bucket]:
    """Every share as a token bucket (:func:`bucket_of`), with what rounding down leaves
    over handed back one token per second at a time to the one-second buckets that lost
    the most (largest remainders first): many small shares then add up to the whole rate
    less than one token per second, not to the sum of their floors. The buckets never add
    up to more than the shares. ``burst_ratio``: the limit's burst over its rate."""
    buckets = {
        k: bucket_of(share, None if burst_ratio is None else burst_ratio * share)
        for k, share in shares.items()
    }
    lost = {k: shares[k] - b.per_second for k, b in buckets.items() if b.fill_seconds == 1}
    spare = math.floor(sum(shares.values()) - sum(b.per_second for b in buckets.values()) + 1e-9)
    if spare <= 0 or not lost:
        return buckets
    for k in sorted(lost, key=lost.__getitem__, reverse=True)[:spare]:
        b = buckets[k]
        if b.tokens_per_fill == 0 and shares[k] <= 0:
            continue
        tokens = b.tokens_per_fill + 1
        buckets[k] = Bucket(max(b.max_tokens, tokens), tokens, 1)
    return buckets
