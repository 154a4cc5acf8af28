"""Translation between RLS v3 protobuf messages and the engine's values, at one boundary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import struct_pb2

from ferryman.core.rules import Unit, UnitLimit
from ferryman.core.wire import mark_negative_hits, negative_hits
from ferryman.engine import Code, Decision, DescriptorRequest
from ferryman.errors import RequestError

__all__ = [
    "decision_to_proto",
    "encode_decision",
    "mark_negative_hits",
    "negative_hits",
    "request_from_proto",
]

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
            limit = UnitLimit(d.limit.requests_per_unit, unit)
        hits = d.hits_addend.value if d.HasField("hits_addend") else None
        descriptors.append(
            DescriptorRequest(
                tuple([(e.key, e.value) for e in d.entries]), limit, hits, negative_hits(d)
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


# Wire tags (field number << 3 | wire type) of the RateLimitResponse fields encode_decision
# writes: varints (0) and length-delimited messages (2).
_OVERALL_CODE = b"\x08"  # RateLimitResponse.overall_code = 1
_STATUS = b"\x12"  # RateLimitResponse.statuses = 2
_CODE = b"\x08"  # DescriptorStatus.code = 1
_CURRENT_LIMIT = b"\x12"  # DescriptorStatus.current_limit = 2
_REMAINING = b"\x18"  # DescriptorStatus.limit_remaining = 3
_RESET = b"\x22"  # DescriptorStatus.duration_until_reset = 4
_SECONDS = b"\x08"  # Duration.seconds = 1
_SMALL = [bytes((n,)) for n in range(0x80)]  # the varints of one byte
_UINT32 = 2**32 - 1

#: Encoded current_limit messages, by the limit's id (the entry holds the limit, so its id
#: stays its own); cleared when full.
_LIMITS: dict[int, tuple[UnitLimit, bytes]] = {}
_LIMITS_MAX = 4096


def _varint(n: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    if n < 0:
        raise ValueError(f"no varint for {n}")
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _limit_field(limit: UnitLimit) -> bytes:
    """DescriptorStatus.current_limit of ``limit``, tag and length included."""
    kept = _LIMITS.get(id(limit))
    if kept is not None:
        return kept[1]
    message = rls_pb2.RateLimitResponse.RateLimit(
        requests_per_unit=limit.requests_per_unit, name=limit.name
    )
    assert limit.unit is not None
    message.unit = _LIMIT_UNITS[limit.unit]
    body = message.SerializeToString()
    field = _CURRENT_LIMIT + _varint(len(body)) + body
    if len(_LIMITS) >= _LIMITS_MAX:
        _LIMITS.clear()
    _LIMITS[id(limit)] = (limit, field)
    return field


def encode_decision(decision: Decision) -> bytes:
    """``decision_to_proto(decision).SerializeToString()``, the same bytes, written directly
    for the answers that carry only codes and statuses (the others go through the message):
    what the RLS edge sends, without a message object per answer."""
    if decision.headers or decision.metadata is not None:
        return decision_to_proto(decision).SerializeToString()
    code = decision.code
    out = [_OVERALL_CODE, _SMALL[code]] if code else []
    for s in decision.statuses:
        parts = [_CODE, _SMALL[s.code]] if s.code else []
        limit = s.limit
        if limit is not None and limit.unit is not None:
            parts.append(_limit_field(limit))
        remaining = s.remaining
        if remaining:
            if not 0 < remaining <= _UINT32:  # out of range: the message's encoder refuses it
                return decision_to_proto(decision).SerializeToString()
            parts += (_REMAINING, _varint(remaining))
        reset = s.reset_after
        if reset is not None:
            if reset > 0:
                seconds = _varint(reset)
                parts += (_RESET, _SMALL[len(seconds) + 1], _SECONDS, seconds)
            elif reset == 0:
                parts += (_RESET, b"\x00")  # present, and empty
            else:  # a negative int64: the message's encoder writes it
                return decision_to_proto(decision).SerializeToString()
        body = b"".join(parts)
        out += (_STATUS, _varint(len(body)), body)
    return b"".join(out)
