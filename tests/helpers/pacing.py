"""Sending at a steady rate from a test's load thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator


def paced(rate: float, stop: threading.Event) -> Iterator[int]:
    """Yields ``rate`` times a second until ``stop`` is set, each time the wall-clock second
    the send falls in. A late send does not bring a burst of catch-up sends after it."""
    next_at = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if next_at > now:
            time.sleep(next_at - now)
        next_at = max(next_at, time.monotonic() - 0.1) + 1 / rate
        yield int(time.time())
