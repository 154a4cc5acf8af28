"""What the tests share besides fixtures: plain modules, no tests and no fixtures.

The fixtures themselves live in ``tests/conftest.py``; test modules import helpers from here
and never from each other or from ``conftest``.
"""

from __future__ import annotations

from typing import Any

from ferryman.algorithms.fixed_window.spec import FixedWindow


def rate_of(rule: Any) -> Any:
    """A rule's fixed-window limit (``rate_limit``) as its RateLimit, or None."""
    limit = rule.limit if rule is not None else None
    return limit.rate if isinstance(limit, FixedWindow) else None
