"""The Python client for ferryman: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Both ask the service over gRPC: ``should_rate_limit`` (Envoy's API), ``allow`` (the quota
service's token buckets; it sleeps the wait the service grants), ``request_rate``
(Charon burst tiers, retried with exponential backoff within ``max_wait``), and held
resources: ``hold_copy`` and ``seize_copy`` (context managers over a ``Hold`` that can be
partly released or transferred to another process) and ``hold_resources`` (several
resources at once, pseudo-atomically). Holds belong to the client's session, a stream the
service watches: if the client dies, the service releases what it held. An unreachable
or failing service gives degraded grants (``fail_open=True``, the default) or
ServiceUnavailableError; a kill switch turns rejections into reported grants. The
interceptors rate-limit a program's own outgoing gRPC calls through a client.
``CapacityClient`` (and ``AsyncCapacityClient``) leases shares of global capacities
(Doorman's protocol) and refreshes them in the background; ``RateLimiter`` and ``Gauge``
enforce a lease's capacity locally, with no call per use. ``bucket`` keeps a local reserve
of a quota bucket refilled in batches, and ``charge`` accounts for tokens after the fact.
While the service is out of reach a ``fallback_rate`` answers from token buckets in process,
and a circuit breaker stops calling after repeated outages.
"""

from ferryman.client._async import AsyncClient, AsyncHold
from ferryman.client._bucket import AsyncLocalBucket, BucketStats, LocalBucket
from ferryman.client._capacity import (
    AsyncCapacityClient,
    CapacityClient,
    CapacityResource,
    CapacityStats,
)
from ferryman.client._core import DEFAULT_TIMEOUT
from ferryman.client._interceptor import (
    AsyncRateLimitInterceptor,
    RateLimitInterceptor,
    Route,
    RouteFunction,
)
from ferryman.client._leased import Gauge, RateLimiter
from ferryman.client._models import (
    AllowResult,
    ClientStats,
    Code,
    DescriptorLike,
    DescriptorStatus,
    HoldGroup,
    MultiHold,
    RateContext,
    RateLimit,
    RateLimitResult,
    RateResult,
    ReserveContext,
    Resource,
)
from ferryman.client._sync import Client, Hold

__all__ = [
    "DEFAULT_TIMEOUT",
    "AllowResult",
    "AsyncCapacityClient",
    "AsyncClient",
    "AsyncHold",
    "AsyncLocalBucket",
    "AsyncRateLimitInterceptor",
    "BucketStats",
    "CapacityClient",
    "CapacityResource",
    "CapacityStats",
    "Client",
    "ClientStats",
    "Code",
    "DescriptorLike",
    "DescriptorStatus",
    "Gauge",
    "Hold",
    "HoldGroup",
    "LocalBucket",
    "MultiHold",
    "RateContext",
    "RateLimit",
    "RateLimitInterceptor",
    "RateLimitResult",
    "RateLimiter",
    "RateResult",
    "ReserveContext",
    "Resource",
    "Route",
    "RouteFunction",
]
