"""One duration syntax for configuration files and environment variables.

``500ms``, ``1.5s``, ``5m``, ``1h``, ``1d`` (and Go's ``ns``/``us``), or a bare number of
seconds. Go-style compound durations (``1h30m``) are accepted too, as the reference's
settings are parsed by Go's ``time.ParseDuration``.
"""

from __future__ import annotations

import re

__all__ = ["parse_duration"]

_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h|d)?")
_SCALE = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    None: 1.0,
}


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises ValueError for anything else (negative included)."""
    raw = text.strip()
    if not raw:
        raise ValueError("empty duration")
    total = 0.0
    pos = 0
    parts = 0
    while pos < len(raw):
        match = _PART.match(raw, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"{text!r} is not a duration")
        if match.group(2) is None and (parts or match.end() != len(raw)):
            raise ValueError(f"{text!r} is not a duration")
        total += float(match.group(1)) * _SCALE[match.group(2)]
        pos = match.end()
        parts += 1
    return total
