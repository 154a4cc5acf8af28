"""Envoy's rate limit quota service on the gRPC port (``StreamRateLimitQuotas``): reports in,
assignments out, over the shares of ``ferryman.apis.rlqs``. This module, with the service's
messages, is imported by an Envoy's first stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc

from ferryman.access import Access, caller_of
from ferryman.apis import api
from ferryman.apis.rlqs import ENVOY_HEADER, QuotaShares
from ferryman.edge.rpc import Method
from ferryman.errors import FerrymanError
from ferryman.tasks import cancel

__all__ = ["API", "METHODS", "SERVICE", "RlqsServicer"]

SERVICE = rlqs_pb2.DESCRIPTOR.services_by_name["RateLimitQuotaService"]
METHODS = {"StreamRateLimitQuotas": Method("ratelimit.service.call.stream_rate_limit_quotas")}
Context = grpc.aio.ServicerContext[Any, Any]


def _envoy_name(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == ENVOY_HEADER and isinstance(value, str) and value:
            return value
    return str(context.peer())


class RlqsServicer(rlqs_pb2_grpc.RateLimitQuotaServiceServicer):
    """StreamRateLimitQuotas: reports read as they come, assignments written as they are
    queued (coalesced per bucket, so a stream that does not read holds one per bucket)."""

    def __init__(self, shares: QuotaShares, access: Access) -> None:
        self._shares = shares
        self._access = access

    async def StreamRateLimitQuotas(
        self, request_iterator: AsyncIterator[Any], context: Context
    ) -> AsyncIterator[Any]:
        # A stream holds a place only once its first report has passed the access check.
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        self._access.require(context, "rlqs", first.domain)
        shares = self._shares
        stream = shares.open(_envoy_name(context), caller_of(context).key)
        reader = asyncio.create_task(self._read(stream, first, requests, context))
        try:
            while True:
                await stream.wake.wait()
                stream.wake.clear()
                if stream.error is not None:
                    raise stream.error
                response = shares.take(stream)
                if response is not None:
                    yield response
                if stream.closed:
                    return
        finally:
            await cancel(reader)
            shares.close(stream)

    async def _read(
        self, stream: Any, first: Any, requests: AsyncIterator[Any], context: Context
    ) -> None:
        allowed = first.domain  # the domain this stream was last allowed to report on
        try:
            self._shares.report(stream, first)
            async for message in requests:
                if message.domain != allowed:
                    self._access.require(context, "rlqs", message.domain)
                    allowed = message.domain
                self._shares.report(stream, message)
        except FerrymanError as error:
            stream.error = error
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass  # the Envoy went away: the stream ends
        finally:
            # Released here, not only when the answers' side ends: cancelled while writing,
            # that side stays suspended until the garbage collector finds it.
            self._shares.close(stream)

    async def drain(self) -> None:
        """End every stream (at shutdown, so that none holds the server's grace period)."""
        self._shares.close_all()


API = api.API(
    SERVICE,
    rlqs_pb2_grpc.add_RateLimitQuotaServiceServicer_to_server,
    api.built(lambda parts: RlqsServicer(parts.rlqs, parts.access)),
    methods=METHODS,
    health=(SERVICE.full_name,),
    drain=RlqsServicer.drain,
)
