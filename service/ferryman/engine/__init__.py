"""The decision engine: requests matched against the config, planned per rule policy,
counted by the backend's stores in one round trip, answered."""

from ferryman.engine.engine import ALGORITHMS, BackendTimer, RateLimitEngine
from ferryman.engine.model import (
    MAX_REMAINING,
    Code,
    ConfigSource,
    Decision,
    DescriptorRequest,
    EngineOptions,
    Status,
)

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
