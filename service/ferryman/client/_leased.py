"""``RateLimiter`` and ``Gauge``: local limits sized by a capacity lease.

Neither calls the service per use: they read the resource's current capacity, which the
client's refresher keeps up to date, and decide in process.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from types import TracebackType

from ferryman.client._capacity import CapacityResource

__all__ = ["Gauge", "RateLimiter"]

_IDLE_POLL = 0.05  # seconds between looks at a capacity of 0


class RateLimiter:
    """At most ``resource.capacity`` permits per second, spaced evenly.

    Unused time is saved as permits up to ``burst`` seconds of capacity (at most one second:
    never a burst above one second's capacity); the spacing follows the lease whenever its
    capacity changes. ``wait()`` blocks until the next permit, ``try_acquire()`` takes one
    only if it is due now.
    """

    def __init__(
        self,
        resource: CapacityResource,
        *,
        burst: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not 0 <= burst <= 1:
            raise ValueError(f"burst must be between 0 and 1 second, not {burst!r}")
        self.resource = resource
        self.burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        self._next = clock()  # when the next permit is free
        self._stored = 0.0
        self.permits = 0

    @property
    def rate(self) -> float:
        """Permits per second now: the resource's capacity."""
        return self.resource.capacity

    def _reserve(self, now: float, only_if_due: bool) -> float | None:
        """Take a permit; the seconds to wait before using it (None: none to take now)."""
        rate = self.rate
        if rate <= 0:
            self._next, self._stored = now, 0.0
            return None
        if math.isinf(rate):
            self.permits += 1
            return 0.0
        with self._lock:
            if now > self._next:
                self._stored = min(rate * self.burst, self._stored + (now - self._next) * rate)
                self._next = now
            self._stored = min(self._stored, rate * self.burst)
            wait = self._next - now
            if only_if_due and wait > 0:
                return None
            taken = min(1.0, self._stored)
            self._stored -= taken
            self._next += (1.0 - taken) / rate
            self.permits += 1
            return max(0.0, wait)

    def try_acquire(self) -> bool:
        """Take a permit if one is due now."""
        return self._reserve(self._clock(), only_if_due=True) is not None

    def wait(self) -> float:
        """Block until the next permit; the seconds waited."""
        start = self._clock()
        while True:
            wait = self._reserve(self._clock(), only_if_due=False)
            if wait is not None:
                if wait > 0:
                    time.sleep(wait)
                return self._clock() - start
            time.sleep(_IDLE_POLL)

    async def wait_async(self) -> float:
        """``wait()`` without blocking the event loop."""
        start = self._clock()
        while True:
            wait = self._reserve(self._clock(), only_if_due=False)
            if wait is not None:
                if wait > 0:
                    await asyncio.sleep(wait)
                return self._clock() - start
            await asyncio.sleep(_IDLE_POLL)


class Gauge:
    """At most ``resource.capacity`` uses in flight: ``with gauge:`` (or ``async with``)
    waits for a free slot and gives it back on exit. A smaller lease lets the uses in
    flight finish; new ones wait until they fit."""

    def __init__(self, resource: CapacityResource):
        self.resource = resource
        self.in_flight = 0
        self._cond = threading.Condition()

    def _try_enter(self) -> bool:
        with self._cond:
            if self.in_flight < self.resource.capacity:
                self.in_flight += 1
                return True
            return False

    def _exit(self) -> None:
        with self._cond:
            self.in_flight -= 1
            self._cond.notify()

    def __enter__(self) -> Gauge:
        with self._cond:
            # Re-read the capacity now and then: a lease can grow without anyone leaving.
            while not self.in_flight < self.resource.capacity:
                self._cond.wait(_IDLE_POLL)
            self.in_flight += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()

    async def __aenter__(self) -> Gauge:
        # Polled, not an Event: a lease can grow without anyone leaving.
        while not self._try_enter():  # noqa: ASYNC110
            await asyncio.sleep(_IDLE_POLL / 5)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()
