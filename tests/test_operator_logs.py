"""The rate-limited reporter that keeps client-caused errors to one log line per interval."""

from __future__ import annotations

import logging

import pytest

from ferryman.logs import ThrottledLog


def test_throttled_log_reports_first_then_once_per_interval_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first occurrence is logged; the rest within the interval are counted and the
    next one after it is logged with the number seen since."""
    now = [0.0]
    reporter = ThrottledLog(logging.getLogger("t.throttle"), interval=10, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="t.throttle")
    logged = []
    for step in range(1000):  # 1000 occurrences over 25 s
        now[0] = step * 0.025
        logged.append(reporter.report("bad input"))
    assert sum(logged) == 3  # at 0 s, 10 s and 20 s
    counts = [r.fields["count"] for r in caplog.records]  # type: ignore[attr-defined]
    assert counts == [1, 400, 400]
    assert reporter.total == 1000
    assert "bad input (400 such since the last report" in caplog.records[1].getMessage()
