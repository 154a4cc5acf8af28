"""The Envoy rate limit service: ``envoy.service.ratelimit.v3.RateLimitService``."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from ferryman.errors import BackendError, RequestError
from ferryman.limits.engine import RateLimitEngine
from ferryman.server.convert import decision_to_proto, request_from_proto
from ferryman.stats import Stats

__all__ = ["RateLimitServicer"]

log = logging.getLogger("ferryman.rls")

CALL = "ratelimit.service.call.should_rate_limit"


class RateLimitServicer(rls_pb2_grpc.RateLimitServiceServicer):
    """Answers ShouldRateLimit; malformed requests get INVALID_ARGUMENT, outages UNAVAILABLE."""

    def __init__(self, engine: RateLimitEngine, stats: Stats) -> None:
        self._engine = engine
        self._stats = stats

    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> rls_pb2.RateLimitResponse:
        try:
            domain, descriptors, hits = request_from_proto(request)
            decision = await self._engine.should_rate_limit(domain, descriptors, hits)
        except RequestError as exc:
            self._stats.inc(f"{CALL}.service_error")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except BackendError as exc:
            self._stats.inc(f"{CALL}.redis_error")
            log.warning("backend error: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"rate limit backend: {exc}")
        return decision_to_proto(decision)
