"""The Envoy rate limit service: ``envoy.service.ratelimit.v3.RateLimitService``."""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Any

import grpc
from opentelemetry.trace import Status, StatusCode

from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from ferryman.errors import BackendError, RequestError
from ferryman.limits.engine import RateLimitEngine
from ferryman.server.convert import decision_to_proto, request_from_proto
from ferryman.stats import CALL, TOTAL_REQUESTS, Stats
from ferryman.telemetry import METHOD_ATTRIBUTES, Telemetry

__all__ = ["RateLimitServicer"]

log = logging.getLogger("ferryman.rls")

_CODE_NAMES = {
    value.number: value.name
    for value in rls_pb2.RateLimitResponse.DESCRIPTOR.enum_types_by_name["Code"].values
}


class _Refusal(Exception):
    """A call answered with a gRPC error status (counted already)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    """Answers ShouldRateLimit; malformed requests get INVALID_ARGUMENT, outages UNAVAILABLE."""

    def __init__(
        self, engine: RateLimitEngine, stats: Stats, telemetry: Telemetry | None = None
    ) -> None:
        self._engine = engine
        self._stats = stats
        self._latency = telemetry.request_latency if telemetry is not None else None
        self._telemetry = telemetry if telemetry is not None and telemetry.tracer else None

    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> rls_pb2.RateLimitResponse:
        self._stats.inc(TOTAL_REQUESTS)
        latency = self._latency
        if latency is None and self._telemetry is None:
            # The plain path: no clock read, no span, nothing but the answer.
            try:
                return await self._respond(request)
            except _Refusal as refusal:
                await context.abort(refusal.code, refusal.message)
        start = perf_counter()
        try:
            if self._telemetry is None:
                return await self._respond(request)
            return await self._traced(request, context, self._telemetry)
        except _Refusal as refusal:
            await context.abort(refusal.code, refusal.message)
        finally:
            if latency is not None:
                latency.record(perf_counter() - start, METHOD_ATTRIBUTES)

    async def _traced(
        self,
        request: rls_pb2.RateLimitRequest,
        context: grpc.aio.ServicerContext[Any, Any],
        telemetry: Telemetry,
    ) -> rls_pb2.RateLimitResponse:
        refusal: _Refusal | None = None
        metadata = context.invocation_metadata()
        with telemetry.server_span(metadata, request.domain, len(request.descriptors)) as span:
            try:
                response = await self._respond(request)
            except _Refusal as exc:
                refusal = exc
                span.set_status(Status(StatusCode.ERROR, exc.message))
                span.set_attribute("rpc.grpc.status_code", exc.code.value[0])
            else:
                span.set_attribute("rpc.grpc.status_code", 0)
                span.set_attribute("ratelimit.code", _CODE_NAMES[response.overall_code])
        if refusal is not None:
            raise refusal
        return response

    async def _respond(self, request: rls_pb2.RateLimitRequest) -> rls_pb2.RateLimitResponse:
        try:
            domain, descriptors, hits = request_from_proto(request)
            decision = await self._engine.should_rate_limit(domain, descriptors, hits)
        except RequestError as exc:
            self._stats.inc(f"{CALL}.service_error")
            raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except BackendError as exc:
            self._stats.inc(f"{CALL}.redis_error")
            # Counted, and the backend logs its own state changes: one line per failed
            # call would flood the log during an outage.
            log.debug("backend error: %s", exc)
            raise _Refusal(grpc.StatusCode.UNAVAILABLE, f"rate limit backend: {exc}") from None
        return decision_to_proto(decision)
