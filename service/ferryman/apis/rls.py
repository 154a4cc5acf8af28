"""The Envoy rate limit service: ``envoy.service.ratelimit.v3.RateLimitService``."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from ferryman.access import ANONYMOUS, Access, Caller
from ferryman.apis import api
from ferryman.apis.convert import decision_to_proto, encode_decision, request_from_proto
from ferryman.connections.deadline import ANSWER_BY
from ferryman.edge.decoding import answers_encoded
from ferryman.edge.rpc import Method
from ferryman.engine import RateLimitEngine
from ferryman.stats import CALL, TOTAL_REQUESTS

__all__ = ["API", "METHODS", "SEEN_BYTES", "SERVICE", "RateLimitServicer"]

SERVICE = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"]

#: The largest request whose conversion the engine keeps (in serialized bytes; Envoy's are
#: a few hundred): with the engine's PLANS, a few MiB in all, whatever the callers send.
SEEN_BYTES = 1024

_CODE_NAMES = {
    value.number: value.name
    for value in rls_pb2.RateLimitResponse.DESCRIPTOR.enum_types_by_name["Code"].values
}


def _request_attributes(request: rls_pb2.RateLimitRequest) -> Mapping[str, str | int]:
    return {"ratelimit.domain": request.domain, "ratelimit.descriptors": len(request.descriptors)}


def _response_attributes(response: bytes) -> Mapping[str, str | int]:
    # The serialized response starts with its overall_code (field 1), unless it is UNKNOWN.
    code = response[1] if response[:1] == b"\x08" else 0
    return {"ratelimit.code": _CODE_NAMES[code]}


#: What the edge records of each method. As the reference, a request that does not decode
#: is counted as a call that failed.
METHODS = {
    "ShouldRateLimit": Method(
        CALL,
        _request_attributes,
        _response_attributes,
        undecodable=(TOTAL_REQUESTS, f"{CALL}.service_error"),
    )
}


def _may_wait() -> float:
    """Seconds the answer may be held: until the call's deadline (less the margin the edge
    keeps for the answer to travel), or without bound when the caller set none."""
    by = ANSWER_BY.get()
    return math.inf if by is None else max(0.0, by - time.monotonic())


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    """Answers ShouldRateLimit (errors become statuses at the edge)."""

    def __init__(self, engine: RateLimitEngine, access: Access | None = None) -> None:
        self._engine = engine
        self._access = access or Access.unrestricted()

    @answers_encoded
    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        """The serialized RateLimitResponse (sent as it is), held until the turn its hits
        were booked for on a node with max_wait (never past the call's deadline)."""
        self._access.envoy(context, request)
        key = request.SerializeToString()
        engine = self._engine
        may_wait = _may_wait()
        if len(key) > SEEN_BYTES:  # a rare large request: converted and matched afresh
            decision = await engine.should_rate_limit(
                *request_from_proto(request), may_wait=may_wait
            )
        else:
            # Most requests repeat one seen shortly before: the engine keeps its conversion.
            decision = await engine.should_rate_limit_kept(
                key, lambda: request_from_proto(request), may_wait=may_wait
            )
        if decision.wait > 0:
            await engine.waits.hold(decision.wait)
        return encode_decision(decision)

    async def respond(
        self, request: rls_pb2.RateLimitRequest, caller: Caller | None = None
    ) -> rls_pb2.RateLimitResponse:
        """The answer to one request, whichever port it came in on; raises FerrymanError."""
        self._access.envoy(caller or Caller(ANONYMOUS, (ANONYMOUS,), ""), request)
        domain, descriptors, hits = request_from_proto(request)
        return decision_to_proto(await self._engine.should_rate_limit(domain, descriptors, hits))


API = api.API(
    SERVICE,
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server,
    api.built(lambda parts: RateLimitServicer(parts.engine, parts.access)),
    methods=METHODS,
    # "ratelimit": the name the reference's health service answers to.
    health=("ratelimit", SERVICE.full_name),
)
