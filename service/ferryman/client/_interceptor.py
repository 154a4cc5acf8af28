"""gRPC client interceptors that ask ferryman before each outgoing unary call.

The quota-service pattern: the caller's own calls go through a channel with the
interceptor; ``route`` maps each call (method, request) to the domain and descriptor it
spends, or None to let it through unlimited. The interceptor waits up to ``max_wait`` (the
client's backoff, capped by the call's own timeout) and raises RateLimitedError when the
limit has no room; the call's timeout then covers only what is left after the wait. A
service outage follows the client's policy: a fail-open client lets the call through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

import grpc
import grpc.aio

from ferryman.client._async import AsyncClient
from ferryman.client._models import DescriptorLike, RateResult, normalize_descriptor
from ferryman.client._sync import Client
from ferryman.errors import RateLimitedError, RequestError

__all__ = ["AsyncRateLimitInterceptor", "RateLimitInterceptor", "Route", "RouteFunction"]

RequestT = TypeVar("RequestT")

#: Where a call spends its hits: (domain, descriptor).
Route = tuple[str, DescriptorLike]

#: Maps an outgoing call's (method, request) to its Route, or None for no limit. ``method``
#: is the full gRPC path, e.g. ``/helloworld.Greeter/SayHello``.
RouteFunction = Callable[[str, RequestT], Route | None]

if TYPE_CHECKING:
    _SyncBase = grpc.UnaryUnaryClientInterceptor
    _AsyncBase = grpc.aio.UnaryUnaryClientInterceptor
else:
    # The runtime classes are not generic; these let the subclasses be subscripted.
    class _SyncBase(grpc.UnaryUnaryClientInterceptor, Generic[RequestT, TypeVar("R")]):
        pass

    class _AsyncBase(grpc.aio.UnaryUnaryClientInterceptor, Generic[RequestT, TypeVar("R")]):
        pass


def _method_name(method: str | bytes) -> str:
    # grpc.aio hands interceptors the method as bytes.
    return method.decode() if isinstance(method, bytes) else method


def _check(max_wait: float, copies: int) -> None:
    if not max_wait >= 0:
        raise RequestError("max_wait", f"expected seconds >= 0, got {max_wait!r}")
    if copies < 1:
        raise RequestError("copies", f"{copies} is less than 1")


def _budget(max_wait: float, timeout: float | None) -> float:
    return max_wait if timeout is None else max(0.0, min(max_wait, timeout))


def _raise_if_refused(
    method: str, domain: str, descriptor: DescriptorLike, result: RateResult
) -> None:
    if not result.success:
        context = result.context
        raise RateLimitedError(
            method,
            domain,
            normalize_descriptor(descriptor),
            result.waited,
            context.retry_after if context is not None else None,
        )


class _SyncDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, timeout: float) -> None:
        self.method = base.method
        self.timeout = timeout
        self.metadata = base.metadata
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


class RateLimitInterceptor(_SyncBase[RequestT, object]):
    """Rate-limits a blocking channel's unary calls through a :class:`ferryman.Client`.

    ``channel = grpc.intercept_channel(channel, RateLimitInterceptor(client, route))``.
    Each routed call asks for ``copies`` hits with ``request_rate`` semantics.
    """

    def __init__(
        self,
        client: Client,
        route: RouteFunction[RequestT],
        *,
        max_wait: float = 0,
        copies: int = 1,
    ) -> None:
        _check(max_wait, copies)
        self.client = client
        self.route = route
        self.max_wait = max_wait
        self.copies = copies

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, RequestT], grpc.CallFuture[object]],
        client_call_details: grpc.ClientCallDetails,
        request: RequestT,
    ) -> grpc.CallFuture[object]:
        method = _method_name(client_call_details.method)
        where = self.route(method, request)
        if where is None:
            return continuation(client_call_details, request)
        domain, descriptor = where
        timeout = client_call_details.timeout
        result = self.client.request_rate(
            domain, descriptor, copies=self.copies, max_wait=_budget(self.max_wait, timeout)
        )
        _raise_if_refused(method, domain, descriptor, result)
        if timeout is not None:
            client_call_details = _SyncDetails(
                client_call_details, max(0.0, timeout - result.waited)
            )
        return continuation(client_call_details, request)


class AsyncRateLimitInterceptor(_AsyncBase[RequestT, object]):
    """Rate-limits a ``grpc.aio`` channel's unary calls through a :class:`ferryman.AsyncClient`.

    ``grpc.aio.insecure_channel(target, interceptors=[AsyncRateLimitInterceptor(client,
    route)])``. Each routed call asks for ``copies`` hits with ``request_rate`` semantics.
    """

    def __init__(
        self,
        client: AsyncClient,
        route: RouteFunction[RequestT],
        *,
        max_wait: float = 0,
        copies: int = 1,
    ) -> None:
        _check(max_wait, copies)
        self.client = client
        self.route = route
        self.max_wait = max_wait
        self.copies = copies

    async def intercept_unary_unary(
        self,
        continuation: Callable[
            [grpc.aio.ClientCallDetails, RequestT], grpc.aio.UnaryUnaryCall[RequestT, object]
        ],
        client_call_details: grpc.aio.ClientCallDetails,
        request: RequestT,
    ) -> object:
        method = _method_name(client_call_details.method)
        where = self.route(method, request)
        if where is None:
            return await continuation(client_call_details, request)
        domain, descriptor = where
        timeout = client_call_details.timeout
        result = await self.client.request_rate(
            domain, descriptor, copies=self.copies, max_wait=_budget(self.max_wait, timeout)
        )
        _raise_if_refused(method, domain, descriptor, result)
        if timeout is not None:
            d = client_call_details
            client_call_details = grpc.aio.ClientCallDetails(
                d.method,
                max(0.0, timeout - result.waited),
                d.metadata,
                d.credentials,
                d.wait_for_ready,
            )
        return await continuation(client_call_details, request)
