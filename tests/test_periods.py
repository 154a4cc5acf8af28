"""Windows of any length and calendar windows: where each window starts and ends (against
a plain model that steps through local dates), across the 2026 daylight-saving changes and
month ends; their YAML and its errors; and ``rate_limit``/``sliding_window`` nodes with
``window`` or ``calendar`` through the real gRPC server on every store."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ferryman.algorithms.fixed_window import FixedWindow
from ferryman.clock import ManualClock
from ferryman.config import load_sources
from ferryman.core.periods import Calendar, Span, UnitPeriod
from ferryman.core.rules import Unit
from ferryman.errors import ConfigError

from helpers.server import EPOCH, ConfigDir, ServerFactory, codes
from helpers.stores import on_stores

ZONES = ("Europe/Berlin", "America/New_York", "UTC", "Asia/Kolkata", "Australia/Lord_Howe")


def model_bounds(unit: Unit, zone: str, now: float) -> tuple[float, float]:
    """The period containing ``now``, found by walking local dates one at a time."""
    tz = ZoneInfo(zone)
    day = datetime.fromtimestamp(now, tz).date()

    def midnight(d: date) -> float:
        return datetime.combine(d, datetime.min.time(), tz).timestamp()

    # fromtimestamp rounds to the microsecond: a hair before midnight reads as the next day.
    if midnight(day) > now:
        day -= timedelta(days=1)

    def begins(d: date) -> bool:
        if unit is Unit.DAY:
            return True
        if unit is Unit.WEEK:
            return d.isoweekday() == 1
        if unit is Unit.MONTH:
            return d.day == 1
        return d.month == 1 and d.day == 1

    first = day
    while not begins(first):
        first -= timedelta(days=1)
    after = first + timedelta(days=1)
    while not begins(after):
        after += timedelta(days=1)
    return midnight(first), midnight(after)


@settings(max_examples=300, deadline=None)
@given(
    now=st.floats(1_704_067_200, 1_893_456_000),  # 2024 to 2030
    unit=st.sampled_from([Unit.DAY, Unit.WEEK, Unit.MONTH, Unit.YEAR]),
    zone=st.sampled_from(ZONES),
)
@example(now=1_893_455_999.9999998, unit=Unit.DAY, zone="UTC")  # a hair before a midnight
def test_calendar_windows_agree_with_walking_the_calendar(
    now: float, unit: Unit, zone: str
) -> None:
    """Every calendar window contains its moment and starts and ends where the model says."""
    period = Calendar(unit, zone)
    key, start, end = period.window(now)
    assert (start, end) == model_bounds(unit, zone, now)
    assert start <= now < end and key == str(int(start))
    assert period.reset_after(now) == max(1, -int(-(end - now) // 1))


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [
        ("Europe/Berlin", date(2026, 3, 29), 23),
        ("Europe/Berlin", date(2026, 10, 25), 25),
        ("America/New_York", date(2026, 3, 8), 23),
        ("America/New_York", date(2026, 11, 1), 25),
        ("Europe/Berlin", date(2026, 7, 1), 24),
    ],
)
def test_a_calendar_day_lasts_as_long_as_the_local_day(zone: str, day: date, hours: int) -> None:
    """Across a daylight-saving change the day is 23 or 25 hours, from local midnight."""
    tz = ZoneInfo(zone)
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=tz).timestamp()
    _, start, end = Calendar(Unit.DAY, zone).window(noon)
    assert end - start == hours * 3600
    assert datetime.fromtimestamp(start, tz).hour == 0
    assert datetime.fromtimestamp(end, tz) == datetime(
        day.year, day.month, day.day, tzinfo=tz
    ) + timedelta(days=1)


@pytest.mark.parametrize(
    ("month", "days"),
    [((2026, 2), 28), ((2028, 2), 29), ((2026, 4), 30), ((2026, 12), 31), ((2100, 2), 28)],
)
def test_a_calendar_month_runs_to_the_first_of_the_next(month: tuple[int, int], days: int) -> None:
    """Month ends: 28, 29 (a leap year), 30 and 31 days; a year end rolls over."""
    tz = ZoneInfo("UTC")
    mid = datetime(*month, 15, tzinfo=tz).timestamp()
    _, start, end = Calendar(Unit.MONTH, "UTC").window(mid)
    assert end - start == days * 86400


def test_a_calendar_week_starts_on_monday() -> None:
    """Thursday 2026-11-26 in Berlin: the week began on Monday the 23rd at local midnight."""
    tz = ZoneInfo("Europe/Berlin")
    thursday = datetime(2026, 11, 26, 15, tzinfo=tz).timestamp()
    _, start, end = Calendar(Unit.WEEK, "Europe/Berlin").window(thursday)
    assert datetime.fromtimestamp(start, tz) == datetime(2026, 11, 23, tzinfo=tz)
    assert end - start == 7 * 86400


def test_windows_of_any_length_are_aligned_to_the_epoch() -> None:
    """A 30 s window starts at a multiple of 30 s; 500 ms windows are keyed in milliseconds;
    Envoy is told the smallest unit not shorter than the window."""
    half = Span(30.0)
    assert half.window(EPOCH + 47.5) == (str(int(EPOCH) + 30), EPOCH + 30, EPOCH + 60)
    assert half.reset_after(EPOCH + 47.5) == 13 and half.unit is Unit.MINUTE
    short = Span(0.5)
    assert short.window(100.7) == ("100500ms", 100.5, 101.0)
    assert short.unit is Unit.SECOND and short.reset_after(100.7) == 1
    assert Span(15 * 60).unit is Unit.HOUR and Span(6 * 3600).unit is Unit.DAY
    # The reference's units keep the reference's keys.
    assert UnitPeriod(Unit.MINUTE).window(EPOCH + 5)[0] == str(int(EPOCH))


def _limit(text: str) -> FixedWindow:
    config = load_sources([("w.yaml", text)])
    limit = config.domains["w"].root.rules[0].limit
    assert isinstance(limit, FixedWindow)
    return limit


def test_window_and_calendar_yaml() -> None:
    """``window`` and ``calendar`` stand in place of ``unit`` in a fixed window."""
    limit = _limit(
        "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5, window: 90s}\n"
    )
    assert limit.period == Span(90.0) and limit.rate.unit is Unit.HOUR
    text = (
        "domain: w\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1000\n"
        "      calendar: {unit: month, time_zone: Europe/Berlin}\n"
    )
    limit = _limit(text)
    assert limit.period == Calendar(Unit.MONTH, "Europe/Berlin") and limit.rate.unit is Unit.MONTH


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ("rate_limit: {requests_per_unit: 5, window: 30s, unit: second}", "rate_limit", "together"),
        ("rate_limit: {requests_per_unit: 5, window: soon}", "rate_limit.window", "duration"),
        ("rate_limit: {requests_per_unit: 5, window: 0s}", "rate_limit.window", "1ms to 366"),
        ("rate_limit: {requests_per_unit: 5, window: 1.0005s}", "rate_limit.window", "millisec"),
        (
            "rate_limit: {requests_per_unit: 5, calendar: {unit: hour}}",
            "rate_limit.calendar.unit",
            "day, week, month or year",
        ),
        (
            "rate_limit: {requests_per_unit: 5, calendar: {unit: day, time_zone: Mars/Base}}",
            "rate_limit.calendar.time_zone",
            "unknown time zone",
        ),
        (
            "sliding_window: {requests_per_unit: 5, calendar: {unit: day}}",
            "sliding_window.calendar",
            "no calendar",
        ),
        ("rate_limit: {requests_per_unit: 5}", "rate_limit", "missing 'unit'"),
    ],
)
def test_period_errors_name_file_line_and_path(body: str, path: str, message: str) -> None:
    """Each wrong period is refused with the file, its line and the path to the field."""
    with pytest.raises(ConfigError) as info:
        load_sources([("w.yaml", f"domain: w\ndescriptors:\n  - key: k\n    {body}\n")])
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.path) == ("w.yaml", 4, f"descriptors[0].{path}")
    assert message in problem.message


CONFIG = """
domain: w
descriptors:
  - key: half
    rate_limit: {requests_per_unit: 5, window: 30s}
  - key: month
    rate_limit:
      requests_per_unit: 3
      calendar: {unit: month, time_zone: Europe/Berlin}
  - key: slide
    sliding_window: {requests_per_unit: 4, window: 90s}
"""


@on_stores()
def test_a_30s_window_refuses_the_sixth_and_passes_30s_after_it_began(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """5 per 30 s: the 6th is refused; the next window (30 s after this one began) passes;
    Envoy is told 5 per minute, the headers the exact window."""
    config_dir.write("w.yaml", CONFIG)
    server = make_server(limit_response_headers_enabled=True)
    clock.set(EPOCH + 31)  # 1 s into the window [EPOCH + 30, EPOCH + 60)
    answers = [server.ask("w", [("half", "a")]) for _ in range(6)]
    assert [codes(r)[0] for r in answers] == ["OK"] * 5 + ["OVER_LIMIT"]
    first = answers[0].statuses[0]
    assert first.current_limit.requests_per_unit == 5
    assert first.current_limit.unit == 2  # MINUTE
    assert first.duration_until_reset.seconds == 29
    headers = {h.key: h.value for h in answers[5].response_headers_to_add}
    assert headers["RateLimit-Limit"] == "5, 5;w=30"
    assert headers["RateLimit-Reset"] == "29"
    clock.set(EPOCH + 59.9)
    assert codes(server.ask("w", [("half", "a")])) == ["OVER_LIMIT"]
    clock.set(EPOCH + 60)
    assert codes(server.ask("w", [("half", "a")])) == ["OK"]


@on_stores()
def test_a_calendar_month_resets_on_the_first_at_local_midnight(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """3 per calendar month in Berlin: refused until local midnight of the 1st, which is
    22:00 UTC the day before in summer; the reset is the time to that boundary."""
    config_dir.write("w.yaml", CONFIG)
    server = make_server()
    berlin = ZoneInfo("Europe/Berlin")
    boundary = datetime(2026, 7, 1, tzinfo=berlin).timestamp()
    clock.set(boundary - 3600)
    answers = [server.ask("w", [("month", "m")]) for _ in range(4)]
    assert [codes(r)[0] for r in answers] == ["OK"] * 3 + ["OVER_LIMIT"]
    assert answers[0].statuses[0].duration_until_reset.seconds == 3600
    assert answers[0].statuses[0].current_limit.unit == 5  # MONTH
    clock.set(boundary)
    r = server.ask("w", [("month", "m")])
    assert codes(r) == ["OK"] and r.statuses[0].limit_remaining == 2
    assert r.statuses[0].duration_until_reset.seconds == 31 * 86400


@on_stores()
def test_a_90s_sliding_window(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """4 per sliding 90 s: four pass, the fifth is refused; 45 s into the next window the
    previous one weighs half, so two more fit."""
    config_dir.write("w.yaml", CONFIG)
    server = make_server()
    start = (EPOCH // 90 + 1) * 90
    clock.set(start + 10)
    assert [codes(server.ask("w", [("slide", "s")]))[0] for _ in range(5)] == ["OK"] * 4 + [
        "OVER_LIMIT"
    ]
    clock.set(start + 90 + 45)
    assert [codes(server.ask("w", [("slide", "s")]))[0] for _ in range(3)] == [
        "OK",
        "OK",
        "OVER_LIMIT",
    ]
