"""The wire: request messages, answers into results, gRPC errors into ferryman errors."""

from __future__ import annotations

import math
from collections.abc import Sequence

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.client._models import (
    Code,
    DescriptorStatus,
    Entries,
    HoldGroup,
    RateContext,
    RateLimit,
    RateLimitResult,
    ReserveContext,
)
from ferryman.errors import NotFoundError, RequestError, ServiceUnavailableError

__all__ = [
    "ALLOW",
    "CLIENT_ERRORS",
    "HOLD_METHODS",
    "LIMITER_RELEASE",
    "LIMITER_REQUEST",
    "LIMITER_RESERVE",
    "LIMITER_SEIZE",
    "LIMITER_SESSION",
    "LIMITER_TRANSFER",
    "SESSION_METADATA",
    "SHOULD_RATE_LIMIT",
    "allow_request",
    "channel_credentials",
    "channel_options",
    "open_request",
    "rate_context",
    "rate_request",
    "release_request",
    "reserve_context",
    "reserve_request",
    "rls_request",
    "rls_result",
    "seize_request",
    "transfer_request",
    "translate",
]

SHOULD_RATE_LIMIT = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
LIMITER_REQUEST = "/ferryman.v1.Limiter/Request"
ALLOW = "/quotaservice.QuotaService/Allow"
LIMITER_SESSION = "/ferryman.v1.Limiter/Session"
LIMITER_RESERVE = "/ferryman.v1.Limiter/Reserve"
LIMITER_RELEASE = "/ferryman.v1.Limiter/Release"
LIMITER_TRANSFER = "/ferryman.v1.Limiter/Transfer"
LIMITER_SEIZE = "/ferryman.v1.Limiter/Seize"

#: The unary calls of held resources: (method, request type, response type).
HOLD_METHODS = (
    (LIMITER_RESERVE, limiter_pb2.ReserveRequest, limiter_pb2.ReserveResponse),
    (LIMITER_RELEASE, limiter_pb2.ReleaseRequest, limiter_pb2.ReleaseResponse),
    (LIMITER_TRANSFER, limiter_pb2.TransferRequest, limiter_pb2.TransferResponse),
    (LIMITER_SEIZE, limiter_pb2.SeizeRequest, limiter_pb2.SeizeResponse),
)

#: The metadata entry that names the session of a Reserve, Release, Transfer or Seize.
SESSION_METADATA = "ferryman-session"

# The caller's mistakes: raised whatever fail_open says. Every other status is the
# service failing, which a fail-open client answers in degraded mode (paper, 4.3).
CLIENT_ERRORS: dict[grpc.StatusCode, type[RequestError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: RequestError,
    grpc.StatusCode.OUT_OF_RANGE: RequestError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
}

_CODES = {
    rls_pb2.RateLimitResponse.OK: Code.OK,
    rls_pb2.RateLimitResponse.OVER_LIMIT: Code.OVER_LIMIT,
}
_UNITS = {
    value: name.lower()
    for name, value in rls_pb2.RateLimitResponse.RateLimit.Unit.items()
    if name != "UNKNOWN"
}


def translate(error: grpc.RpcError, target: str) -> RequestError | ServiceUnavailableError:
    """The ferryman error for a failed call: the one place gRPC errors are mapped."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = (error.details() if callable(getattr(error, "details", None)) else None) or ""
    kind = CLIENT_ERRORS.get(code) if code is not None else None
    if kind is not None:
        # The service words client errors as "field: message" (RequestError's own form).
        field, sep, message = details.partition(": ")
        return kind(field, message) if sep else kind("request", details)
    name = code.name if code is not None else "UNKNOWN"
    return ServiceUnavailableError(target, name, details or str(error))


DEFAULT_KEEPALIVE = 10.0  # seconds between pings on a quiet connection
RECONNECT_BACKOFF_MS = 2000


def channel_credentials(
    credentials: grpc.ChannelCredentials | None,
    tls: bool,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
) -> grpc.ChannelCredentials | None:
    """The channel's credentials: ``credentials`` as given, else TLS when ``tls`` or any
    file is given (``ca_file`` to verify the server, default the system's roots;
    ``cert_file`` and ``key_file`` together for mutual TLS), else None (plaintext)."""
    wants_tls = tls or ca_file or cert_file or key_file
    if credentials is not None:
        if wants_tls:
            raise ValueError("give either credentials or tls/ca_file/cert_file/key_file")
        return credentials
    if not wants_tls:
        return None
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together (mutual TLS needs both)")

    def read(name: str, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise ValueError(f"{name}={path!r}: {exc.strerror}") from None

    return grpc.ssl_channel_credentials(
        root_certificates=read("ca_file", ca_file),
        private_key=read("key_file", key_file),
        certificate_chain=read("cert_file", cert_file),
    )


def channel_options(keepalive: float = DEFAULT_KEEPALIVE) -> list[tuple[str, str | int]]:
    """The client channel's arguments. With ``keepalive`` > 0 (seconds), a quiet connection
    is pinged that often and closed when a ping goes unanswered for half as long, so that a
    dead server or a partition ends the session within seconds: its holds are then reported
    lost instead of believed held."""
    from ferryman._version import __version__

    options: list[tuple[str, str | int]] = [
        ("grpc.primary_user_agent", f"ferryman-python/{__version__}"),
        # The client's circuit breaker spaces the calls during an outage; the channel only
        # has to notice soon that the service is back (gRPC's own backoff grows to 2 min).
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
    ]
    if keepalive > 0:
        every = max(1, round(keepalive * 1000))
        options += [
            ("grpc.keepalive_time_ms", every),
            ("grpc.keepalive_timeout_ms", max(1, every // 2)),
            ("grpc.http2.ping_timeout_ms", max(1, every // 2)),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    return options


def rls_request(domain: str, descriptors: Sequence[Entries], hits: int) -> rls_pb2.RateLimitRequest:
    return rls_pb2.RateLimitRequest(
        domain=domain,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[
                    ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries
                ]
            )
            for entries in descriptors
        ],
        hits_addend=hits,
    )


def _seconds(has: bool, seconds: int, nanos: int) -> float | None:
    return seconds + nanos / 1e9 if has else None


def _headers(values: Sequence[base_pb2.HeaderValue]) -> tuple[tuple[str, str], ...]:
    return tuple((h.key, h.value or h.raw_value.decode("utf-8", "replace")) for h in values)


def rls_result(response: rls_pb2.RateLimitResponse) -> RateLimitResult:
    statuses = []
    for s in response.statuses:
        limit = None
        if s.HasField("current_limit"):
            cl = s.current_limit
            limit = RateLimit(cl.requests_per_unit, _UNITS.get(cl.unit, "unknown"), cl.name)
        reset = s.duration_until_reset
        statuses.append(
            DescriptorStatus(
                code=_CODES.get(s.code, Code.UNKNOWN),
                limit=limit,
                remaining=s.limit_remaining,
                reset=_seconds(s.HasField("duration_until_reset"), reset.seconds, reset.nanos),
            )
        )
    return RateLimitResult(
        code=_CODES.get(response.overall_code, Code.UNKNOWN),
        statuses=tuple(statuses),
        headers=_headers(response.response_headers_to_add),
        request_headers=_headers(response.request_headers_to_add),
    )


def rate_request(
    domain: str, entries: Entries, copies: int, min_copies: int, max_wait: float = 0.0
) -> limiter_pb2.RateRequest:
    request = limiter_pb2.RateRequest(
        domain=domain,
        descriptor=[limiter_pb2.Entry(key=k, value=v) for k, v in entries],
        copies=copies,
        min_copies=min_copies,
    )
    if max_wait > 0:
        whole = math.floor(max_wait)
        request.max_wait.seconds = whole
        request.max_wait.nanos = min(999_999_999, round((max_wait - whole) * 1e9))
    return request


def rate_context(response: limiter_pb2.RateResponse) -> RateContext:
    window, retry = response.active_tier_window, response.retry_after
    return RateContext(
        granted=response.granted,
        hard_limit=response.hard_limit if response.HasField("hard_limit") else None,
        global_limit=response.global_limit if response.HasField("global_limit") else None,
        active_tier_index=response.active_tier_index,
        active_tier_limit=response.active_tier_limit,
        active_tier_hits=response.active_tier_hits,
        active_tier_window=_seconds(
            response.HasField("active_tier_window"), window.seconds, window.nanos
        ),
        tenant_hits_last_second=response.tenant_hits_last_second,
        global_hits_last_second=response.global_hits_last_second,
        burst=response.burst,
        limited_by_hard_limit=response.limited_by_hard_limit,
        limited_by_global_limit=response.limited_by_global_limit,
        retry_after=_seconds(response.HasField("retry_after"), retry.seconds, retry.nanos),
        wait=_seconds(response.HasField("wait"), response.wait.seconds, response.wait.nanos),
        tokens_remaining=response.tokens_remaining,
    )


def _entries(entries: Entries) -> list[limiter_pb2.Entry]:
    return [limiter_pb2.Entry(key=k, value=v) for k, v in entries]


def open_request(client_name: str) -> limiter_pb2.SessionRequest:
    return limiter_pb2.SessionRequest(open=limiter_pb2.SessionRequest.Open(client_name=client_name))


def reserve_request(
    domain: str,
    entries: Entries,
    copies: int,
    min_copies: int,
    max_wait: float = 0.0,
    priority: int = 0,
) -> limiter_pb2.ReserveRequest:
    request = limiter_pb2.ReserveRequest(
        domain=domain,
        descriptor=_entries(entries),
        copies=copies,
        min_copies=min_copies,
        priority=priority,
    )
    if max_wait > 0:
        request.max_wait.FromNanoseconds(round(max_wait * 1e9))
    return request


def release_request(
    domain: str, entries: Entries, copies: int, groups: Sequence[str]
) -> limiter_pb2.ReleaseRequest:
    return limiter_pb2.ReleaseRequest(
        domain=domain, descriptor=_entries(entries), copies=copies, groups=list(groups)
    )


def transfer_request(
    domain: str, entries: Entries, copies: int, groups: Sequence[str], ttl: float
) -> limiter_pb2.TransferRequest:
    request = limiter_pb2.TransferRequest(
        domain=domain, descriptor=_entries(entries), copies=copies, groups=list(groups)
    )
    whole = math.floor(ttl)
    request.ttl.seconds = whole
    request.ttl.nanos = min(999_999_999, round((ttl - whole) * 1e9))
    return request


def seize_request(transfer_id: str) -> limiter_pb2.SeizeRequest:
    return limiter_pb2.SeizeRequest(transfer_id=transfer_id)


def reserve_context(response: limiter_pb2.ReserveResponse) -> ReserveContext:
    return ReserveContext(
        granted=response.granted,
        limit=response.limit if response.HasField("limit") else None,
        global_limit=response.global_limit if response.HasField("global_limit") else None,
        tenant_held=response.tenant_held,
        global_held=response.global_held,
        groups=tuple(HoldGroup(g.name, g.limit, g.held) for g in response.groups),
    )


def allow_request(
    namespace: str, bucket: str, tokens: int, max_wait_millis: int | None
) -> quota_service_pb2.AllowRequest:
    request = quota_service_pb2.AllowRequest(
        namespace=namespace, bucket_name=bucket, tokens_requested=tokens
    )
    if max_wait_millis is not None:
        request.max_wait_time_override = True
        request.max_wait_millis_override = max_wait_millis
    return request
