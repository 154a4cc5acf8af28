"""The protocols ferryman answers, and the services that hold their state (holds, capacity
leases, token buckets, the config API, the console and the debug pages).

``APIS`` is the one registry of the gRPC services: a protocol is its module, which declares
one ``API`` (see ``ferryman.apis.api``), and one line here: a ``Deferred``, by its name,
imports its module on its first call, so that a process loads the servicers and messages
of the protocols its callers use. The service registers, starts and reports the health of
each in this order, and stops them in reverse.
"""

from __future__ import annotations

from ferryman.apis import capacity_service, health, rlqs, rls
from ferryman.apis.api import API, Deferred

__all__ = ["API", "APIS", "Deferred"]

APIS: tuple[API | Deferred, ...] = (
    rls.API,
    Deferred("ferryman.v1.Limiter", "ferryman.apis.limiter", health=("ferryman.v1.Limiter",)),
    Deferred(
        "quotaservice.QuotaService", "ferryman.apis.quota", health=("quotaservice.QuotaService",)
    ),
    Deferred("ferryman.v1.QuotaEvents", "ferryman.apis.quota_events"),
    Deferred(
        "doorman.Capacity",
        "ferryman.apis.capacity",
        health=("doorman.Capacity",),
        start=capacity_service.serving,
    ),
    Deferred(
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "ferryman.apis.rlqs_grpc",
        health=("envoy.service.rate_limit_quota.v3.RateLimitQuotaService",),
        start=rlqs.serving,
    ),
    health.API,  # last: the first to drain, so that probes see NOT_SERVING at once
)
