"""The fixed-window arithmetic, checked against a plain hit-by-hit model."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ferryman.algorithms.fixed_window.model import classify
from ferryman.core.periods import UnitPeriod
from ferryman.core.rules import Unit


def test_windows_are_aligned_to_the_epoch() -> None:
    """Window start is floor(now / unit) * unit; reset is the rest of the window."""
    minute, day = UnitPeriod(Unit.MINUTE), UnitPeriod(Unit.DAY)
    assert minute.window(2222.7) == ("2220", 2220, 2280)
    assert minute.reset_after(2222.7) == 58
    assert day.window(86399.0)[1] == 0
    assert day.reset_after(86400.0) == 86400


@given(
    limit=st.integers(0, 50),
    before=st.integers(0, 80),
    hits=st.integers(1, 30),
    ratio=st.sampled_from([0.0, 0.5, 0.8, 1.0]),
)
def test_stats_split_equals_counting_hit_by_hit(
    limit: int, before: int, hits: int, ratio: float
) -> None:
    """within/near/over for a request equal the sum of classifying each of its hits alone."""
    after = before + hits
    over, delta = classify(hits, limit, before, after, ratio)
    assert over == (after > limit)
    threshold = math.floor(limit * ratio)
    # Hit by hit: hit number n (1-based count after it) is over if n > limit, near if
    # threshold < n <= limit. A request over the limit counts no 'within' at all.
    counts = range(before + 1, after + 1)
    expect_over = sum(1 for n in counts if n > limit)
    expect_near = sum(1 for n in counts if threshold < n <= limit)
    assert delta.over == expect_over
    assert delta.near == expect_near
    assert delta.within == (0 if over else hits)
