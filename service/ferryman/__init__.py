"""Ferryman: a rate limit service for service meshes.

It answers Envoy's rate limit protocol (``envoy.service.ratelimit.v3.RateLimitService``) as a
drop-in replacement for the reference service, from descriptor YAML that it reloads on change.
``ferryman.Client`` and ``ferryman.AsyncClient`` are its Python client (see ferryman.client).
"""

from typing import TYPE_CHECKING, Any

from ferryman._version import __version__
from ferryman.errors import (
    BackendError,
    BackendTimeoutError,
    ConfigError,
    FerrymanError,
    HoldError,
    NotFoundError,
    RateLimitedError,
    RequestError,
    ServiceUnavailableError,
    SettingsError,
)

if TYPE_CHECKING:
    from ferryman.client import (
        AllowResult,
        AsyncCapacityClient,
        AsyncClient,
        AsyncHold,
        AsyncRateLimitInterceptor,
        CapacityClient,
        CapacityResource,
        CapacityStats,
        Client,
        ClientStats,
        Code,
        DescriptorLike,
        DescriptorStatus,
        Gauge,
        Hold,
        HoldGroup,
        MultiHold,
        RateContext,
        RateLimit,
        RateLimiter,
        RateLimitInterceptor,
        RateLimitResult,
        RateResult,
        ReserveContext,
        Resource,
        Route,
        RouteFunction,
    )

__all__ = [
    "AllowResult",
    "AsyncCapacityClient",
    "AsyncClient",
    "AsyncHold",
    "AsyncRateLimitInterceptor",
    "BackendError",
    "BackendTimeoutError",
    "CapacityClient",
    "CapacityResource",
    "CapacityStats",
    "Client",
    "ClientStats",
    "Code",
    "ConfigError",
    "DescriptorLike",
    "DescriptorStatus",
    "FerrymanError",
    "Gauge",
    "Hold",
    "HoldError",
    "HoldGroup",
    "MultiHold",
    "NotFoundError",
    "RateContext",
    "RateLimit",
    "RateLimitInterceptor",
    "RateLimitResult",
    "RateLimitedError",
    "RateLimiter",
    "RateResult",
    "RequestError",
    "ReserveContext",
    "Resource",
    "Route",
    "RouteFunction",
    "ServiceUnavailableError",
    "SettingsError",
    "__version__",
]

# The client (and grpc with it) is loaded on first use, so that the pure parts of the
# package (config, algorithms, engine) import without it: every exported name not bound here.
_CLIENT = frozenset(__all__) - frozenset(globals())


def __getattr__(name: str) -> Any:
    if name in _CLIENT:
        from ferryman import client

        return getattr(client, name)
    raise AttributeError(f"module 'ferryman' has no attribute {name!r}")
