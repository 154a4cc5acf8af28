"""The time by which the current call must be answered (the caller's gRPC deadline less a
margin for the answer to travel), carried from the edge down to the backend connection in
a context variable, so that no layer in between needs an argument for it.

Unset (None) when the caller sent no deadline: the backend's own timeout bounds the wait.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

__all__ = ["ANSWER_BY", "answer_by", "margin"]

#: ``time.monotonic()`` by which the current call must be answered, or None.
ANSWER_BY: ContextVar[float | None] = ContextVar("ferryman_answer_by", default=None)

# A remaining time above this is no deadline (gRPC reports "none" as a very large number).
_NO_DEADLINE = 1e6


def margin(remaining: float) -> float:
    """Time kept back from a deadline ``remaining`` seconds away for the answer to reach the
    caller: a tenth of it, at least 2 ms and at most 20 ms."""
    return min(0.02, max(0.002, remaining * 0.1))


def answer_by(remaining: float | None) -> float | None:
    """The monotonic time to answer by for a caller with ``remaining`` seconds left (None:
    no deadline)."""
    if remaining is None or remaining > _NO_DEADLINE:
        return None
    return time.monotonic() + remaining - margin(max(remaining, 0.0))
