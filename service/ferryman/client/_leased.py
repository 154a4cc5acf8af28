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
_SMOOTHING = 0.5  # weight of the last whole second in the learned demand
_HEADROOM = 1.1  # asked above the demand seen, so that a growing demand shows
_CHANGE = 0.1  # a learned demand this far from the one asked is asked at once


class _Demand:
    """How often a limiter is asked, per whole second of its clock, smoothed: the demand
    a resource opened without ``wants`` asks for. A second in which callers had to wait
    (the lease was too small to tell the demand) asks for twice as much as it got."""

    def __init__(self, second: int) -> None:
        self.second = second
        self.seen = 0
        self.short = False  # a caller waited or was refused this second
        self.demand = 0.0

    def count(self, now: float, short: bool) -> float | None:
        """Count one call at ``now``; the wants to ask for when a second has ended."""
        second = math.floor(now)
        wants = None
        if second != self.second:
            idle = second - self.second - 1
            seen = float(self.seen)
            self.demand = (
                seen if self.demand == 0 else ((1 - _SMOOTHING) * self.demand + _SMOOTHING * seen)
            )
            if idle > 0:
                self.demand *= (1 - _SMOOTHING) ** min(idle, 64)
            wants = self.demand * _HEADROOM
            if self.short:
                wants = max(wants, 2 * max(seen, 1.0))
            self.second, self.seen, self.short = second, 0, False
        self.seen += 1
        self.short = self.short or short
        return wants


class RateLimiter:
    """At most ``resource.capacity`` permits per second, spaced evenly.

    Unused time is saved as permits up to ``burst`` seconds of capacity (at most one second:
    never a burst above one second's capacity); the spacing follows the lease whenever its
    capacity changes. ``wait()`` blocks until the next permit, ``try_acquire()`` takes one
    only if it is due now. On a resource opened without ``wants`` the limiter asks for what
    it is asked: the calls per second, smoothed, with 10% headroom (twice what it got in a
    second when callers had to wait), at once when that moves by more than 10%.
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
        # A resource opened without wants asks for what this limiter is asked.
        self._demand = _Demand(math.floor(self._next)) if resource.learned else None

    @property
    def rate(self) -> float:
        """Permits per second now: the resource's capacity."""
        return self.resource.capacity

    def _learn(self, now: float, short: bool) -> None:
        if self._demand is None:
            return
        with self._lock:
            wants = self._demand.count(now, short)
        if wants is not None:
            asked = self.resource.wants
            changed = abs(wants - asked) > _CHANGE * max(asked, 1.0)
            self.resource.ask(wants, now=changed)

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

    def _short(self, now: float) -> bool:
        """Whether a permit asked for at ``now`` would have to wait."""
        with self._lock:
            return self.rate <= 0 or (now < self._next and self._stored < 1.0)

    def try_acquire(self) -> bool:
        """Take a permit if one is due now."""
        now = self._clock()
        got = self._reserve(now, only_if_due=True) is not None
        self._learn(now, short=not got)
        return got

    def wait(self) -> float:
        """Block until the next permit; the seconds waited."""
        start = self._clock()
        self._learn(start, short=self._short(start))
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
        self._learn(start, short=self._short(start))
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
