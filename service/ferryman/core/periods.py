"""How long a window lasts and where it starts: a unit of the reference (``unit: minute``),
a window of any length (``window: 30s``), or a calendar period in a time zone
(``calendar: {unit: month, time_zone: Europe/Berlin}``).

Every window kind (fixed windows, sliding windows, cost budgets) reads its period here, so
that the three forms are written once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from yaml.nodes import MappingNode, Node, ScalarNode

from ferryman.core.answers import unit_for
from ferryman.core.nodes import Ctx, duration, is_null, join, mapping, string
from ferryman.core.rules import Unit

__all__ = [
    "CALENDAR_UNITS",
    "Calendar",
    "Period",
    "Span",
    "UnitPeriod",
    "read_period",
]

_UNITS = "second, minute, hour, day, week, month or year"
CALENDAR_UNITS = (Unit.DAY, Unit.WEEK, Unit.MONTH, Unit.YEAR)
# The average lengths of the calendar's long periods, for a calendar window's sustained rate.
_AVERAGE = {Unit.MONTH: 365.2425 * 86400 / 12, Unit.YEAR: 365.2425 * 86400}
# Windows shorter than this are refused: the counter keys and their expiry work in
# milliseconds.
MIN_WINDOW = 0.001
MAX_WINDOW = 366 * 86400.0


class Period(Protocol):
    """Where the window that contains a moment starts and ends."""

    @property
    def unit(self) -> Unit:
        """The unit Envoy is told: the smallest one not shorter than the window."""
        ...

    @property
    def seconds(self) -> float:
        """The window's length (a calendar's average one), for the sustained rate."""
        ...

    @property
    def exact(self) -> bool:
        """Whether ``unit`` is the window itself (otherwise the headers say ``w=``)."""
        ...

    def window(self, now: float) -> tuple[str, float, float]:
        """The window ``now`` falls in: its counter key's suffix, its start and its end."""
        ...

    def reset_after(self, now: float) -> int:
        """Whole seconds until the window containing ``now`` ends, rounded up."""
        ...

    def describe(self) -> dict[str, Any]:
        """The period as the YAML says it, for explain and the console."""
        ...

    def text(self) -> str:
        """The period in words after "per": "minute", "30s", "calendar month (Europe/Berlin)"."""
        ...


@dataclass(frozen=True, slots=True)
class UnitPeriod:
    """One of the reference's units: windows of whole seconds aligned to the epoch (a
    "month" is 30 days), keys as the reference writes them."""

    unit: Unit
    exact = True

    @property
    def seconds(self) -> float:
        return float(self.unit.seconds)

    def window(self, now: float) -> tuple[str, float, float]:
        seconds = self.unit.seconds
        start = int(now // seconds) * seconds
        return str(start), start, start + seconds

    def reset_after(self, now: float) -> int:
        seconds = self.unit.seconds
        return seconds - int(now) % seconds

    def describe(self) -> dict[str, Any]:
        return {"unit": self.unit.name.lower()}

    def text(self) -> str:
        return self.unit.name.lower()


@dataclass(frozen=True, slots=True)
class Span:
    """A window of any length, aligned to the epoch (its start is the epoch time rounded
    down to the length). Keys name the start in seconds, or in milliseconds (``…ms``) for a
    length that is not a whole number of seconds."""

    seconds: float
    exact = False

    @property
    def unit(self) -> Unit:
        return unit_for(self.seconds)

    def window(self, now: float) -> tuple[str, float, float]:
        length = self.seconds
        if length.is_integer():
            whole = int(length)
            start = int(now // whole) * whole
            return str(start), start, start + whole
        millis = round(length * 1000)
        start_ms = int(now * 1000 // millis) * millis
        return f"{start_ms}ms", start_ms / 1000, (start_ms + millis) / 1000

    def reset_after(self, now: float) -> int:
        return max(1, math.ceil(self.window(now)[2] - now))

    def describe(self) -> dict[str, Any]:
        return {"window": _length(self.seconds)}

    def text(self) -> str:
        return _length(self.seconds)


@dataclass(frozen=True)
class Calendar:
    """A calendar period in a time zone: it starts at local midnight (a day), on Monday (a
    week), on the first of the month or on the 1st of January, whatever the length of the
    day in between (23 or 25 hours across a daylight-saving change)."""

    unit: Unit
    zone: str
    exact = True
    _tz: ZoneInfo = field(init=False, repr=False, compare=False)
    # The last window worked out (start, end, key): most requests fall in the same one.
    _last: list[tuple[float, float, str]] = field(
        init=False, repr=False, compare=False, default_factory=list
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tz", ZoneInfo(self.zone))

    @property
    def seconds(self) -> float:
        return _AVERAGE.get(self.unit, float(self.unit.seconds))

    def window(self, now: float) -> tuple[str, float, float]:
        last = self._last
        if last and last[0][0] <= now < last[0][1]:
            start, end, key = last[0]
            return key, start, end
        start, end = self.bounds(now)
        key = str(int(start))
        self._last[:] = [(start, end, key)]
        return key, start, end

    def bounds(self, now: float) -> tuple[float, float]:
        """The start and end (epoch seconds) of the period containing ``now``."""
        # Whole seconds: periods start on whole seconds, and a time a hair before one would
        # be rounded up to it (fromtimestamp rounds to the microsecond).
        local = datetime.fromtimestamp(math.floor(now), self._tz)
        day = local.date()
        if self.unit is Unit.DAY:
            first, after = day, day + timedelta(days=1)
        elif self.unit is Unit.WEEK:
            first = day - timedelta(days=day.weekday())
            after = first + timedelta(days=7)
        elif self.unit is Unit.MONTH:
            first = day.replace(day=1)
            after = (first + timedelta(days=32)).replace(day=1)
        else:
            first = day.replace(month=1, day=1)
            after = first.replace(year=first.year + 1)
        return self._midnight(first), self._midnight(after)

    def _midnight(self, day: Any) -> float:
        return datetime(day.year, day.month, day.day, tzinfo=self._tz).timestamp()

    def reset_after(self, now: float) -> int:
        return max(1, math.ceil(self.window(now)[2] - now))

    def describe(self) -> dict[str, Any]:
        return {"calendar": {"unit": self.unit.name.lower(), "time_zone": self.zone}}

    def text(self) -> str:
        return f"calendar {self.unit.name.lower()} ({self.zone})"


def _length(seconds: float) -> str:
    """A length as the YAML would say it: 500ms, 30s, 15m, 6h, 2d."""
    for suffix, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds // size)}{suffix}"
    return f"{seconds * 1000:g}ms"


_FORMS = ("unit", "window", "calendar")


def read_period(
    ctx: Ctx, node: Node, own: Mapping[str, Node], path: str, *, calendar: bool = True
) -> UnitPeriod | Span | Calendar | None:
    """The period of a window kind's map ``own`` (``node``, at ``path``): exactly one of
    ``unit``, ``window`` or ``calendar`` (``calendar`` only where the kind allows it).
    Problems are reported into ``ctx``; None when there is none to read."""
    # An empty value is a missing one, as the reference reads ``unit: ''``.
    given = [k for k in _FORMS if k in own and not _blank(own[k])]
    if not calendar and "calendar" in own:
        message = "a sliding window has no calendar: use 'unit' or 'window'"
        ctx.error(own["calendar"], join(path, "calendar"), message)
        return None
    if len(given) > 1:
        names = " and ".join(f"'{k}'" for k in given)
        ctx.error(node, path, f"{names} cannot be given together: choose one")
        return None
    if not given:
        forms = "'unit' (" + _UNITS + "), 'window' (a duration such as 30s)"
        forms += ", or 'calendar'" if calendar else ""
        ctx.error(node, path, f"missing {forms}")
        return None
    if given[0] == "unit":
        return _read_unit(ctx, own["unit"], join(path, "unit"))
    if given[0] == "window":
        return _read_span(ctx, own["window"], join(path, "window"))
    return _read_calendar(ctx, own["calendar"], join(path, "calendar"))


def _blank(node: Node) -> bool:
    return isinstance(node, ScalarNode) and (node.value == "" or is_null(node))


def _read_unit(ctx: Ctx, node: Node, path: str) -> UnitPeriod | None:
    text = string(ctx, node, path)
    try:
        return UnitPeriod(Unit[text.upper()])
    except KeyError:
        ctx.error(node, path, f"invalid unit {text!r} ({_UNITS})")
        return None


def _read_span(ctx: Ctx, node: Node, path: str) -> Span | None:
    seconds = duration(ctx, node, path)
    if seconds is None:
        return None
    if not MIN_WINDOW <= seconds <= MAX_WINDOW:
        ctx.error(node, path, "a window is from 1ms to 366 days long")
        return None
    if abs(seconds * 1000 - round(seconds * 1000)) > 1e-6:
        ctx.error(node, path, "a window is a whole number of milliseconds")
        return None
    return Span(seconds)


def _read_calendar(ctx: Ctx, node: Node, path: str) -> Calendar | None:
    own = mapping(ctx, node, path, frozenset({"unit", "time_zone"}))
    if not isinstance(node, MappingNode):
        return None
    text = string(ctx, own.get("unit"), join(path, "unit"))
    units = {u.name.lower(): u for u in CALENDAR_UNITS}
    if text not in units:
        where = own.get("unit", node)
        message = f"a calendar unit is day, week, month or year, not {text!r}"
        ctx.error(where, join(path, "unit"), message)
        return None
    zone = string(ctx, own.get("time_zone"), join(path, "time_zone")) or "UTC"
    try:
        return Calendar(units[text], zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        where = own.get("time_zone", node)
        message = f"unknown time zone {zone!r} (an IANA name such as Europe/Berlin)"
        ctx.error(where, join(path, "time_zone"), message)
        return None
