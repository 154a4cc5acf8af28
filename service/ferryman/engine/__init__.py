"""The decision engine: requests matched against the config, planned by each rule kind's
limiter, counted by the backend's stores in one round trip, answered."""

from ferryman.core.answers import (
    MAX_REMAINING,
    Code,
    Decision,
    DescriptorRequest,
    EngineOptions,
    Status,
)
from ferryman.engine.engine import ALGORITHMS, BackendTimer, ConfigSource, RateLimitEngine

__all__ = [
    "ALGORITHMS",
    "MAX_REMAINING",
    "BackendTimer",
    "Code",
    "ConfigSource",
    "Decision",
    "DescriptorRequest",
    "EngineOptions",
    "RateLimitEngine",
    "Status",
]
