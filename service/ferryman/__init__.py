"""Ferryman: a rate limit service for service meshes.

It answers Envoy's rate limit protocol (``envoy.service.ratelimit.v3.RateLimitService``) as a
drop-in replacement for the reference service, from descriptor YAML that it reloads on change.
``ferryman.Client`` and ``ferryman.AsyncClient`` are its Python client (see ferryman.client).
"""

from ferryman.client import (
    AllowResult,
    AsyncClient,
    AsyncHold,
    AsyncRateLimitInterceptor,
    Client,
    ClientStats,
    Code,
    DescriptorLike,
    DescriptorStatus,
    Hold,
    HoldGroup,
    MultiHold,
    RateContext,
    RateLimit,
    RateLimitInterceptor,
    RateLimitResult,
    RateResult,
    ReserveContext,
    Resource,
    Route,
    RouteFunction,
)
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

__version__ = "0.1.0"

__all__ = [
    "AllowResult",
    "AsyncClient",
    "AsyncHold",
    "AsyncRateLimitInterceptor",
    "BackendError",
    "BackendTimeoutError",
    "Client",
    "ClientStats",
    "Code",
    "ConfigError",
    "DescriptorLike",
    "DescriptorStatus",
    "FerrymanError",
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
