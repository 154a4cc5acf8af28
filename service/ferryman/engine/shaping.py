"""Shaping: ShouldRateLimit answers held on the server until the turn their hits were booked
for (a node's ``max_wait``), and what /status tells of them.

The engine books the turn in the decision itself (the kind's store call, one atomic script
or one in-process step, moves the tenant's state as for a hit that passes, so that a later
arrival waits behind it) and says how long in ``Decision.wait``; the API that can hold its
answer awaits :meth:`Waits.hold` with it. A held answer is a sleeping coroutine: no timer
per waiter per tick, nothing polled.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left

__all__ = ["WAIT_BUCKETS", "Waits"]

#: The upper bounds (seconds) of the waits /status counts; longer ones fall in a last bucket.
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Waits:
    """The answers held until their turn: how many are held now, how many were held (and
    for how long in all, the longest, how many up to each of ``WAIT_BUCKETS``), and how
    many callers left before theirs came (their booked hits stay booked)."""

    def __init__(self) -> None:
        self.holding = 0
        self.held = 0
        self.left = 0
        self.seconds = 0.0
        self.longest = 0.0
        self.counts = [0] * (len(WAIT_BUCKETS) + 1)

    async def hold(self, seconds: float) -> None:
        """Sleep ``seconds`` (the answer's turn), counted."""
        self.holding += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.left += 1
            raise
        finally:
            self.holding -= 1
        self.held += 1
        self.seconds += seconds
        self.longest = max(self.longest, seconds)
        self.counts[bisect_left(WAIT_BUCKETS, seconds)] += 1

    def status(self) -> dict[str, object]:
        """/status's view."""
        bounds = [f"le_{b:g}s" for b in WAIT_BUCKETS] + ["longer"]
        return {
            "holding": self.holding,
            "held": self.held,
            "left": self.left,
            "seconds_waited": round(self.seconds, 3),
            "mean_wait": round(self.seconds / self.held, 4) if self.held else None,
            "longest_wait": round(self.longest, 4),
            "waits": dict(zip(bounds, self.counts, strict=True)),
        }
