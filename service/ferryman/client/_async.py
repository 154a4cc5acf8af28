"""``ferryman.AsyncClient``: the asyncio client."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import TypeVar

import grpc
import grpc.aio

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

__all__ = ["AsyncClient"]

T = TypeVar("T")


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
    ) -> None:
        self._core = ClientCore(
            target, timeout=timeout, fail_open=fail_open, kill_switch=kill_switch
        )
        self._credentials = credentials
        self._channel: grpc.aio.Channel | None = None
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable[Request, Response]] = {}
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
        """Ask for hits on a burst-tier node; see :meth:`ferryman.Client.request_rate`."""
        return await self._drive(
            self._core.request_rate_flow(domain, descriptor, copies, min_copies, max_wait)
        )

    def _open(self) -> dict[str, grpc.aio.UnaryUnaryMultiCallable[Request, Response]]:
        if self._closed:
            raise RuntimeError("this ferryman.AsyncClient is closed")
        if self._channel is None:
            target, options = self._core.target, _protocol.channel_options()
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
            }
            self._channel = channel
        return self._methods

    async def _drive(self, flow: Flow[T]) -> T:
        methods = self._open()
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
            try:
                answer = await methods[step.method](step.request, timeout=self._core.timeout)
            except grpc.RpcError as error:
                answer = error

    async def aclose(self) -> None:
        """Close the channel; calls made afterwards raise RuntimeError."""
        self._closed = True
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
