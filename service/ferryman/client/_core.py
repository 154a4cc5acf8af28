"""What the sync and async clients share: validation, policies and the retry flow, sans I/O.

Each operation is a generator that yields the I/O it needs (a call to send, a sleep, the
client's session) and gets back the answer; ``Client`` drives it with blocking calls,
``AsyncClient`` with awaits. Holds are ``HoldState`` objects that the flows update in place;
the drivers wrap them in ``Hold`` / ``AsyncHold``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Literal, TypeVar

import grpc
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.client import _protocol
from ferryman.client._backoff import RetrySchedule
from ferryman.client._guard import (
    CALL_KINDS,
    Breaker,
    BreakerOpenError,
    FallbackLimiter,
    FallbackRate,
    is_outage,
)
from ferryman.client._models import (
    AllowResult,
    ClientStats,
    Code,
    DescriptorLike,
    DescriptorStatus,
    Entries,
    MultiHold,
    RateContext,
    RateLimitResult,
    RateResult,
    ReserveContext,
    Resource,
    normalize_descriptor,
)
from ferryman.errors import (
    FerrymanError,
    HoldError,
    RequestError,
    ServiceUnavailableError,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "Answer",
    "ClientCore",
    "Flow",
    "Granted",
    "HoldState",
    "OpenSession",
    "Request",
    "Response",
    "Send",
    "SessionFailure",
    "SessionRef",
    "Sleep",
]

log = logging.getLogger("ferryman.client")

_UINT32 = 2**32 - 1
_NAME = re.compile(r"[a-zA-Z0-9_]+")

#: The call kinds a fallback rate is named for (``fallback_rate={"allow": 100}``).
KIND_RLS, KIND_RATE, KIND_ALLOW = CALL_KINDS

#: Seconds each call to the service may take before the client gives up on it.
DEFAULT_TIMEOUT = 1.0


#: A transfer id that never reached the service: copies granted locally (degraded or by the
#: kill switch) passed on to another process, which seizes them locally too.
LOCAL_TRANSFER = "ferryman-local:"


class SessionRef:
    """A Session stream as the flows see it: its id, and whether (and why) it has ended.

    The driver that owns the stream ends the ref when the stream ends; a flow ends it when
    the service says it no longer knows the session. Once ended, a ref stays ended.
    """

    def __init__(self, session_id: str = "") -> None:
        self.id = session_id
        self.reason = ""
        self._ended = threading.Event()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def end(self, reason: str) -> bool:
        """End the ref; True for the call that ended it."""
        with _END_LOCK:
            if self._ended.is_set():
                return False
            self.reason = reason
            self._ended.set()
            return True


_END_LOCK = threading.Lock()


class SessionFailure(grpc.RpcError):
    """A session that could not be opened (no answer in time, the stream ended at once)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass(frozen=True)
class Send:
    """Send ``request`` to ``method``; the flow gets back the response or the RpcError.

    With a ``session``, the call carries its id in the ``ferryman-session`` metadata;
    ``timeout`` (seconds) replaces the client's own for a call that may wait on the service.
    """

    method: str
    request: Request
    session: SessionRef | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Sleep:
    """Sleep ``seconds``; the flow gets back None."""

    seconds: float


@dataclass(frozen=True)
class OpenSession:
    """The client's open session (opened now if there is none, or it ended).

    The flow gets back its SessionRef, or the RpcError that kept it from opening.
    """


T = TypeVar("T")

Request = (
    rls_pb2.RateLimitRequest
    | limiter_pb2.RateRequest
    | limiter_pb2.ReserveRequest
    | limiter_pb2.ReleaseRequest
    | limiter_pb2.TransferRequest
    | limiter_pb2.SeizeRequest
    | quota_service_pb2.AllowRequest
)
Response = (
    rls_pb2.RateLimitResponse
    | limiter_pb2.RateResponse
    | limiter_pb2.ReserveResponse
    | limiter_pb2.ReleaseResponse
    | limiter_pb2.TransferResponse
    | limiter_pb2.SeizeResponse
    | quota_service_pb2.AllowResponse
)
Answer = Response | SessionRef | grpc.RpcError | None
Flow = Generator[Send | Sleep | OpenSession, Answer, T]


class HoldState:
    """A hold as the flows keep it; ``Hold`` and ``AsyncHold`` show it to the caller.

    ``session`` is the session the copies are held by on the service; None when nothing is
    held there (a rejection, a degraded or overridden grant). ``copies`` counts what the
    caller still has; a release or transfer takes them off before its call and puts them
    back if the call changed nothing.
    """

    def __init__(
        self,
        *,
        domain: str,
        entries: Entries,
        success: bool,
        copies: int,
        waited: float,
        attempts: int,
        groups: tuple[str, ...] = (),
        degraded: bool = False,
        overridden: bool = False,
        context: ReserveContext | None = None,
        session: SessionRef | None = None,
    ) -> None:
        self.domain = domain
        self.entries = entries
        self.success = success
        self.copies = copies
        self.waited = waited
        self.attempts = attempts
        self.groups = groups
        self.degraded = degraded
        self.overridden = overridden
        self.context = context
        self.session = session
        self.lost_copies = False

    @property
    def lost(self) -> bool:
        """Whether the session holding these copies ended while the caller still had them."""
        if self.lost_copies:
            return True
        return self.session is not None and self.session.ended and self.copies > 0

    def describe(self) -> str:
        return f"{self.domain} {_shown(self.entries)}"


def _count(value: int, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: expected an int, got {value!r}")
    if not low <= value <= _UINT32:
        raise RequestError(field, f"{value} is out of range [{low}, {_UINT32}]")
    return value


def _seconds(value: float, field: str, *, positive: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        wanted = "seconds > 0" if positive else "seconds >= 0"
        raise RequestError(field, f"expected {wanted}, got {value!r}")
    return float(value)


def _copies(
    domain: str, descriptor: DescriptorLike, copies: int, min_copies: int | None
) -> tuple[str, Entries, int, int]:
    """A request for copies, checked: its domain, entries, copies and the fewest accepted."""
    entries = normalize_descriptor(descriptor)
    copies, least = _least(copies, min_copies)
    return _domain(domain), entries, copies, least


def _least(copies: int, min_copies: int | None) -> tuple[int, int]:
    """The copies asked for and the fewest accepted, checked."""
    copies = _count(copies, "copies", 1)
    least = copies if min_copies is None else _count(min_copies, "min_copies", 1)
    if least > copies:
        raise RequestError("min_copies", f"{least} is more than copies ({copies})")
    return copies, least


def _rate_limited(resources: Sequence[Resource]) -> Resource | None:
    """Check the resources of a multi-resource hold; the rate-limited one, if any."""
    if isinstance(resources, str | bytes) or not isinstance(resources, Sequence):
        raise TypeError("resources: expected a sequence of ferryman.Resource")
    for i, r in enumerate(resources):
        if not isinstance(r, Resource):
            raise TypeError(f"resources[{i}]: expected a ferryman.Resource, got {r!r}")
    if not resources:
        raise ValueError("resources: expected at least one resource")
    rated = [r for r in resources if r.rate_limited]
    if len(rated) > 1:
        raise ValueError(
            f"resources: at most one may be rate-limited (hits cannot be given back), "
            f"got {len(rated)}"
        )
    return rated[0] if rated else None


def _session_gone(error: grpc.RpcError) -> bool:
    """The service does not know the session (it ended there, or this is another server)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code is grpc.StatusCode.FAILED_PRECONDITION


def _local_transfer_id(hold: HoldState, copies: int, degraded: bool) -> str:
    payload = [hold.domain, [list(e) for e in hold.entries], copies, degraded, hold.overridden]
    text = json.dumps(payload, separators=(",", ":")).encode()
    return LOCAL_TRANSFER + base64.urlsafe_b64encode(text).decode().rstrip("=")


def _parse_local_transfer_id(transfer_id: str) -> tuple[str, Entries, int, bool, bool]:
    try:
        raw = transfer_id[len(LOCAL_TRANSFER) :]
        domain, entries, copies, degraded, overridden = json.loads(
            base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        )
        parsed = tuple((str(k), str(v)) for k, v in entries)
        if not isinstance(copies, int) or copies < 1:
            raise ValueError(copies)
        return str(domain), parsed, copies, bool(degraded), bool(overridden)
    except (ValueError, TypeError, binascii.Error):
        raise RequestError("transfer_id", "malformed local transfer id") from None


def _domain(domain: str) -> str:
    if not isinstance(domain, str):
        raise TypeError(f"domain: expected a str, got {domain!r}")
    if not domain:
        raise RequestError("domain", "must not be empty")
    return domain


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        computed = ("short_circuited", "breaker_opened", "breaker_open")  # the breaker's
        self._counts = {f.name: 0 for f in fields(ClientStats) if f.name not in computed}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self, breaker: Breaker) -> ClientStats:
        with self._lock:
            counts = dict(self._counts)
        return ClientStats(
            **counts,
            short_circuited=breaker.short_circuited,
            breaker_opened=breaker.opened,
            breaker_open=breaker.is_open,
        )


#: How an outage was answered: by the fallback limiter (granted or refused), by the kill
#: switch (a fallback refusal turned into a grant), or as a degraded grant.
Outage = Literal["degraded", "fallback", "refused", "overridden"]


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
        fallback_rate: FallbackRate = None,
        fallback_burst: float = 1.0,
        breaker_failures: int = 5,
        breaker_backoff: float = 1.0,
        breaker_max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(target, str) or not target:
            raise ValueError(f"target: expected host:port, got {target!r}")
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
        self.target = target
        self.timeout = float(timeout)
        # Whether the service waits in its queue for held copies (max_wait): None until a
        # reservation that could wait tells; an older service answers at once.
        self.queues: bool | None = None
        self.fail_open = fail_open
        self.kill_switch = kill_switch
        self._draw = draw
        self._counters = _Counters()
        self.fallback = FallbackLimiter(fallback_rate, burst=fallback_burst, clock=clock)
        self.breaker = Breaker(
            breaker_failures, backoff=breaker_backoff, max_backoff=breaker_max_backoff, clock=clock
        )

    def stats(self) -> ClientStats:
        """Counts of what this client did: calls, grants, rejections, retries, overrides..."""
        return self._counters.snapshot(self.breaker)

    # The circuit breaker, asked by the drivers around every call they send.

    def admit(self, *, call: bool = True) -> grpc.RpcError | None:
        """None to send the call (counted when ``call``); else the error that answers it."""
        until = self.breaker.admit()
        if until is not None:
            return BreakerOpenError(self.target, until)
        if call:
            self._counters.add("calls")
        return None

    def record(self, answer: Answer) -> None:
        """What became of a call that was sent (or of a session's opening)."""
        self.breaker.record(isinstance(answer, grpc.RpcError) and is_outage(answer))

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
        answer = yield Send(_protocol.SHOULD_RATE_LIMIT, request)
        if isinstance(answer, grpc.RpcError):
            return self._rls_outage(answer, domain, all_entries, hits)
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

    def _rls_outage(
        self, error: grpc.RpcError, domain: str, all_entries: list[Entries], hits: int
    ) -> RateLimitResult:
        """ShouldRateLimit without the service: each descriptor's fallback bucket, or OK."""
        oks: list[bool] = []

        def take() -> int | None:
            # Every descriptor is charged, as the service charges each one it answers.
            oks.extend(self.fallback.take(KIND_RLS, (domain, e), hits) for e in all_entries)
            return hits if all(oks) else None

        answered = self._fail(error, f"ShouldRateLimit {domain}", KIND_RLS, take)
        if answered.how == "refused":
            statuses = tuple(
                DescriptorStatus(Code.OK if ok else Code.OVER_LIMIT, None, 0, None) for ok in oks
            )
            return RateLimitResult(code=Code.OVER_LIMIT, statuses=statuses, fallback=True)
        return RateLimitResult(
            code=Code.OK,
            statuses=tuple(DescriptorStatus(Code.OK, None, 0, None) for _ in all_entries),
            degraded=answered.how == "degraded",
            overridden=answered.how == "overridden",
            fallback=answered.fallback,
        )

    # Limiter/Request: retried with backoff within max_wait.

    def request_rate_flow(
        self,
        domain: str,
        descriptor: DescriptorLike,
        copies: int,
        min_copies: int | None,
        max_wait: float,
    ) -> Flow[RateResult]:
        domain, entries, copies, least = _copies(domain, descriptor, copies, min_copies)
        max_wait = _seconds(max_wait, "max_wait")
        schedule = RetrySchedule(max_wait, draw=self._draw)
        attempts = 0
        context: RateContext | None = None
        while True:
            attempts += 1
            # A token-bucket node may grant after a wait: offer what is left of max_wait.
            left = max(0.0, max_wait - schedule.elapsed)
            request = _protocol.rate_request(domain, entries, copies, least, left)
            answer = yield Send(_protocol.LIMITER_REQUEST, request)
            if isinstance(answer, grpc.RpcError):

                def take() -> int | None:
                    for n in dict.fromkeys((copies, least)):
                        if self.fallback.take(KIND_RATE, (domain, entries), n):
                            return n
                    return None

                what = f"Request {domain} {_shown(entries)}"
                answered = self._fail(answer, what, KIND_RATE, take)
                got = least if answered.granted is None else answered.granted
                return RateResult(
                    success=answered.how != "refused",
                    copies=0 if answered.how == "refused" else got,
                    waited=schedule.elapsed,
                    attempts=attempts,
                    degraded=answered.how == "degraded",
                    overridden=answered.how == "overridden",
                    context=context,
                    fallback=answered.fallback,
                )
            assert isinstance(answer, limiter_pb2.RateResponse)
            context = _protocol.rate_context(answer)
            if context.granted > 0:
                self._counters.add("granted")
                if context.wait:
                    yield Sleep(context.wait)
                return RateResult(
                    True, context.granted, schedule.elapsed, attempts, context=context
                )
            if self.kill_switch:
                self._overridden(copies, domain, entries, least)
                return RateResult(
                    True, least, schedule.elapsed, attempts, overridden=True, context=context
                )
            delay = schedule.next_delay(context.retry_after)
            if delay is None:
                self._counters.add("rejected")
                return RateResult(False, 0, schedule.elapsed, attempts, context=context)
            self._counters.add("retries")
            yield Sleep(delay)

    # The quota service's Allow: one call, then the wait it asks for.

    def allow_flow(
        self, namespace: str, bucket: str, tokens: int, max_wait: float | None
    ) -> Flow[AllowResult]:
        request = _allow_request(namespace, bucket, tokens, max_wait)
        answer = yield Send(_protocol.ALLOW, request)
        if isinstance(answer, grpc.RpcError):

            def take() -> int | None:
                ok = self.fallback.take(KIND_ALLOW, (namespace, bucket), tokens)
                return tokens if ok else None

            answered = self._fail(answer, f"Allow {namespace}/{bucket}", KIND_ALLOW, take)
            if answered.how == "refused":
                return AllowResult("REJECTED_TIMEOUT", 0, fallback=True)
            return AllowResult(
                "OK",
                tokens if answered.fallback else max(tokens, 1),
                degraded=answered.how == "degraded",
                overridden=answered.how == "overridden",
                fallback=answered.fallback,
            )
        assert isinstance(answer, quota_service_pb2.AllowResponse)
        status = quota_service_pb2.AllowResponse.Status.Name(answer.status)
        if status == "REJECTED_INVALID_REQUEST":
            self._counters.add("errors")
            raise RequestError("allow", f"the service refused {namespace}/{bucket} x{tokens}")
        if status != "OK":
            if self.kill_switch:
                self._counters.add("overridden")
                log.warning("kill switch: %s for %s/%s overridden", status, namespace, bucket)
                return AllowResult(status, max(tokens, 1), overridden=True)
            self._counters.add("rejected")
            return AllowResult(status, 0)
        self._counters.add("granted")
        waited = answer.wait_millis / 1000
        if waited > 0:
            yield Sleep(waited)
        return AllowResult(status, answer.tokens_granted, waited)

    def quota_flow(
        self, namespace: str, bucket: str, tokens: int, max_wait: float | None
    ) -> Flow[Granted | None]:
        """One Allow whose wait is not slept (a refill, a charge): what the service said, or
        None when it could not be asked (the caller keeps what it meant to ask)."""
        request = _allow_request(namespace, bucket, tokens, max_wait)
        answer = yield Send(_protocol.ALLOW, request)
        if isinstance(answer, grpc.RpcError):
            translated = _protocol.translate(answer, self.target)
            if isinstance(translated, RequestError):
                self._counters.add("errors")
                raise translated from answer
            return None
        assert isinstance(answer, quota_service_pb2.AllowResponse)
        status = quota_service_pb2.AllowResponse.Status.Name(answer.status)
        if status == "REJECTED_INVALID_REQUEST":
            self._counters.add("errors")
            raise RequestError("allow", f"the service refused {namespace}/{bucket} x{tokens}")
        self._counters.add("granted" if status == "OK" else "rejected")
        return Granted(status, answer.tokens_granted, answer.wait_millis / 1000)

    def local_allow(self, namespace: str, bucket: str, tokens: int) -> bool:
        """Tokens of a bucket while the service is out of reach: the fallback limiter's
        answer, else a degraded grant when failing open."""
        if self.fallback.covers(KIND_ALLOW):
            self._counters.add("fallback")
            if self.fallback.take(KIND_ALLOW, (namespace, bucket), tokens):
                return True
            self._counters.add("fallback_rejected")
            return False
        if self.fail_open:
            self._counters.add("degraded")
            return True
        self._counters.add("rejected")
        return False

    # Sessions: counted here, opened and watched by the drivers.

    def session_opened(self, session: SessionRef) -> None:
        self._counters.add("sessions")
        log.debug("ferryman session %s opened at %s", session.id, self.target)

    def session_lost(self, session: SessionRef) -> None:
        """A session ended while in use: whatever was held through it is gone."""
        self._counters.add("sessions_lost")
        log.warning(
            "ferryman session %s at %s ended (%s); the service released what it held, "
            "holds taken through it are lost",
            session.id,
            self.target,
            session.reason or "stream closed",
        )

    def _forget(self, session: SessionRef) -> None:
        if session.end(f"the service no longer knows session {session.id}"):
            self.session_lost(session)

    # Holds: Limiter/Reserve, retried with backoff within max_wait.

    def reserve_flow(
        self,
        domain: str,
        descriptor: DescriptorLike,
        copies: int,
        min_copies: int | None,
        max_wait: float,
        priority: int = 0,
    ) -> Flow[HoldState]:
        domain, entries, copies, least = _copies(domain, descriptor, copies, min_copies)
        max_wait, priority = _seconds(max_wait, "max_wait"), _count(priority, "priority", 0)
        schedule = RetrySchedule(max_wait, draw=self._draw)
        attempts = 0
        context: ReserveContext | None = None
        fresh = False  # a session opened again after the service forgot the first one

        def done(
            copies: int,
            *,
            degraded: bool = False,
            overridden: bool = False,
            session: SessionRef | None = None,
        ) -> HoldState:
            return HoldState(
                domain=domain,
                entries=entries,
                success=copies > 0,
                copies=copies,
                waited=schedule.elapsed,
                attempts=attempts,
                groups=tuple(g.name for g in context.groups) if session and context else (),
                degraded=degraded,
                overridden=overridden,
                context=context,
                session=session,
            )

        while True:
            request = _protocol.reserve_request(domain, entries, copies, least, 0.0, priority)
            left = max(0.0, max_wait - schedule.elapsed)
            session, answer, fresh = yield from self._reserve_send_flow(request, left, fresh)
            if session is not None:
                attempts += 1
            if isinstance(answer, grpc.RpcError):
                self._fail(answer, f"{least} copies of {domain} {_shown(entries)}")
                return done(least, degraded=True)
            assert isinstance(answer, limiter_pb2.ReserveResponse)
            context = _protocol.reserve_context(answer)
            if context.granted > 0:
                self._counters.add("granted")
                return done(context.granted, session=session)
            if self.kill_switch:
                self._overridden(copies, domain, entries, least)
                return done(least, overridden=True)
            delay = None if answer.queued else schedule.next_delay()
            if delay is None:
                self._counters.add("rejected")
                return done(0)
            self._counters.add("retries")
            yield Sleep(delay)

    def _reserve_send_flow(
        self, request: limiter_pb2.ReserveRequest, left: float, fresh: bool
    ) -> Flow[tuple[SessionRef | None, Answer, bool]]:
        """Send a reservation that may wait ``left`` seconds in the service's queue."""
        # A service that queues waits there for what is left of max_wait: the call's
        # deadline is stretched to cover it, so that the waiter never asks again. (The kill
        # switch turns the first refusal into a grant: it does not wait.)
        waits = left > 0 and self.queues is not False and not self.kill_switch
        if waits:
            request.max_wait.FromNanoseconds(round(left * 1e9))
        else:
            request.ClearField("max_wait")
        timeout = self.timeout + left if waits else None
        got = yield from self._session_send_flow(_protocol.LIMITER_RESERVE, request, fresh, timeout)
        if waits and isinstance(got[1], limiter_pb2.ReserveResponse):
            # An older service ignores max_wait and leaves ``queued`` unset.
            self.queues = got[1].queued
        return got

    def _session_send_flow(
        self, method: str, request: Request, fresh: bool, timeout: float | None = None
    ) -> Flow[tuple[SessionRef | None, Answer, bool]]:
        """Send in the open session, or once per flow in a new one if the service forgot it."""
        # Gives the session (None if none opened), the answer, and whether one was replaced.
        while True:
            session = yield OpenSession()
            if isinstance(session, grpc.RpcError):
                return None, session, fresh
            assert isinstance(session, SessionRef)
            answer = yield Send(method, request, session, timeout)
            if isinstance(answer, grpc.RpcError) and _session_gone(answer) and not fresh:
                self._forget(session)
                fresh = True
                continue
            return session, answer, fresh

    def _overridden(self, copies: int, domain: str, entries: Entries, least: int) -> None:
        """Count and log a rejection that the kill switch turns into ``least`` copies."""
        self._counters.add("overridden")
        log.warning(
            "kill switch: rejection of %d copies of %s %s overridden, %d granted",
            copies,
            domain,
            _shown(entries),
            least,
        )

    def release_flow(self, hold: HoldState, copies: int | None, *, quiet: bool) -> Flow[None]:
        """Give back ``copies`` (None: all the hold has left).

        ``quiet`` (releasing on the way out of a block that raised): failures are logged,
        never raised. Otherwise client errors raise, and so do outages when failing closed.
        """
        n = hold.copies if copies is None else _count(copies, "copies", 1)
        if n == 0:
            return
        if n > hold.copies:
            raise HoldError("copies", f"{n} is more than this hold has ({hold.copies})")
        hold.copies -= n
        session = hold.session
        if session is None:
            return  # nothing is held on the service
        if session.ended:
            hold.lost_copies = True
            return  # the service released them when the session ended
        request = _protocol.release_request(hold.domain, hold.entries, n, hold.groups)
        answer = yield Send(_protocol.LIMITER_RELEASE, request, session)
        if not isinstance(answer, grpc.RpcError):
            return
        if _session_gone(answer):
            self._forget(session)
            hold.lost_copies = True
            return
        error = _protocol.translate(answer, self.target)
        client_error = isinstance(error, RequestError)
        if not quiet and (client_error or not self.fail_open):
            hold.copies += n  # nothing changed (as far as the client can tell)
            self._counters.add("errors")
            raise error from answer
        log.warning(
            "could not release %d copies of %s (%s); %s",
            n,
            hold.describe(),
            error,
            "nothing was released"
            if client_error
            else f"they stay held until session {session.id} ends",
        )

    def transfer_flow(self, hold: HoldState, copies: int, ttl: float) -> Flow[str]:
        """Stage ``copies`` for another session; the transfer id to hand over."""
        n = _count(copies, "copies", 1)
        ttl = _seconds(ttl, "ttl", positive=True)
        if n > hold.copies:
            raise HoldError("copies", f"{n} is more than this hold has ({hold.copies})")
        session = hold.session
        if session is None:  # degraded or overridden: the copies were granted locally
            hold.copies -= n
            return _local_transfer_id(hold, n, hold.degraded)
        if session.ended:
            hold.lost_copies = True
            return self._transfer_locally(hold, n, f"session {session.id} ended")
        hold.copies -= n
        request = _protocol.transfer_request(hold.domain, hold.entries, n, hold.groups, ttl)
        answer = yield Send(_protocol.LIMITER_TRANSFER, request, session)
        if isinstance(answer, grpc.RpcError):
            hold.copies += n
            if _session_gone(answer):
                self._forget(session)
                hold.lost_copies = True
                return self._transfer_locally(hold, n, f"session {session.id} ended")
            error = _protocol.translate(answer, self.target)
            if isinstance(error, RequestError) or not self.fail_open:
                self._counters.add("errors")
                raise error from answer
            return self._transfer_locally(
                hold, n, f"{error}; they stay held until session {session.id} ends"
            )
        assert isinstance(answer, limiter_pb2.TransferResponse)
        return str(answer.transfer_id)

    def _transfer_locally(self, hold: HoldState, n: int, why: str) -> str:
        """A transfer the service cannot take: degraded (fail open) or an error."""
        if not self.fail_open:
            self._counters.add("errors")
            raise ServiceUnavailableError(self.target, "UNAVAILABLE", f"transfer: {why}")
        log.warning(
            "could not transfer %d copies of %s (%s); degraded mode, transferring them locally",
            n,
            hold.describe(),
            why,
        )
        hold.copies -= n
        return _local_transfer_id(hold, n, True)

    def seize_flow(self, transfer_id: str, min_copies: int) -> Flow[HoldState]:
        """Claim staged copies into this client's session."""
        if not isinstance(transfer_id, str):
            raise TypeError(f"transfer_id: expected a str, got {transfer_id!r}")
        if not transfer_id:
            raise RequestError("transfer_id", "must not be empty")
        least = _count(min_copies, "min_copies", 1)
        start = time.monotonic()
        if transfer_id.startswith(LOCAL_TRANSFER):
            return self._seize_locally(transfer_id)
        request = _protocol.seize_request(transfer_id)
        attempts = 0
        fresh = False
        while True:
            opened = yield OpenSession()
            failure: grpc.RpcError
            if isinstance(opened, grpc.RpcError):
                failure = opened
            else:
                assert isinstance(opened, SessionRef)
                session = opened
                attempts += 1
                answer = yield Send(_protocol.LIMITER_SEIZE, request, session)
                if not isinstance(answer, grpc.RpcError):
                    break
                if _session_gone(answer) and not fresh:
                    self._forget(session)
                    fresh = True
                    continue
                failure = answer
            self._fail(failure, f"{least} copies of transfer {transfer_id}")
            return HoldState(
                domain="",
                entries=(),
                success=True,
                copies=least,
                waited=time.monotonic() - start,
                attempts=attempts,
                degraded=True,
            )
        assert isinstance(answer, limiter_pb2.SeizeResponse)
        self._counters.add("granted")
        return HoldState(
            domain=answer.domain,
            entries=tuple((e.key, e.value) for e in answer.descriptor),
            success=True,
            copies=answer.copies,
            waited=time.monotonic() - start,
            attempts=attempts,
            groups=tuple(answer.groups),
            session=session,
        )

    def _seize_locally(self, transfer_id: str) -> HoldState:
        """The copies of a transfer granted locally, which never reached the service."""
        domain, entries, copies, degraded, overridden = _parse_local_transfer_id(transfer_id)
        self._counters.add("degraded" if degraded else "overridden")
        return HoldState(
            domain=domain,
            entries=entries,
            success=True,
            copies=copies,
            waited=0.0,
            attempts=0,
            degraded=degraded,
            overridden=overridden and not degraded,
        )

    def release_all_flow(self, holds: Sequence[HoldState], *, quiet: bool) -> Flow[None]:
        """Release what each hold has left, last first; the first error raised at the end."""
        first: FerrymanError | None = None
        for hold in reversed(holds):
            try:
                yield from self.release_flow(hold, None, quiet=quiet)
            except FerrymanError as error:
                first = first or error
        if first is not None:
            raise first

    # Multi-resource holds (paper, 3.3).

    def hold_resources_flow(
        self,
        resources: Sequence[Resource],
        copies: int,
        min_copies: int | None,
        max_wait: float,
        held: list[HoldState],
        priority: int = 0,
    ) -> Flow[MultiHold[HoldState]]:
        """Hold the same number of copies of every resource, pseudo-atomically.

        Copy-limited resources first, in order, each asked for as many copies as the one
        before got (the surplus of the earlier ones is released), then the rate-limited one
        (if any) with what is left of ``max_wait``; the holds are trimmed to what it
        granted. Each hold is appended to ``held`` as soon as it exists, so that the driver
        releases it whatever happens; on a failure the flow releases them itself.
        """
        rated = _rate_limited(resources)
        copies, least = _least(copies, min_copies)
        max_wait = _seconds(max_wait, "max_wait")
        start = time.monotonic()

        def left() -> float:
            return max(0.0, max_wait - (time.monotonic() - start))

        def failed(resource: Resource, rate: RateResult | None = None) -> MultiHold[HoldState]:
            return MultiHold(False, 0, (), rate, time.monotonic() - start, failed=resource)

        n, refused = yield from self._hold_copies_flow(
            resources, copies, least, left, held, priority
        )
        if refused is not None:
            return failed(refused)
        rate: RateResult | None = None
        if rated is not None:
            rate = yield from self.request_rate_flow(
                rated.domain, rated.descriptor, n, least, left()
            )
            if not rate.success:
                yield from self._let_go_flow(held)
                return failed(rated, rate)
            if rate.copies < n:
                n = rate.copies
                yield from self._trim_flow(held, n)
        parts: list[HoldState | RateResult] = [*held, *([rate] if rate else [])]
        return MultiHold(
            True,
            n,
            tuple(held),
            rate,
            time.monotonic() - start,
            degraded=any(p.degraded for p in parts),
            overridden=any(p.overridden for p in parts),
        )

    def _hold_copies_flow(
        self,
        resources: Sequence[Resource],
        n: int,
        least: int,
        left: Callable[[], float],
        held: list[HoldState],
        priority: int = 0,
    ) -> Flow[tuple[int, Resource | None]]:
        """Hold the copy-limited resources in order: the copies each has, or the one refused."""
        for resource in resources:
            if resource.rate_limited:
                continue
            hold = yield from self.reserve_flow(
                resource.domain, resource.descriptor, n, least, left(), priority
            )
            if not hold.success:
                yield from self._let_go_flow(held)
                return n, resource
            held.append(hold)
            if hold.copies < n:
                n = hold.copies
                yield from self._trim_flow(held[:-1], n)
        return n, None

    def _trim_flow(self, holds: Sequence[HoldState], n: int) -> Flow[None]:
        """Release what each hold has beyond ``n`` copies."""
        for hold in holds:
            if hold.copies > n:
                yield from self.release_flow(hold, hold.copies - n, quiet=False)

    def _let_go_flow(self, held: list[HoldState]) -> Flow[None]:
        """Release every hold of a multi-resource hold that failed, and forget them."""
        yield from self.release_all_flow(held, quiet=True)
        held.clear()

    def _fail(
        self,
        error: grpc.RpcError,
        what: str,
        kind: str = "",
        take: Callable[[], int | None] | None = None,
    ) -> _Answered:
        """How a failed call is answered.

        A client error raises. An outage of a call kind with a fallback rate is answered by
        the fallback limiter (``take`` gives what it grants, None when it refuses; the kill
        switch turns a refusal into a grant); without one, a fail-open client grants in
        degraded mode and a fail-closed one raises.
        """
        translated = _protocol.translate(error, self.target)
        if isinstance(translated, RequestError):
            self._counters.add("errors")
            raise translated from error
        assert isinstance(translated, ServiceUnavailableError)
        if take is not None and self.fallback.covers(kind):
            self._counters.add("fallback")
            granted = take()
            if granted is not None:
                return _Answered("fallback", granted)
            self._counters.add("fallback_rejected")
            if not self.kill_switch:
                return _Answered("refused", None)
            self._counters.add("overridden")
            log.warning("kill switch: fallback refusal of %s overridden", what)
            return _Answered("overridden", None)
        if not self.fail_open:
            self._counters.add("errors")
            raise translated from error
        # While the breaker is open every call lands here: the opening was logged once.
        level = logging.DEBUG if isinstance(error, BreakerOpenError) else logging.WARNING
        log.log(
            level,
            "ferryman at %s failed (%s: %s); degraded mode, granting %s",
            self.target,
            translated.code,
            translated.details,
            what,
        )
        self._counters.add("degraded")
        return _Answered("degraded", None)


@dataclass(frozen=True)
class Granted:
    """What the service said to an Allow: its status name, tokens and wait (seconds)."""

    status: str
    tokens: int
    wait: float


def _allow_request(
    namespace: str, bucket: str, tokens: int, max_wait: float | None
) -> quota_service_pb2.AllowRequest:
    for field_name, name in (("namespace", namespace), ("bucket", bucket)):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise RequestError(field_name, f"{name!r} must match [a-zA-Z0-9_]+")
    tokens = _count(tokens, "tokens", 0)
    wait_ms = None
    if max_wait is not None:
        wait_ms = math.floor(_seconds(max_wait, "max_wait") * 1000)
    return _protocol.allow_request(namespace, bucket, tokens, wait_ms)


@dataclass(frozen=True)
class _Answered:
    """An outage's answer: ``how`` (degraded, fallback, refused, overridden) and what the
    fallback limiter granted (None: it did not decide, or refused)."""

    how: Outage
    granted: int | None

    @property
    def fallback(self) -> bool:
        return self.how in ("fallback", "refused", "overridden")


def _looks_like_pair(item: object) -> bool:
    return (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    )


def _shown(entries: Entries) -> str:
    return ",".join(f"{k}={v}" for k, v in entries)
