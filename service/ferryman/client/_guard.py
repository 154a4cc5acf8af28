"""What keeps a client working while the service does not: a local fallback limiter and a
circuit breaker. Both read an injected clock, so tests step through outages without sleeping.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Mapping

import grpc

__all__ = [
    "CALL_KINDS",
    "Breaker",
    "BreakerOpenError",
    "FallbackLimiter",
    "FallbackRate",
    "is_outage",
]

#: The call kinds a fallback rate can be named for.
CALL_KINDS = ("should_rate_limit", "request_rate", "allow")

#: One rate for every call kind, or a rate per kind (a kind left out has no fallback).
FallbackRate = float | Mapping[str, float] | None

_OUTAGES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def is_outage(error: grpc.RpcError) -> bool:
    """Whether ``error`` says the service is out of reach (not that the request was bad)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code in _OUTAGES


class BreakerOpenError(grpc.RpcError):
    """The answer a call gets without being sent while the breaker is open."""

    def __init__(self, target: str, until: float) -> None:
        super().__init__(f"circuit breaker open for {target}")
        self._details = f"circuit breaker open: {target} failed repeatedly; probing again later"
        self.until = until

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class Breaker:
    """Stops calling a service after ``failures`` consecutive outages.

    Once open, calls are refused at once for a back-off (``backoff`` seconds, doubled at
    each failed probe up to ``max_backoff``); then one call at a time goes through as a
    probe, and the first that gets an answer closes the breaker. Thread-safe.
    """

    def __init__(
        self,
        failures: int,
        *,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        clock: Callable[[], float],
    ) -> None:
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
            raise ValueError(f"breaker_failures: expected an int >= 0, got {failures!r}")
        for name, value in (("breaker_backoff", backoff), ("breaker_max_backoff", max_backoff)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected seconds > 0, got {value!r}")
        self.failures = failures  # 0: never open
        self.backoff = float(backoff)
        self.max_backoff = max(float(max_backoff), self.backoff)
        self._clock = clock
        self._lock = threading.Lock()
        self._streak = 0
        self._delay = self.backoff
        self._until = -math.inf  # open until then; -inf: closed
        self._probing = False
        self.opened = 0  # times it opened (a failed probe opening it again included)
        self.short_circuited = 0

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._until > -math.inf

    def admit(self) -> float | None:
        """None to send the call; else the time until which the breaker stays open."""
        with self._lock:
            if self._until == -math.inf:
                return None
            if not self._probing and self._clock() >= self._until:
                self._probing = True  # this call is the probe; the others wait for it
                return None
            self.short_circuited += 1
            return self._until

    def record(self, outage: bool) -> None:
        """The outcome of a call that was sent: an outage, or any answer from the service."""
        with self._lock:
            probe, self._probing = self._probing, False
            if not outage:
                self._streak = 0
                self._until = -math.inf
                self._delay = self.backoff
                return
            self._streak += 1
            if probe:
                self._delay = min(self._delay * 2, self.max_backoff)
            elif self.failures == 0 or self._streak < self.failures or self._until > -math.inf:
                return
            self._until = self._clock() + self._delay
            self.opened += 1


class FallbackLimiter:
    """Token buckets in process, one per call kind and descriptor (or bucket), used while the
    service is out of reach: ``rate`` per second each, holding up to ``burst`` seconds of it
    (at least one token; a rate of 0 refuses everything)."""

    def __init__(
        self, rate: FallbackRate, *, burst: float = 1.0, clock: Callable[[], float]
    ) -> None:
        self._rates = _rates(rate)
        if not (isinstance(burst, int | float) and math.isfinite(burst) and burst > 0):
            raise ValueError(f"fallback_burst: expected seconds > 0, got {burst!r}")
        self._burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key: (tokens, at)

    def covers(self, kind: str) -> bool:
        return kind in self._rates

    def take(self, kind: str, key: Hashable, n: int) -> bool:
        """Take ``n`` tokens from the bucket of ``(kind, key)``; False (nothing taken) if short."""
        rate = self._rates[kind]
        size = max(1.0, rate * self._burst) if rate > 0 else 0.0  # 0: refuse everything
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get((kind, key), (size, now))
            tokens = min(size, tokens + max(0.0, now - at) * rate)
            ok = tokens >= n
            self._buckets[(kind, key)] = (tokens - n if ok else tokens, now)
            return ok


def _rates(rate: FallbackRate) -> dict[str, float]:
    if rate is None:
        return {}
    given = rate if isinstance(rate, Mapping) else dict.fromkeys(CALL_KINDS, rate)
    rates: dict[str, float] = {}
    for kind, value in given.items():
        if kind not in CALL_KINDS:
            raise ValueError(f"fallback_rate: unknown call kind {kind!r} ({', '.join(CALL_KINDS)})")
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0:
            raise ValueError(f"fallback_rate[{kind}]: expected a rate >= 0, got {value!r}")
        rates[kind] = float(value)
    return rates
