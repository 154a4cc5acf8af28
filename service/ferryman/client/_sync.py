"""``ferryman.Client``: the blocking client, for threaded code."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar

import grpc

from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2
from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.client import _protocol
from ferryman.client._core import (
    DEFAULT_TIMEOUT,
    Answer,
    ClientCore,
    Flow,
    Request,
    Response,
    Sleep,
)
from ferryman.client._models import ClientStats, DescriptorLike, RateLimitResult, RateResult

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """A blocking ferryman client that owns its gRPC channel; safe to share between threads.

    ``target`` is ``host:port``. Each call to the service is cut off after ``timeout``
    seconds. When the service cannot be reached or fails, a ``fail_open`` client answers
    in degraded mode (grants ``min_copies``, flags the result ``degraded``, logs a
    warning); with ``fail_open=False`` it raises ServiceUnavailableError. With
    ``kill_switch`` set (at construction or later, as an attribute) rejections become
    grants flagged ``overridden``, logged and counted. Client errors (malformed request,
    unknown domain or descriptor) raise RequestError / NotFoundError either way.

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
    ) -> None:
        self._core = ClientCore(
            target, timeout=timeout, fail_open=fail_open, kill_switch=kill_switch
        )
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=_protocol.channel_options())
        else:
            self._channel = grpc.secure_channel(
                target, credentials, options=_protocol.channel_options()
            )
        self._methods: dict[str, grpc.UnaryUnaryMultiCallable[Request, Response]] = {
            _protocol.SHOULD_RATE_LIMIT: self._channel.unary_unary(
                _protocol.SHOULD_RATE_LIMIT,
                rls_pb2.RateLimitRequest.SerializeToString,
                rls_pb2.RateLimitResponse.FromString,
            ),
            _protocol.LIMITER_REQUEST: self._channel.unary_unary(
                _protocol.LIMITER_REQUEST,
                limiter_pb2.RateRequest.SerializeToString,
                limiter_pb2.RateResponse.FromString,
            ),
        }
        self._closed = False

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
        """Ask for ``copies`` hits (at least ``min_copies``) on a burst-tier node.

        A rejection is retried with exponential backoff and +-25% jitter for up to
        ``max_wait`` seconds (never waking before the service's ``retry_after``); the last
        answer is returned, ``success=False`` if nothing was granted in time.
        """
        return self._drive(
            self._core.request_rate_flow(domain, descriptor, copies, min_copies, max_wait)
        )

    def _drive(self, flow: Flow[T]) -> T:
        if self._closed:
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
            try:
                answer = self._methods[step.method](step.request, timeout=self._core.timeout)
            except grpc.RpcError as error:
                answer = error

    def close(self) -> None:
        """Close the channel; calls made afterwards raise RuntimeError."""
        if not self._closed:
            self._closed = True
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
