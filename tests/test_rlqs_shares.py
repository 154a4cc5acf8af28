"""The quota service's arithmetic: demand from reports, the split by demand, shares as Envoy's
token buckets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferryman.algorithms.leases.model import Kind
from ferryman.apis.rlqs_shares import (
    MAX_FILL_SECONDS,
    WINDOW_REPORTS,
    Bucket,
    Meter,
    bucket_of,
    buckets_of,
    observe,
    split,
)


def test_demand_is_allowed_and_denied_over_the_seconds_reported() -> None:
    """25 allowed and 25 denied over 5 s is a demand of 10/s."""
    assert observe(Meter(), 50, 5).rate == 10.0


def test_a_zero_second_report_counts_toward_the_next() -> None:
    """Envoy's first report of a bucket comes at once (0 s): its hits join the next report."""
    meter = observe(Meter(), 1, 0)
    assert meter.rate is None
    assert observe(meter, 49, 5).rate == 10.0


def test_steady_demand_settles_within_the_window_of_reports() -> None:
    """After WINDOW_REPORTS reports at a new steady rate, the demand is that rate exactly."""
    meter = Meter()
    for _ in range(5):
        meter = observe(meter, 150, 5)
    for _ in range(WINDOW_REPORTS):
        meter = observe(meter, 50, 5)
    assert meter.rate == 10.0


def test_fair_share_follows_demand_and_adds_up_to_the_rate() -> None:
    """30/s and 10/s against 20/s: 10 each; 30/s and 4/s: 16 and 4, the rest spread."""
    assert split(Kind.FAIR_SHARE, 20.0, {"a": 30.0, "b": 10.0}) == {"a": 10.0, "b": 10.0}
    assert split(Kind.FAIR_SHARE, 20.0, {"a": 30.0, "b": 4.0}) == {"a": 16.0, "b": 4.0}
    low = split(Kind.FAIR_SHARE, 20.0, {"a": 2.0, "b": 4.0})
    assert low == {"a": 9.0, "b": 11.0}


def test_an_unknown_demand_counts_as_wanting_it_all() -> None:
    """A new Envoy, before a report that covered time, gets an equal share."""
    assert split(Kind.FAIR_SHARE, 20.0, {"a": 30.0, "new": None}) == {"a": 10.0, "new": 10.0}


@given(
    st.sampled_from([Kind.FAIR_SHARE, Kind.PROPORTIONAL_SHARE]),
    st.floats(0.0, 1e6),
    st.lists(st.one_of(st.none(), st.floats(0.0, 1e6)), min_size=1, max_size=20),
)
def test_shares_never_add_up_to_more_than_the_rate(
    kind: Kind, rate: float, demands: list[float | None]
) -> None:
    """Whatever the demands, the sharing algorithms' shares add up to the rate at most."""
    shares = split(kind, rate, dict(enumerate(demands)))
    assert sum(shares.values()) <= rate * (1 + 1e-9) + 1e-9
    assert all(s >= 0 for s in shares.values())


def test_a_share_becomes_whole_second_fills_with_one_fill_at_most() -> None:
    """10/s is 10 per second (max 10); 6.5/s is 13 per 2 s; 0.25/s is 1 per 4 s."""
    assert bucket_of(10.0) == Bucket(10, 10, 1)
    assert bucket_of(6.5) == Bucket(13, 13, 2)
    assert bucket_of(0.25) == Bucket(1, 1, 4)
    assert bucket_of(0.0) == Bucket(0, 0, 1)
    assert bucket_of(1e-9) == Bucket(1, 1, MAX_FILL_SECONDS)


def test_the_limits_burst_keeps_the_fill_interval_short() -> None:
    """6.5/s would be 13 per 2 s; a burst share of 10 keeps it at one second (6 per 1 s)."""
    assert bucket_of(6.5, burst=10.0) == Bucket(6, 6, 1)
    assert bucket_of(6.5, burst=13.0) == Bucket(13, 13, 2)


@given(st.floats(1.0, 1e6))
def test_a_bucket_never_allows_more_than_its_share(share: float) -> None:
    """The token bucket's rate is within 2% below the share, never above it; fills are whole
    seconds."""
    bucket = bucket_of(share)
    assert bucket.fill_seconds >= 1 and bucket.tokens_per_fill >= 1
    assert bucket.per_second <= share
    assert bucket.per_second >= share * 0.98 or bucket.per_second == math.floor(share)
    assert bucket.max_tokens == bucket.tokens_per_fill


def test_small_shares_add_up_to_the_whole_rate_not_to_their_floors() -> None:
    """1,024 Envoys sharing 1,200/s (one second's burst): rounding each share down alone
    assigns 1/s each (85%); with the remainders handed back, the buckets add up to the
    whole rate, never more, each within one token of its share."""
    shares = {i: 1200 / 1024 for i in range(1024)}
    alone = sum(bucket_of(s, s).per_second for s in shares.values())
    assert alone == 1024
    buckets = buckets_of(shares, 1.0)
    assert sum(b.per_second for b in buckets.values()) == 1200
    assert all(abs(b.per_second - shares[k]) < 1 for k, b in buckets.items())
    uneven = {i: 0.3 + (i % 7) * 0.9 for i in range(500)}
    total = sum(b.per_second for b in buckets_of(uneven, 1.0).values())
    assert sum(uneven.values()) - 1 < total <= sum(uneven.values())


def test_a_step_in_demand_is_taken_at_once_a_wavering_one_smoothed() -> None:
    """From a steady 10/s, a report of 30/s (departing from the window by more than STEP)
    is the demand at once; reports that waver around 10/s are averaged over the window."""
    meter = Meter()
    for _ in range(WINDOW_REPORTS):
        meter = observe(meter, 50, 5)
    assert observe(meter, 150, 5).rate == 30.0
    wavering = observe(observe(meter, 55, 5), 45, 5)
    assert wavering.rate == pytest.approx(10.0)
    assert observe(meter, 55, 5).rate == pytest.approx(155 / 15)
