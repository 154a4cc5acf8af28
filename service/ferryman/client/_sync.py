"""``ferryman.Client``: the blocking client, for threaded code."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TypeVar

import grpc
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.client import _protocol
from ferryman.client._bucket import Charges, LocalBucket
from ferryman.client._core import (
    DEFAULT_TIMEOUT,
    Answer,
    ClientCore,
    Flow,
    HoldState,
    OpenSession,
    Request,
    Response,
    SessionFailure,
    SessionRef,
    Sleep,
)
from ferryman.client._guard import FallbackRate
from ferryman.client._holds import HoldView
from ferryman.client._models import (
    AllowResult,
    ClientStats,
    DescriptorLike,
    MultiHold,
    RateLimitResult,
    RateResult,
    Resource,
)
from ferryman.errors import FerrymanError

__all__ = ["Client", "Hold"]

log = logging.getLogger("ferryman.client")

T = TypeVar("T")

SessionEvent = limiter_pb2.SessionEvent
SessionRequest = limiter_pb2.SessionRequest


def session_name() -> str:
    """How a session introduces itself to the service (shown in its logs and /status)."""
    from ferryman._version import __version__

    return f"ferryman-python/{__version__} {socket.gethostname()} pid {os.getpid()}"


class _Stream:
    """One Session stream: requests through a queue, events read by a daemon thread."""

    def __init__(
        self,
        method: grpc.StreamStreamMultiCallable[SessionRequest, SessionEvent],
        on_lost: Callable[[SessionRef], None],
    ) -> None:
        self.ref = SessionRef()
        self._on_lost = on_lost
        self._closing = False
        self._reason = ""
        self._out: queue.SimpleQueue[SessionRequest | None] = queue.SimpleQueue()
        self._out.put(_protocol.open_request(session_name()))
        self._opened: Future[str] = Future()
        self._call = method(iter(self._out.get, None))
        self._reader = threading.Thread(target=self._read, name="ferryman-session", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        failure: BaseException | None = None
        try:
            for event in self._call:
                kind = event.WhichOneof("event")
                if kind == "opened" and not self._opened.done():
                    self.ref.id = event.opened.session_id
                    self._opened.set_result(self.ref.id)
                elif kind == "closing":
                    self._reason = event.closing.reason or "the service closed the session"
        except grpc.RpcError as error:
            failure = error
            details = error.details() if callable(getattr(error, "details", None)) else None
            self._reason = self._reason or details or str(error)
        except Exception as error:  # never die loudly in a daemon thread
            failure = error
            self._reason = self._reason or repr(error)
        finally:
            self._out.put(None)  # let grpc's request consumer finish
            if not self._opened.done():
                if not isinstance(failure, grpc.RpcError):
                    failure = SessionFailure(
                        grpc.StatusCode.UNAVAILABLE,
                        f"the session stream ended before it opened ({self._reason or 'EOF'})",
                    )
                self._opened.set_exception(failure)
            if self.ref.end(self._reason or "the session stream ended") and not self._closing:
                self._on_lost(self.ref)

    def wait_opened(self, timeout: float) -> SessionRef | grpc.RpcError:
        try:
            self._opened.result(timeout)
        except TimeoutError:
            self.stop(0)
            return SessionFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer to the Session stream's open within {timeout}s",
            )
        except grpc.RpcError as error:
            return error
        return self.ref

    def stop(self, wait: float) -> None:
        """End the stream: half-close it (the service then releases what the session holds),
        wait up to ``wait`` seconds for the service to end it, then cancel it."""
        self._closing = True
        self.ref.end("closed by the client")
        self._out.put(None)
        if wait > 0:
            self._reader.join(wait)
        self._call.cancel()  # type: ignore[no-untyped-call]  # untyped in grpc-stubs


def _positive(value: float, name: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected seconds > 0, got {value!r}")
    return float(value)


def _unary_methods(
    channel: grpc.Channel,
) -> dict[str, grpc.UnaryUnaryMultiCallable[Request, Response]]:
    methods: dict[str, grpc.UnaryUnaryMultiCallable[Request, Response]] = {
        _protocol.SHOULD_RATE_LIMIT: channel.unary_unary(
            _protocol.SHOULD_RATE_LIMIT,
            rls_pb2.RateLimitRequest.SerializeToString,
            rls_pb2.RateLimitResponse.FromString,
        ),
        _protocol.LIMITER_REQUEST: channel.unary_unary(
            _protocol.LIMITER_REQUEST,
            limiter_pb2.RateRequest.SerializeToString,
            limiter_pb2.RateResponse.FromString,
        ),
        _protocol.ALLOW: channel.unary_unary(
            _protocol.ALLOW,
            quota_service_pb2.AllowRequest.SerializeToString,
            quota_service_pb2.AllowResponse.FromString,
        ),
    }
    for method, request_type, response_type in _protocol.HOLD_METHODS:
        methods[method] = channel.unary_unary(
            method, request_type.SerializeToString, response_type.FromString
        )
    return methods


class Client:
    """A blocking ferryman client that owns its gRPC channel; safe to share between threads.

    ``target`` is ``host:port``. Each call to the service is cut off after ``timeout``
    seconds. When the service cannot be reached or fails, a ``fail_open`` client answers
    in degraded mode (grants ``min_copies``, flags the result ``degraded``, logs a
    warning); with ``fail_open=False`` it raises ServiceUnavailableError. With
    ``kill_switch`` set (at construction or later, as an attribute) rejections become
    grants flagged ``overridden``, logged and counted. Client errors (malformed request,
    unknown domain or descriptor) raise RequestError / NotFoundError either way. A quiet
    connection is pinged every ``keepalive`` seconds (0: never), so that a dead service or a
    partition ends the session (its holds become ``lost``) within about 1.5 times that.
    ``tls=True`` speaks TLS, verifying the service against ``ca_file`` (default: the
    system's roots); ``cert_file`` and ``key_file`` present a client certificate (mutual
    TLS). ``credentials`` takes any other gRPC channel credentials instead.

    While the service is out of reach (UNAVAILABLE, or no answer within ``timeout``),
    ``fallback_rate`` (per second; one number, or one per call kind: ``should_rate_limit``,
    ``request_rate``, ``allow``) answers from a token bucket in process per descriptor or
    bucket, holding ``fallback_burst`` seconds of it: results are flagged ``fallback``, and
    counted in ``stats()``. Without it, ``fail_open`` decides (degraded grants, or an error).
    After ``breaker_failures`` consecutive outages (0: never) the circuit breaker opens: calls
    are answered at once without being sent, for ``breaker_backoff`` seconds, doubled after
    each failed probe up to ``breaker_max_backoff``; then one call at a time probes the
    service, and the first answer closes the breaker. ``clock`` (monotonic seconds) is what
    the fallback buckets and the breaker read.

    Use it as a context manager, or call ``close()``::

        with ferryman.Client("127.0.0.1:8081") as client:
            result = client.request_rate("api", {"user": "alice"}, max_wait=5)
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        fail_open: bool = True,
        kill_switch: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        keepalive: float = _protocol.DEFAULT_KEEPALIVE,
        tls: bool = False,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        fallback_rate: FallbackRate = None,
        fallback_burst: float = 1.0,
        breaker_failures: int = 5,
        breaker_backoff: float = 1.0,
        breaker_max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        charge_interval: float = 1.0,
    ) -> None:
        credentials = _protocol.channel_credentials(credentials, tls, ca_file, cert_file, key_file)
        self._core = ClientCore(
            target,
            timeout=timeout,
            fail_open=fail_open,
            kill_switch=kill_switch,
            fallback_rate=fallback_rate,
            fallback_burst=fallback_burst,
            breaker_failures=breaker_failures,
            breaker_backoff=breaker_backoff,
            breaker_max_backoff=breaker_max_backoff,
            clock=clock,
        )
        options = _protocol.channel_options(keepalive)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._methods = _unary_methods(self._channel)
        self._session_method: grpc.StreamStreamMultiCallable[SessionRequest, SessionEvent] = (
            self._channel.stream_stream(
                _protocol.LIMITER_SESSION,
                SessionRequest.SerializeToString,
                SessionEvent.FromString,
            )
        )
        self._stream: _Stream | None = None
        self._session_lock = threading.Lock()
        self._closed = False
        self._buckets: list[LocalBucket] = []
        self._charges = Charges(self._core)
        self._charge_interval = _positive(charge_interval, "charge_interval")
        self._flusher: threading.Thread | None = None
        self._stop_flushing = threading.Event()

    @property
    def target(self) -> str:
        """The service's ``host:port``."""
        return self._core.target

    @property
    def timeout(self) -> float:
        """Seconds each call to the service may take."""
        return self._core.timeout

    @property
    def fail_open(self) -> bool:
        """Whether an unreachable or failing service gets a degraded grant (else an error)."""
        return self._core.fail_open

    @property
    def kill_switch(self) -> bool:
        """Whether rejections are turned into (reported) grants."""
        return self._core.kill_switch

    @kill_switch.setter
    def kill_switch(self, value: bool) -> None:
        self._core.kill_switch = value

    def stats(self) -> ClientStats:
        """Counts of what this client did so far."""
        return self._core.stats()

    def should_rate_limit(
        self, domain: str, descriptors: Sequence[DescriptorLike], hits: int = 1
    ) -> RateLimitResult:
        """Envoy's ShouldRateLimit: ``hits`` on each descriptor of ``domain``, one answer.

        Over-limit is an answer (``result.code``), not an exception.
        """
        return self._drive(self._core.should_rate_limit_flow(domain, descriptors, hits))

    def request_rate(
        self,
        domain: str,
        descriptor: DescriptorLike,
        copies: int = 1,
        min_copies: int | None = None,
        max_wait: float = 0,
    ) -> RateResult:
        """Ask for ``copies`` hits (at least ``min_copies``) on a burst-tier or token-bucket
        node.

        A rejection is retried with exponential backoff and +-25% jitter for up to
        ``max_wait`` seconds (never waking before the service's ``retry_after``); the last
        answer is returned, ``success=False`` if nothing was granted in time. On a
        token-bucket node what is left of ``max_wait`` is offered to the service, which may
        grant the hits after a wait (bounded by the node's ``wait_timeout_millis``): this
        call then sleeps that wait before returning, so the hits may be used on return.
        """
        return self._drive(
            self._core.request_rate_flow(domain, descriptor, copies, min_copies, max_wait)
        )

    def allow(
        self, namespace: str, bucket: str, tokens: int = 1, max_wait: float | None = None
    ) -> AllowResult:
        """The quota service's Allow: ``tokens`` from the token bucket ``namespace/bucket``.

        When the service grants them after a wait (``wait_millis``), this call sleeps that
        long before returning, so the tokens may be used on return. ``max_wait`` (seconds)
        lowers the bucket's longest wait for this call. A refusal is an answer
        (``result.granted`` is False, ``result.status`` says why), not an exception.
        """
        return self._drive(self._core.allow_flow(namespace, bucket, tokens, max_wait))

    def bucket(
        self, namespace: str, name: str, *, batch: int, low_water: int | None = None
    ) -> LocalBucket:
        """A local reserve of the quota bucket ``namespace/name`` (the smart client).

        ``take()`` decides in process; a background thread refills the reserve with one
        Allow for ``batch - reserve`` tokens once it is down to ``low_water`` (default: a
        quarter of ``batch``). It holds only tokens the service granted, at most ``batch``;
        while the service is out of reach, takes the reserve cannot cover are answered as
        ``allow`` would be (fallback limiter or degraded mode). Closed with the client.
        """
        low = batch // 4 if low_water is None else low_water
        made = LocalBucket(self, namespace, name, batch, low)
        with self._session_lock:
            self._buckets.append(made)
        return made

    def pending_charges(self) -> dict[tuple[str, str], int]:
        """The tokens charged per (namespace, bucket) that the service has not taken yet."""
        return self._charges.snapshot()

    def charge(self, namespace: str, bucket: str, tokens: int = 1) -> None:
        """Record ``tokens`` already used from ``namespace/bucket``; sent in one Allow per
        bucket every ``charge_interval`` seconds (and at ``flush()`` and ``close()``)."""
        self._charges.add(namespace, bucket, tokens)
        with self._session_lock:
            if self._flusher is None and not self._closed:
                self._flusher = threading.Thread(
                    target=self._flush_every, name="ferryman-charges", daemon=True
                )
                self._flusher.start()

    def flush(self) -> None:
        """Send the charges recorded so far now; what the service refuses or cannot take
        stays pending for the next flush."""
        for namespace, bucket, n in self._charges.due():
            granted = self._drive(self._charges.flow(namespace, bucket, n), closing=True)
            self._charges.settle(namespace, bucket, n, granted)

    def _flush_every(self) -> None:
        while not self._stop_flushing.wait(self._charge_interval):
            try:
                self.flush()
            except Exception:  # a bad charge must not stop the others being sent
                log.exception("ferryman: sending charges failed")

    @contextlib.contextmanager
    def hold_copy(
        self,
        domain: str,
        descriptor: DescriptorLike,
        copies: int = 1,
        min_copies: int | None = None,
        max_wait: float = 0,
        priority: int = 0,
    ) -> Iterator[Hold]:
        """Hold ``copies`` (at least ``min_copies``) of a copy-limited node for a block.

        A context manager: the hold it gives is released on the way out of the block, also
        when the block raises. With ``max_wait`` (seconds) a service that queues waits in
        the node's queue, in turn by ``priority`` (higher first), and answers as soon as
        copies are freed (the call's deadline is stretched to cover the wait); an older
        service's rejection is retried with the backoff of :meth:`request_rate` instead.
        Check ``hold.success``::

            with client.hold_copy("workers", {"customer": "acme"}, copies=3) as hold:
                if hold.success:
                    render(hold.copies)

        Copies are held by the client's session (a stream opened on first use and closed
        with the client): if the client dies, the service releases them. When the service
        cannot be reached or fails, a fail-open client grants ``min_copies`` locally
        (``hold.degraded``, nothing to release); with the kill switch a rejection grants
        ``min_copies`` (``hold.overridden``, nothing held).
        """
        state = self._drive(
            self._core.reserve_flow(domain, descriptor, copies, min_copies, max_wait, priority)
        )
        with self._releasing([state]):
            yield Hold(self, state)

    @contextlib.contextmanager
    def seize_copy(self, transfer_id: str, min_copies: int = 1) -> Iterator[Hold]:
        """Claim copies another client staged with ``Hold.transfer``, for a block.

        The seized hold works as one from :meth:`hold_copy` and is released on the way out.
        An unknown, expired or already seized ``transfer_id`` raises NotFoundError. When the
        service cannot be reached, a fail-open client grants ``min_copies`` locally
        (``degraded``), since only the service knows how many copies were staged.
        """
        state = self._drive(self._core.seize_flow(transfer_id, min_copies))
        with self._releasing([state]):
            yield Hold(self, state)

    @contextlib.contextmanager
    def hold_resources(
        self,
        resources: Sequence[Resource],
        copies: int = 1,
        min_copies: int | None = None,
        max_wait: float = 0,
        priority: int = 0,
    ) -> Iterator[MultiHold[Hold]]:
        """Hold the same number of copies of several resources, pseudo-atomically (paper 3.3).

        Copy-limited resources are reserved first, in order, each for as many copies as the
        one before got (the surplus of the earlier ones is released at once); the one
        rate-limited resource (``Resource(..., rate_limited=True)``; more than one is a
        ValueError) is asked last with what is left of ``max_wait``, and the holds are
        trimmed to the hits it granted. The block gets a :class:`MultiHold` with the final
        ``copies`` (between ``min_copies`` and ``copies``) and the holds; every hold is
        released on the way out. If any resource cannot be had, whatever was held is
        released before the block runs and ``success`` is False::

            resources = [Resource("workers", {"customer": "acme"}),
                         Resource("cookbook", {"simple_user": "acme"}, rate_limited=True)]
            with client.hold_resources(resources, copies=4, min_copies=1, max_wait=5) as got:
                if got.success:
                    process(got.copies)
        """
        held: list[HoldState] = []
        with self._releasing(held):
            multi = self._drive(
                self._core.hold_resources_flow(
                    resources, copies, min_copies, max_wait, held, priority
                )
            )
            yield MultiHold(
                multi.success,
                multi.copies,
                tuple(Hold(self, s) for s in multi.holds),
                multi.rate,
                multi.waited,
                multi.degraded,
                multi.overridden,
                multi.failed,
            )

    @contextlib.contextmanager
    def _releasing(self, states: list[HoldState]) -> Iterator[None]:
        """Release what ``states`` still hold on the way out (quietly if the block raised)."""
        ok = False
        try:
            yield
            ok = True
        finally:
            self._drive(self._core.release_all_flow(states, quiet=not ok), closing=True)

    def _open_session(self) -> SessionRef | grpc.RpcError:
        """The open session, opening one if there is none or it ended."""
        with self._session_lock:
            if self._closed:
                raise RuntimeError("this ferryman.Client is closed")
            stream = self._stream
            if stream is not None and not stream.ref.ended:
                return stream.ref
            if stream is not None:
                stream.stop(0)  # ended on our side (the service forgot it): cancel it
                self._stream = None
            stream = _Stream(self._session_method, self._core.session_lost)
            opened = stream.wait_opened(self._core.timeout)
            if isinstance(opened, SessionRef):
                self._stream = stream
                self._core.session_opened(opened)
            return opened

    def _drive(self, flow: Flow[T], *, closing: bool = False) -> T:
        if self._closed and not closing:
            raise RuntimeError("this ferryman.Client is closed")
        answer: Answer = None
        while True:
            try:
                step = flow.send(answer)
            except StopIteration as done:
                result: T = done.value
                return result
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                answer = None
                continue
            if isinstance(step, OpenSession):
                answer = self._core.admit(call=False)
                if answer is None:
                    answer = self._open_session()
                    self._core.record(answer)
                continue
            refused = self._core.admit()
            if refused is not None:
                answer = refused
                continue
            metadata = (
                None if step.session is None else ((_protocol.SESSION_METADATA, step.session.id),)
            )
            try:
                answer = self._methods[step.method](
                    step.request, timeout=step.timeout or self._core.timeout, metadata=metadata
                )
            except grpc.RpcError as error:
                answer = error
            self._core.record(answer)

    def close(self) -> None:
        """Close the session (the service releases what it still holds) and the channel.

        Calls made afterwards raise RuntimeError; holds still open become no-ops.
        """
        with self._session_lock:
            if self._closed:
                return
            self._closed = True
            stream, self._stream = self._stream, None
            buckets, flusher = list(self._buckets), self._flusher
        for bucket in buckets:
            bucket.close()
        self._stop_flushing.set()
        if flusher is not None:
            flusher.join(self._core.timeout + 1)
        with contextlib.suppress(FerrymanError):
            self.flush()
        if stream is not None:
            stream.stop(self._core.timeout)
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ferryman.Client {self.target} {state}>"


class Hold(HoldView):
    """Copies held for a block of :meth:`Client.hold_copy` or :meth:`Client.seize_copy`.

    Attributes (read-only): ``success``, ``copies`` (what the caller has now), ``groups``,
    ``waited``, ``attempts``, ``degraded``, ``overridden``, ``lost``, ``held``, ``context``
    (the service's limits and counts), ``domain``, ``descriptor``. Use a hold from one
    thread at a time.
    """

    def __init__(self, client: Client, state: HoldState) -> None:
        super().__init__(state)
        self._client = client

    def release(self, copies: int | None = None) -> None:
        """Give back ``copies`` now (default: all that is left); the rest stays held.

        More than the hold has raises HoldError. When the service cannot be reached, a
        fail-open client logs it (the copies stay counted until the session ends); a
        fail-closed one raises ServiceUnavailableError and keeps the copies. After the
        client closed (or the session ended: ``lost``) this only counts the copies off.
        """
        # Allowed after the client closed: its session ended, so nothing is left to send.
        flow = self._client._core.release_flow(self._state, copies, quiet=False)
        self._client._drive(flow, closing=True)

    def transfer(self, copies: int, ttl: float) -> str:
        """Stage ``copies`` for another process; the transfer id to hand it.

        The copies stay counted but leave this hold; the receiver claims them with
        ``seize_copy(transfer_id)`` within ``ttl`` seconds, or the service releases them.
        Copies granted locally (degraded, overridden, or a lost session when failing open)
        get a local transfer id that the receiver seizes locally, with the same flags.
        """
        return self._client._drive(self._client._core.transfer_flow(self._state, copies, ttl))
