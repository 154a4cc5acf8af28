"""What the metrics are named and read from, without OpenTelemetry: the Prometheus families
that are Stats counters, the per-rule stats and their help, the latency buckets, and what
the instruments read of the service's parts (``ferryman.telemetry.instruments`` makes the
instruments, only when metrics are on)."""

from __future__ import annotations

from typing import Protocol

from ferryman.algorithms import ALGORITHMS
from ferryman.stats import (
    CONFIG_LOAD_ERROR,
    CONFIG_LOAD_SUCCESS,
    GLOBAL_SHADOW_MODE,
    RULE_STATS,
    STATS_OVERFLOW,
    VALUES_FOLDED,
)

__all__ = [
    "ERROR_TYPES",
    "FIXED_COUNTERS",
    "LATENCY_BUCKETS",
    "PROMETHEUS_CONTENT_TYPE",
    "RULE_HELP",
    "STATS_COUNTER_FAMILIES",
    "CapacityView",
    "HoldsView",
    "SizedCache",
    "rule_stats",
]

# What a scrape of the metrics port is answered with.
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SizedCache(Protocol):
    """An in-process cache as its gauges read it (the counters' over-limit cache)."""

    @property
    def size_bytes(self) -> int: ...

    def __len__(self) -> int: ...


# Sub-millisecond answers are the norm; seconds mean a stuck backend.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
ERROR_TYPES = ("redis_error", "service_error", "degraded")
_RULE_HELP = {
    "total_hits": "Hits counted against the rule.",
    "over_limit": "Hits over the rule's limit.",
    "within_limit": "Hits within the rule's limit.",
    "shadow_mode": "Over-limit hits let through by the rule's shadow_mode.",
    "domain_not_found": "Requests for a domain that no configuration defines.",
    "unconfigured": "Hits on descriptors that reach no rule of a domain with allow_unconfigured.",
}


def rule_stats() -> dict[str, str]:
    """Every per-rule stat with its help: those of every rule, then each kind's own."""
    out = {stat: _RULE_HELP[stat] for stat in RULE_STATS}
    for algorithm in ALGORITHMS:
        out.update(algorithm.stats)
    return out


#: The per-rule stats, by name, with their help.
RULE_HELP = rule_stats()
# (name, stat, help): the service-wide counters read from Stats.
FIXED_COUNTERS = (
    (
        "ratelimit_service_holds_sessions_opened",
        "ratelimit.service.holds.sessions_opened",
        "Client sessions opened (held resources).",
    ),
    (
        "ratelimit_service_holds_sessions_closed",
        "ratelimit.service.holds.sessions_closed",
        "Client sessions ended; what they held was released.",
    ),
    (
        "ratelimit_service_holds_transfers_staged",
        "ratelimit.service.holds.transfers_staged",
        "Held copies staged for another session.",
    ),
    (
        "ratelimit_service_holds_transfers_seized",
        "ratelimit.service.holds.transfers_seized",
        "Staged copies claimed by a session.",
    ),
    (
        "ratelimit_service_holds_lease_lost",
        "ratelimit.service.holds.lease_lost",
        "Times this server lost its lease on the copy log and ended its sessions.",
    ),
    (
        "ratelimit_service_config_load_success",
        CONFIG_LOAD_SUCCESS,
        "Configuration loads that took effect.",
    ),
    (
        "ratelimit_service_config_load_error",
        CONFIG_LOAD_ERROR,
        "Configuration loads rejected (the previous configuration stayed in force).",
    ),
    (
        "ratelimit_service_global_shadow_mode",
        GLOBAL_SHADOW_MODE,
        "Over-limit answers turned OK by SHADOW_MODE.",
    ),
    (
        "ratelimit_service_decision_log_written",
        "ratelimit.service.decision_log.written",
        "Decisions written to DECISION_LOG.",
    ),
    (
        "ratelimit_service_decision_log_dropped",
        "ratelimit.service.decision_log.dropped",
        "Decisions not written to DECISION_LOG: its queue was full or the file failed.",
    ),
    (
        "ratelimit_service_stats_overflow",
        STATS_OVERFLOW,
        "Increments folded into the overflow series past METRICS_MAX_SERIES.",
    ),
    (
        "ratelimit_service_stats_values_folded",
        VALUES_FOLDED,
        "Increments of request values folded into a rule's _other_ series past MAX_METRIC_SERIES.",
    ),
)

#: The Prometheus families that are Stats counters under their built-in names: with a
#: PROMETHEUS_MAPPER_YAML file these are served through the mapping instead.
STATS_COUNTER_FAMILIES = frozenset(
    [f"ratelimit_service_rate_limit_{stat}" for stat in RULE_HELP]
    + [name for name, _, _ in FIXED_COUNTERS]
    + [
        "ratelimit_service_should_rate_limit_error",
        "ratelimit_service_total_requests",
        "ratelimit_service_local_cache_hits",
    ]
)


class HoldsView(Protocol):
    """What the held-resource instruments read (the server's HoldManager)."""

    @property
    def transfers_expired(self) -> int: ...

    def session_count(self) -> int: ...

    def copies_count(self) -> int: ...

    def by_node(self) -> list[tuple[dict[str, str], int]]: ...

    def by_group(self) -> list[tuple[dict[str, str], int]]: ...


class CapacityView(Protocol):
    """What the capacity lease instruments read (the server's CapacityService)."""

    def by_resource(self) -> list[tuple[dict[str, str], tuple[float, float, float, int]]]: ...

    def unconfigured_requests(self) -> int: ...
