"""Ferryman: a rate limit service for service meshes.

It answers Envoy's rate limit protocol (``envoy.service.ratelimit.v3.RateLimitService``) as a
drop-in replacement for the reference service, from descriptor YAML that it reloads on change.
"""

from ferryman.errors import (
    BackendError,
    BackendTimeoutError,
    ConfigError,
    FerrymanError,
    RequestError,
    SettingsError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendTimeoutError",
    "ConfigError",
    "FerrymanError",
    "RequestError",
    "SettingsError",
    "__version__",
]
