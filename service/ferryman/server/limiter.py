"""Ferryman's own gRPC service, ``ferryman.v1.Limiter``: Charon's operations on descriptors."""

from __future__ import annotations

import logging
import math
from typing import Any

import grpc

from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman.errors import BackendError, NotFoundError, RequestError
from ferryman.limits.engine import RateLimitEngine
from ferryman.stats import Stats

__all__ = ["LimiterServicer"]

log = logging.getLogger("ferryman.limiter")

CALL = "ratelimit.service.call.request"


def _duration(seconds: float, into: Any) -> None:
    whole = math.floor(seconds)
    into.seconds = whole
    into.nanos = round((seconds - whole) * 1e9)


class LimiterServicer(limiter_pb2_grpc.LimiterServicer):
    """Answers Request; client errors get INVALID_ARGUMENT or NOT_FOUND, outages UNAVAILABLE."""

    def __init__(self, engine: RateLimitEngine, stats: Stats) -> None:
        self._engine = engine
        self._stats = stats

    async def Request(
        self, request: limiter_pb2.RateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> limiter_pb2.RateResponse:
        copies = request.copies or 1
        min_copies = request.min_copies if request.HasField("min_copies") else copies
        entries = tuple((e.key, e.value) for e in request.descriptor)
        try:
            if min_copies > copies:
                raise RequestError("min_copies", f"{min_copies} is more than copies ({copies})")
            policy, outcome = await self._engine.request_rate(
                request.domain, entries, copies, min_copies
            )
        except NotFoundError as exc:
            self._stats.inc(f"{CALL}.service_error")
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except RequestError as exc:
            self._stats.inc(f"{CALL}.service_error")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except BackendError as exc:
            self._stats.inc(f"{CALL}.redis_error")
            log.warning("backend error: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"rate limit backend: {exc}")
        reply = limiter_pb2.RateResponse(
            granted=outcome.granted,
            active_tier_index=outcome.tier_index,
            active_tier_limit=outcome.tier_limit,
            active_tier_hits=outcome.tier_hits,
            tenant_hits_last_second=outcome.tenant_last_second,
            global_hits_last_second=outcome.global_last_second,
            burst=outcome.burst,
            limited_by_hard_limit=outcome.limited_by_hard_limit,
            limited_by_global_limit=outcome.limited_by_global_limit,
        )
        if policy.hard_limit is not None:
            reply.hard_limit = policy.hard_limit
        if policy.global_limit is not None:
            reply.global_limit = policy.global_limit
        if math.isfinite(outcome.tier_window):
            _duration(outcome.tier_window, reply.active_tier_window)
        if math.isfinite(outcome.retry_after):
            _duration(outcome.retry_after, reply.retry_after)
        return reply
