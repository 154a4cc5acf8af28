"""The retry schedule of Charon's reference client (paper, section 3.2)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

__all__ = ["RetrySchedule", "jitter"]


def jitter(value: float, draw: Callable[[], float]) -> float:
    """``value`` moved uniformly within [v - v/4, v + v/4); ``draw`` returns a float in [0, 1)."""
    return value - value / 4 + draw() * (value / 2)


class RetrySchedule:
    """How long to sleep after each rejection, within ``max_wait`` seconds from creation.

    After the i-th rejection (i from 0) the client sleeps ``min(max_wait - elapsed,
    jitter(2**i))`` and asks again; once that is <= 0 it gives up. The service's
    ``retry_after`` raises the sleep so that the client does not wake before a hit could be
    granted, but the sleep never reaches past ``max_wait``.
    """

    def __init__(
        self,
        max_wait: float,
        *,
        draw: Callable[[], float] = random.random,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_wait = max_wait
        self._draw = draw
        self._monotonic = monotonic
        self._start = monotonic()
        self._failures = 0

    @property
    def elapsed(self) -> float:
        return self._monotonic() - self._start

    def next_delay(self, retry_after: float | None = None) -> float | None:
        """The sleep before the next attempt, or None to give up."""
        backoff = jitter(2.0**self._failures, self._draw)
        self._failures += 1
        if retry_after is not None:
            backoff = max(backoff, retry_after)
        delay = min(self._max_wait - self.elapsed, backoff)
        return delay if delay > 0 else None
