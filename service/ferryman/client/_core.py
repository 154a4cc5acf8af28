"""What the sync and async clients share: validation, policies and the retry flow, sans I/O.

Each operation is a generator that yields the I/O it needs (a call to send, a sleep) and
gets back the answer; ``Client`` drives it with blocking calls, ``AsyncClient`` with awaits.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, fields, replace
from typing import TypeVar

import grpc

from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2
from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.client import _protocol
from ferryman.client._backoff import RetrySchedule
from ferryman.client._models import (
    ClientStats,
    Code,
    DescriptorLike,
    DescriptorStatus,
    Entries,
    RateContext,
    RateLimitResult,
    RateResult,
    normalize_descriptor,
)
from ferryman.errors import RequestError, ServiceUnavailableError

__all__ = [
    "DEFAULT_TIMEOUT",
    "Answer",
    "ClientCore",
    "Flow",
    "Request",
    "Response",
    "Send",
    "Sleep",
]

log = logging.getLogger("ferryman.client")

_UINT32 = 2**32 - 1

#: Seconds each call to the service may take before the client gives up on it.
DEFAULT_TIMEOUT = 1.0


@dataclass(frozen=True)
class Send:
    """Send ``request`` to ``method``; the flow gets back the response or the RpcError."""

    method: str
    request: Request


@dataclass(frozen=True)
class Sleep:
    """Sleep ``seconds``; the flow gets back None."""

    seconds: float


T = TypeVar("T")

Request = rls_pb2.RateLimitRequest | limiter_pb2.RateRequest
Response = rls_pb2.RateLimitResponse | limiter_pb2.RateResponse
Answer = Response | grpc.RpcError | None
Flow = Generator[Send | Sleep, Answer, T]


def _count(value: int, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: expected an int, got {value!r}")
    if not low <= value <= _UINT32:
        raise RequestError(field, f"{value} is out of range [{low}, {_UINT32}]")
    return value


def _domain(domain: str) -> str:
    if not isinstance(domain, str):
        raise TypeError(f"domain: expected a str, got {domain!r}")
    if not domain:
        raise RequestError("domain", "must not be empty")
    return domain


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys((f.name for f in fields(ClientStats)), 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> ClientStats:
        with self._lock:
            return ClientStats(**self._counts)


class ClientCore:
    """Settings, counters and the operations as flows; no I/O."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float,
        fail_open: bool,
        kill_switch: bool,
        draw: Callable[[], float] = random.random,
    ) -> None:
        if not isinstance(target, str) or not target:
            raise ValueError(f"target: expected host:port, got {target!r}")
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
        self.target = target
        self.timeout = float(timeout)
        self.fail_open = fail_open
        self.kill_switch = kill_switch
        self._draw = draw
        self._counters = _Counters()

    def stats(self) -> ClientStats:
        """Counts of what this client did: calls, grants, rejections, retries, overrides..."""
        return self._counters.snapshot()

    # ShouldRateLimit: one call, no retries.

    def should_rate_limit_flow(
        self, domain: str, descriptors: Sequence[DescriptorLike], hits: int
    ) -> Flow[RateLimitResult]:
        domain = _domain(domain)
        _count(hits, "hits", 1)
        if isinstance(descriptors, str | bytes) or not isinstance(descriptors, Sequence):
            raise TypeError("descriptors: expected a sequence of descriptors")
        if descriptors and _looks_like_pair(descriptors[0]):
            raise TypeError(
                "descriptors: expected a sequence of descriptors, got one descriptor's pairs; "
                "wrap it in a list"
            )
        all_entries = [
            normalize_descriptor(d, f"descriptors[{i}]") for i, d in enumerate(descriptors)
        ]
        if not all_entries:
            raise RequestError("descriptors", "must have at least one descriptor")
        request = _protocol.rls_request(domain, all_entries, hits)
        self._counters.add("calls")
        answer = yield Send(_protocol.SHOULD_RATE_LIMIT, request)
        if isinstance(answer, grpc.RpcError):
            self._fail(answer, f"ShouldRateLimit {domain}")
            self._counters.add("degraded")
            return RateLimitResult(
                code=Code.OK,
                statuses=tuple(DescriptorStatus(Code.OK, None, 0, None) for _ in all_entries),
                degraded=True,
            )
        assert isinstance(answer, rls_pb2.RateLimitResponse)
        result = _protocol.rls_result(answer)
        if result.code is Code.OVER_LIMIT:
            if self.kill_switch:
                self._counters.add("overridden")
                log.warning(
                    "kill switch: OVER_LIMIT for %s %s overridden to OK",
                    domain,
                    " | ".join(_shown(e) for e in all_entries),
                )
                return replace(result, code=Code.OK, overridden=True)
            self._counters.add("rejected")
        else:
            self._counters.add("granted")
        return result

    # Limiter/Request: retried with backoff within max_wait.

    def request_rate_flow(
        self,
        domain: str,
        descriptor: DescriptorLike,
        copies: int,
        min_copies: int | None,
        max_wait: float,
    ) -> Flow[RateResult]:
        domain = _domain(domain)
        entries = normalize_descriptor(descriptor)
        copies = _count(copies, "copies", 1)
        least = copies if min_copies is None else _count(min_copies, "min_copies", 1)
        if least > copies:
            raise RequestError("min_copies", f"{least} is more than copies ({copies})")
        if not (isinstance(max_wait, int | float) and math.isfinite(max_wait) and max_wait >= 0):
            raise RequestError("max_wait", f"expected seconds >= 0, got {max_wait!r}")
        request = _protocol.rate_request(domain, entries, copies, least)
        schedule = RetrySchedule(max_wait, draw=self._draw)
        attempts = 0
        context: RateContext | None = None
        while True:
            attempts += 1
            self._counters.add("calls")
            answer = yield Send(_protocol.LIMITER_REQUEST, request)
            if isinstance(answer, grpc.RpcError):
                self._fail(answer, f"Request {domain} {_shown(entries)}")
                self._counters.add("degraded")
                return RateResult(
                    success=True,
                    copies=least,
                    waited=schedule.elapsed,
                    attempts=attempts,
                    degraded=True,
                    context=context,
                )
            assert isinstance(answer, limiter_pb2.RateResponse)
            context = _protocol.rate_context(answer)
            if context.granted > 0:
                self._counters.add("granted")
                return RateResult(
                    True, context.granted, schedule.elapsed, attempts, context=context
                )
            if self.kill_switch:
                self._counters.add("overridden")
                log.warning(
                    "kill switch: rejection of %d copies of %s %s overridden, %d granted",
                    copies,
                    domain,
                    _shown(entries),
                    least,
                )
                return RateResult(
                    True, least, schedule.elapsed, attempts, overridden=True, context=context
                )
            delay = schedule.next_delay(context.retry_after)
            if delay is None:
                self._counters.add("rejected")
                return RateResult(False, 0, schedule.elapsed, attempts, context=context)
            self._counters.add("retries")
            yield Sleep(delay)

    def _fail(self, error: grpc.RpcError, what: str) -> None:
        """Raise for a client error or when failing closed; log the degraded answer otherwise."""
        translated = _protocol.translate(error, self.target)
        if isinstance(translated, RequestError) or not self.fail_open:
            self._counters.add("errors")
            raise translated from error
        assert isinstance(translated, ServiceUnavailableError)
        log.warning(
            "ferryman at %s failed (%s: %s); degraded mode, granting %s",
            self.target,
            translated.code,
            translated.details,
            what,
        )


def _looks_like_pair(item: object) -> bool:
    return (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    )


def _shown(entries: Entries) -> str:
    return ",".join(f"{k}={v}" for k, v in entries)
