"""Wait for the store at start (REDIS_STARTUP_*): exponential backoff, then give up.

By default the service starts whether or not Redis answers (calls get the failure policy
until it does). With the reference's REDIS_STARTUP_* variables it waits first, as the
reference does: one probe per connection, then retries after ``initial``, doubling up to
``most`` (each delay drawn between ``initial`` and the current step), each retry logged;
after ``max_elapsed`` (0: never) it gives up with BackendError, which ends the start.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from ferryman.backends.base import Watched
from ferryman.errors import BackendError

__all__ = ["wait_until_up"]

log = logging.getLogger("ferryman")


async def wait_until_up(backend: Watched, initial: float, most: float, max_elapsed: float) -> None:
    """Return once every connection of ``backend`` is up; raise BackendError when
    ``max_elapsed`` seconds (0: no limit) pass first."""
    start = time.monotonic()
    step = initial
    attempt = 1
    while True:
        down = [c for c in backend.connections() if c.state == "down"]
        elapsed = time.monotonic() - start
        if not down:
            if attempt > 1:
                log.warning("redis answered after %d attempts (%.1fs)", attempt, elapsed)
            return
        reasons = "; ".join(f"{c.name}: {c.reason}" for c in down)
        if max_elapsed > 0 and elapsed >= max_elapsed:
            raise BackendError(
                f"gave up waiting for redis after {elapsed:.1f}s and {attempt} attempts "
                f"(REDIS_STARTUP_MAX_ELAPSED_TIME={max_elapsed:g}s): {reasons}"
            )
        delay = random.uniform(initial, step)
        if max_elapsed > 0:
            delay = min(delay, max_elapsed - elapsed)
        log.warning(
            "waiting for redis (attempt %d, %.1fs elapsed%s): %s; retrying in %.2fs",
            attempt,
            elapsed,
            f" of {max_elapsed:g}s" if max_elapsed > 0 else "",
            reasons,
            delay,
        )
        await asyncio.sleep(delay)
        step = min(most, step * 2)
        attempt += 1
        for connection in down:
            await connection.check()
