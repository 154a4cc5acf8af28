"""Translation between RLS v3 protobuf messages and the engine's values, at one boundary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import struct_pb2

from ferryman._proto.envoy.config.core.v3 import base_pb2
from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2
from ferryman.config.model import RateLimit, Unit
from ferryman.engine import Code, Decision, DescriptorRequest
from ferryman.errors import RequestError

__all__ = ["decision_to_proto", "request_from_proto"]

_UNITS = {u.value: u for u in Unit}
_CODES: dict[Code, Any] = {c: rls_pb2.RateLimitResponse.Code.Value(c.name) for c in Code}
_LIMIT_UNITS: dict[Unit, Any] = {
    u: rls_pb2.RateLimitResponse.RateLimit.Unit.Value(u.name) for u in Unit
}


def request_from_proto(
    request: rls_pb2.RateLimitRequest,
) -> tuple[str, list[DescriptorRequest], int]:
    """(domain, descriptors, hits_addend) of a request; RequestError names a bad field."""
    descriptors: list[DescriptorRequest] = []
    for i, d in enumerate(request.descriptors):
        limit = None
        if d.HasField("limit"):
            unit = _UNITS.get(d.limit.unit)
            if unit is None:
                raise RequestError(
                    f"descriptors[{i}].limit.unit",
                    f"unknown unit {d.limit.unit} (SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR)",
                )
            limit = RateLimit(d.limit.requests_per_unit, unit)
        hits = d.hits_addend.value if d.HasField("hits_addend") else None
        descriptors.append(
            DescriptorRequest(
                tuple([(e.key, e.value) for e in d.entries]), limit, hits, d.is_negative_hits
            )
        )
    return request.domain, descriptors, request.hits_addend


def _struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(dict(values))
    return out


def decision_to_proto(decision: Decision) -> rls_pb2.RateLimitResponse:
    response = rls_pb2.RateLimitResponse(overall_code=_CODES[decision.code])
    add = response.statuses.add  # built in place: no copy of each status into the list
    for s in decision.statuses:
        status = add(code=_CODES[s.code], limit_remaining=s.remaining)
        limit = s.limit
        if limit is not None and limit.unit is not None:
            current = status.current_limit
            current.requests_per_unit = limit.requests_per_unit
            current.unit = _LIMIT_UNITS[limit.unit]
            if limit.name:
                current.name = limit.name
        if s.reset_after is not None:
            status.duration_until_reset.seconds = s.reset_after
    if decision.headers:
        response.response_headers_to_add.extend(
            base_pb2.HeaderValue(key=k, value=v) for k, v in decision.headers
        )
    if decision.metadata is not None:
        response.dynamic_metadata.CopyFrom(_struct(decision.metadata))
    return response
