"""``ferryman.AsyncClient``: the asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import TypeVar

import grpc
import grpc.aio
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.client import _protocol
from ferryman.client._bucket import AsyncLocalBucket, Charges
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
from ferryman.client._sync import _positive, session_name
from ferryman.errors import FerrymanError
from ferryman.tasks import cancel

__all__ = ["AsyncClient", "AsyncHold"]

log = logging.getLogger("ferryman.client")

T = TypeVar("T")

SessionEvent = limiter_pb2.SessionEvent
SessionRequest = limiter_pb2.SessionRequest
SessionCall = grpc.aio.StreamStreamCall[SessionRequest, SessionEvent]


class _AsyncStream:
    """One Session stream on the client's event loop, its events read by a task."""

    def __init__(self, call: SessionCall, on_lost: Callable[[SessionRef], None]) -> None:
        self.ref = SessionRef()
        self._call = call
        self._on_lost = on_lost
        self._closing = False
        self._reason = ""
        self._reader: asyncio.Task[None] | None = None

    async def open(self, wait: float) -> SessionRef | grpc.RpcError:
        try:
            async with asyncio.timeout(wait):
                await self._call.write(_protocol.open_request(session_name()))
                event = await self._call.read()
        except TimeoutError:
            self._call.cancel()
            return SessionFailure(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer to the Session stream's open within {wait}s",
            )
        except grpc.RpcError as error:
            self._call.cancel()
            return error
        if not isinstance(event, SessionEvent) or event.WhichOneof("event") != "opened":
            self._call.cancel()
            return SessionFailure(
                grpc.StatusCode.UNAVAILABLE, "the session stream ended before it opened"
            )
        self.ref.id = event.opened.session_id
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="ferryman-session")
        return self.ref

    async def _read(self) -> None:
        try:
            while True:
                event = await self._call.read()
                if not isinstance(event, SessionEvent):
                    break  # EOF
                if event.WhichOneof("event") == "closing":
                    self._reason = event.closing.reason or "the service closed the session"
        except grpc.RpcError as error:
            details = error.details() if callable(getattr(error, "details", None)) else None
            self._reason = self._reason or str(details or error)
        except asyncio.CancelledError:
            self._reason = self._reason or "cancelled"
            raise
        except Exception as error:  # never end a task with an unretrieved exception
            self._reason = self._reason or repr(error)
        finally:
            if self.ref.end(self._reason or "the session stream ended") and not self._closing:
                self._on_lost(self.ref)

    async def stop(self, wait: float) -> None:
        """Half-close the stream (the service then releases what the session holds), wait up
        to ``wait`` seconds for the service to end it, then cancel it."""
        self._closing = True
        self.ref.end("closed by the client")
        if wait > 0 and not self._call.done():
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError, TimeoutError):
                async with asyncio.timeout(wait):
                    await self._call.done_writing()
                    if self._reader is not None:
                        await asyncio.shield(self._reader)
        self._call.cancel()
        if self._reader is not None:
            await cancel(self._reader)


class AsyncClient:
    """The asyncio twin of :class:`ferryman.Client`: same arguments, same methods, awaited.

    The channel is opened on first use inside the running event loop and belongs to that
    loop; close it with ``await client.aclose()`` or ``async with``::

        async with ferryman.AsyncClient("127.0.0.1:8081") as client:
            result = await client.request_rate("api", {"user": "alice"}, max_wait=5)
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
        self._credentials = credentials
        self._keepalive = keepalive
        self._channel: grpc.aio.Channel | None = None
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable[Request, Response]] = {}
        self._session_method: (
            grpc.aio.StreamStreamMultiCallable[SessionRequest, SessionEvent] | None
        ) = None
        self._stream: _AsyncStream | None = None
        self._session_lock: asyncio.Lock | None = None
        self._closed = False
        self._buckets: list[AsyncLocalBucket] = []
        self._charges = Charges(self._core)
        self._charge_interval = _positive(charge_interval, "charge_interval")
        self._flusher: asyncio.Task[None] | None = None

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

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[DescriptorLike], hits: int = 1
    ) -> RateLimitResult:
        """Envoy's ShouldRateLimit; see :meth:`ferryman.Client.should_rate_limit`."""
        return await self._drive(self._core.should_rate_limit_flow(domain, descriptors, hits))

    async def request_rate(
        self,
        domain: str,
        descriptor: DescriptorLike,
        copies: int = 1,
        min_copies: int | None = None,
        max_wait: float = 0,
    ) -> RateResult:
        """Ask for hits on a burst-tier or token-bucket node (awaiting a wait the service
        asks for); see :meth:`ferryman.Client.request_rate`."""
        return await self._drive(
            self._core.request_rate_flow(domain, descriptor, copies, min_copies, max_wait)
        )

    async def allow(
        self, namespace: str, bucket: str, tokens: int = 1, max_wait: float | None = None
    ) -> AllowResult:
        """The quota service's Allow; awaits the wait the service asks for before returning
        (see ``Client.allow``)."""
        return await self._drive(self._core.allow_flow(namespace, bucket, tokens, max_wait))

    def bucket(
        self, namespace: str, name: str, *, batch: int, low_water: int | None = None
    ) -> AsyncLocalBucket:
        """``Client.bucket`` refilled by a task: call it inside the running loop."""
        self._open()
        low = batch // 4 if low_water is None else low_water
        made = AsyncLocalBucket(self, namespace, name, batch, low)
        self._buckets.append(made)
        return made

    def pending_charges(self) -> dict[tuple[str, str], int]:
        """The tokens charged per (namespace, bucket) that the service has not taken yet."""
        return self._charges.snapshot()

    def charge(self, namespace: str, bucket: str, tokens: int = 1) -> None:
        """``Client.charge``: sent by a task every ``charge_interval`` seconds."""
        self._charges.add(namespace, bucket, tokens)
        if self._flusher is None and not self._closed:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_every())

    async def flush(self) -> None:
        """Send the charges recorded so far now."""
        for namespace, bucket, n in self._charges.due():
            flow = self._charges.flow(namespace, bucket, n)
            self._charges.settle(namespace, bucket, n, await self._drive(flow, closing=True))

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(self._charge_interval)
            try:
                await self.flush()
            except FerrymanError:  # a bad charge must not stop the others being sent
                log.exception("ferryman: sending charges failed")

    def _open(self) -> dict[str, grpc.aio.UnaryUnaryMultiCallable[Request, Response]]:
        if self._closed:
            raise RuntimeError("this ferryman.AsyncClient is closed")
        if self._channel is None:
            target, options = self._core.target, _protocol.channel_options(self._keepalive)
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(target, options=options)
            else:
                channel = grpc.aio.secure_channel(target, self._credentials, options=options)
            self._methods = {
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
                self._methods[method] = channel.unary_unary(
                    method, request_type.SerializeToString, response_type.FromString
                )
            self._session_method = channel.stream_stream(
                _protocol.LIMITER_SESSION,
                SessionRequest.SerializeToString,
                SessionEvent.FromString,
            )
            self._channel = channel
        return self._methods

    @contextlib.asynccontextmanager
    async def hold_copy(
        self,
        domain: str,
        descriptor: DescriptorLike,
        copies: int = 1,
        min_copies: int | None = None,
        max_wait: float = 0,
        priority: int = 0,
    ) -> AsyncIterator[AsyncHold]:
        """Hold copies of a copy-limited node for an ``async with`` block.

        See :meth:`ferryman.Client.hold_copy`; the hold is released on the way out, also
        when the block raises or is cancelled.
        """
        state = await self._drive(
            self._core.reserve_flow(domain, descriptor, copies, min_copies, max_wait, priority)
        )
        async with self._releasing([state]):
            yield AsyncHold(self, state)

    @contextlib.asynccontextmanager
    async def seize_copy(self, transfer_id: str, min_copies: int = 1) -> AsyncIterator[AsyncHold]:
        """Claim transferred copies for an ``async with`` block.

        See :meth:`ferryman.Client.seize_copy`.
        """
        state = await self._drive(self._core.seize_flow(transfer_id, min_copies))
        async with self._releasing([state]):
            yield AsyncHold(self, state)

    @contextlib.asynccontextmanager
    async def hold_resources(
        self,
        resources: Sequence[Resource],
        copies: int = 1,
        min_copies: int | None = None,
        max_wait: float = 0,
        priority: int = 0,
    ) -> AsyncIterator[MultiHold[AsyncHold]]:
        """Hold the same number of copies of several resources, pseudo-atomically.

        See :meth:`ferryman.Client.hold_resources`.
        """
        held: list[HoldState] = []
        async with self._releasing(held):
            multi = await self._drive(
                self._core.hold_resources_flow(
                    resources, copies, min_copies, max_wait, held, priority
                )
            )
            yield MultiHold(
                multi.success,
                multi.copies,
                tuple(AsyncHold(self, s) for s in multi.holds),
                multi.rate,
                multi.waited,
                multi.degraded,
                multi.overridden,
                multi.failed,
            )

    @contextlib.asynccontextmanager
    async def _releasing(self, states: list[HoldState]) -> AsyncIterator[None]:
        """Release what ``states`` still hold on the way out (quietly if the block raised)."""
        ok = False
        try:
            yield
            ok = True
        finally:
            await self._drive(self._core.release_all_flow(states, quiet=not ok), closing=True)

    async def _open_session(self) -> SessionRef | grpc.RpcError:
        """The open session, opening one if there is none or it ended."""
        if self._session_lock is None:
            self._session_lock = asyncio.Lock()
        async with self._session_lock:
            self._open()
            stream = self._stream
            if stream is not None and not stream.ref.ended:
                return stream.ref
            if stream is not None:
                self._stream = None
                await stream.stop(0)  # ended on our side (the service forgot it): cancel it
            assert self._session_method is not None
            stream = _AsyncStream(self._session_method(None), self._core.session_lost)
            opened = await stream.open(self._core.timeout)
            if isinstance(opened, SessionRef):
                self._stream = stream
                self._core.session_opened(opened)
            return opened

    async def _drive(self, flow: Flow[T], *, closing: bool = False) -> T:
        methods = self._methods if closing else self._open()
        answer: Answer = None
        while True:
            try:
                step = flow.send(answer)
            except StopIteration as done:
                result: T = done.value
                return result
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                answer = None
                continue
            if isinstance(step, OpenSession):
                answer = self._core.admit(call=False)
                if answer is None:
                    answer = await self._open_session()
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
                answer = await methods[step.method](
                    step.request, timeout=step.timeout or self._core.timeout, metadata=metadata
                )
            except grpc.RpcError as error:
                answer = error
            self._core.record(answer)

    async def aclose(self) -> None:
        """Close the session (the service releases what it still holds) and the channel.

        Calls made afterwards raise RuntimeError; holds still open become no-ops.
        """
        if self._closed:
            return
        self._closed = True
        for bucket in self._buckets:
            await bucket.aclose()
        await cancel(self._flusher)
        if self._channel is not None:
            with contextlib.suppress(FerrymanError):
                await self.flush()
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.stop(self._core.timeout)
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(None)

    async def __aenter__(self) -> AsyncClient:
        self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ferryman.AsyncClient {self.target} {state}>"


class AsyncHold(HoldView):
    """Copies held for a block of :meth:`AsyncClient.hold_copy` or ``seize_copy``.

    The same attributes as :class:`ferryman.Hold`; ``release`` and ``transfer`` are awaited.
    """

    def __init__(self, client: AsyncClient, state: HoldState) -> None:
        super().__init__(state)
        self._client = client

    async def release(self, copies: int | None = None) -> None:
        """Give back ``copies`` now (default: all that is left); see ``Hold.release``."""
        flow = self._client._core.release_flow(self._state, copies, quiet=False)
        await self._client._drive(flow, closing=True)

    async def transfer(self, copies: int, ttl: float) -> str:
        """Stage ``copies`` for another process; see ``Hold.transfer``."""
        return await self._client._drive(self._client._core.transfer_flow(self._state, copies, ttl))
