"""The service's logs: the level and format from LOG_LEVEL and LOG_FORMAT, and a reporter
that keeps errors caused by clients down to one line per interval.

``LOG_FORMAT=json`` writes one JSON object per line with these fields:

- ``time``: RFC 3339 in UTC with milliseconds, ``2026-11-24T23:05:15.474Z``
- ``level``: ``debug``, ``info``, ``warning``, ``error`` or ``fatal`` (logrus's names)
- ``logger``: the component, ``ferryman``, ``ferryman.config``, ``ferryman.grpc``, ...
- ``message``: the same text as the text format's
- ``error``: the traceback, on the rare line that carries one

and, on the lines that have them, the structured fields a record was logged with
(``extra={"fields": {...}}``): a configuration load carries ``version`` and ``domains``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import IO

from ferryman.errors import SettingsError

__all__ = ["LEVELS", "JsonFormatter", "ThrottledLog", "parse_level", "setup"]

# The reference's LOG_LEVEL values (logrus), in any case.
LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "panic": logging.CRITICAL,
}
_NAMES = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "fatal",
}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_level(text: str, name: str = "LOG_LEVEL") -> int:
    """A logging level from the reference's names; raises SettingsError naming ``name``."""
    level = LEVELS.get(text.strip().lower())
    if level is None:
        raise SettingsError(f"{name}={text!r} is not a log level (use debug, info, warn or error)")
    return level


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the stable fields listed in the module docstring."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": _NAMES.get(record.levelno, record.levelname.lower()),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            for key, value in fields.items():
                entry.setdefault(str(key), value)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


_json = False


def setup(level: str, fmt: str, stream: IO[str] | None = None) -> None:
    """Send every log record to ``stream`` (stderr) at ``level``, as text or JSON."""
    global _json
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    _json = fmt == "json"
    handler.setFormatter(JsonFormatter() if _json else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(parse_level(level))


def json_enabled() -> bool:
    """Whether setup() chose JSON lines (so that fatal errors are written as one too)."""
    return _json


class ThrottledLog:
    """Logs a recurring problem at most once per ``interval`` seconds, with a count.

    The first occurrence is logged at once; later ones are counted, and the next one after
    the interval is logged with the number seen since the last line. Bad input sent by
    clients goes through here, so a flood of it costs a few lines, not one per request.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self._pending = 0
        self.total = 0

    def report(self, message: str, **fields: object) -> bool:
        """Count one occurrence; returns True when it was logged."""
        self.total += 1
        self._pending += 1
        now = self._clock()
        if self._last is not None and now - self._last < self.interval:
            return False
        count, self._pending, self._last = self._pending, 0, now
        self._log.warning(
            "%s (%d such since the last report; logged at most every %gs)",
            message,
            count,
            self.interval,
            extra={"fields": {**fields, "count": count}},
        )
        return True
