"""The Envoy rate limit service: ``envoy.service.ratelimit.v3.RateLimitService``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc

from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from ferryman.engine import RateLimitEngine
from ferryman.server.convert import decision_to_proto, request_from_proto
from ferryman.server.edge import Method
from ferryman.stats import CALL

__all__ = ["METHODS", "SEEN_BYTES", "RateLimitServicer"]

#: The largest request whose conversion the engine keeps (in serialized bytes; Envoy's are
#: a few hundred): with the engine's PLANS, a few MiB in all, whatever the callers send.
SEEN_BYTES = 1024

_CODE_NAMES = {
    value.number: value.name
    for value in rls_pb2.RateLimitResponse.DESCRIPTOR.enum_types_by_name["Code"].values
}


def _request_attributes(request: rls_pb2.RateLimitRequest) -> Mapping[str, str | int]:
    return {"ratelimit.domain": request.domain, "ratelimit.descriptors": len(request.descriptors)}


def _response_attributes(response: rls_pb2.RateLimitResponse) -> Mapping[str, str | int]:
    return {"ratelimit.code": _CODE_NAMES[response.overall_code]}


#: What the edge records of each method.
METHODS = {"ShouldRateLimit": Method(CALL, _request_attributes, _response_attributes)}


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    """Answers ShouldRateLimit (errors become statuses at the edge)."""

    def __init__(self, engine: RateLimitEngine) -> None:
        self._engine = engine

    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> rls_pb2.RateLimitResponse:
        key = request.SerializeToString()
        if len(key) > SEEN_BYTES:  # a rare large request: converted and matched afresh
            return await self.respond(request)
        # Most requests repeat one seen shortly before: the engine keeps its conversion.
        decision = await self._engine.should_rate_limit_kept(
            key, lambda: request_from_proto(request)
        )
        return decision_to_proto(decision)

    async def respond(self, request: rls_pb2.RateLimitRequest) -> rls_pb2.RateLimitResponse:
        """The answer to one request, whichever port it came in on; raises FerrymanError."""
        domain, descriptors, hits = request_from_proto(request)
        return decision_to_proto(await self._engine.should_rate_limit(domain, descriptors, hits))
