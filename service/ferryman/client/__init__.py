"""The Python client for ferryman: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both ask the service over gRPC: ``should_rate_limit`` (Envoy's API) and ``request_rate``
(Charon burst tiers, retried with exponential backoff within ``max_wait``). An unreachable
or failing service gives degraded grants (``fail_open=True``, the default) or
ServiceUnavailableError; a kill switch turns rejections into reported grants. The
interceptors rate-limit a program's own outgoing gRPC calls through a client.

Held resources (reserve, release, transfer, seize) will join these classes as methods.
"""

from ferryman.client._async import AsyncClient
from ferryman.client._core import DEFAULT_TIMEOUT
from ferryman.client._interceptor import (
    AsyncRateLimitInterceptor,
    RateLimitInterceptor,
    Route,
    RouteFunction,
)
from ferryman.client._models import (
    ClientStats,
    Code,
    DescriptorLike,
    DescriptorStatus,
    RateContext,
    RateLimit,
    RateLimitResult,
    RateResult,
)
from ferryman.client._sync import Client

__all__ = [
    "DEFAULT_TIMEOUT",
    "AsyncClient",
    "AsyncRateLimitInterceptor",
    "Client",
    "ClientStats",
    "Code",
    "DescriptorLike",
    "DescriptorStatus",
    "RateContext",
    "RateLimit",
    "RateLimitInterceptor",
    "RateLimitResult",
    "RateResult",
    "Route",
    "RouteFunction",
]
