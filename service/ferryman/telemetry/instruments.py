"""The instruments: the reference's counters read from Stats when a reader collects, the
held-resource, capacity and backend-connection gauges, and the latency buckets."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
from opentelemetry.util.types import Attributes

from ferryman.backends.base import ConnectionState, Watched
from ferryman.stats import (
    CALL,
    LOCAL_CACHE_HITS,
    Stats,
    total_requests,
)
from ferryman.telemetry.families import (
    ERROR_TYPES,
    FIXED_COUNTERS,
    LATENCY_BUCKETS,
    PROMETHEUS_CONTENT_TYPE,
    RULE_HELP,
    STATS_COUNTER_FAMILIES,
    CapacityView,
    HoldsView,
    SizedCache,
    rule_stats,
)

__all__ = [
    "LATENCY_BUCKETS",
    "PROMETHEUS_CONTENT_TYPE",
    "RULE_HELP",
    "STATS_COUNTER_FAMILIES",
    "CapacityView",
    "HoldsView",
    "Milliseconds",
    "SizedCache",
    "backend_instruments",
    "capacity_instruments",
    "holds_instruments",
    "rule_stats",
    "stats_instruments",
]


class _RuleView:
    """One read of Stats' per-rule series, shared by the instruments of one collection.

    A callback that was already served from the current read starts a new one, so a
    collection reads Stats once and no callback ever sees a read older than its last one.
    """

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._lock = threading.Lock()
        self._by_stat: dict[str, list[Observation]] = {}
        self._served: set[str] = set(RULE_HELP)
        self._attributes: dict[
            tuple[tuple[str, ...] | None, tuple[tuple[str, str], ...]], dict[str, str]
        ] = {}

    def callback(self, stat: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return self.observe(stat)

        return observe

    def observe(self, stat: str) -> list[Observation]:
        with self._lock:
            if stat in self._served:
                self._read()
            self._served.add(stat)
            return self._by_stat.get(stat, [])

    def _read(self) -> None:
        grouped: dict[str, list[Observation]] = {}
        cache = self._attributes
        for stat, path, labels, value in self._stats.rule_series():
            attributes = cache.get((path, labels))
            if attributes is None:
                attributes = cache[path, labels] = {**_path_attributes(path), **dict(labels)}
            grouped.setdefault(stat, []).append(Observation(value, attributes))
        self._by_stat = grouped
        self._served = set()


def _path_attributes(path: tuple[str, ...] | None) -> dict[str, str]:
    """(domain, level1, level2...) -> {domain, key1, key2...}; the overflow series has none."""
    if path is None:
        return {"overflow": "true"}
    attributes = {"domain": path[0]}
    for i, level in enumerate(path[1:], 1):
        attributes[f"key{i}"] = level
    return attributes


def _counter_callback(
    stats: Stats, name: str, attributes: Mapping[str, str] | None = None
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(stats.get(name), attributes)]

    return observe


class Milliseconds(Histogram):
    """A histogram fed seconds that records milliseconds."""

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram

    def record(
        self,
        amount: float,
        attributes: Attributes = None,
        context: Context | None = None,
    ) -> None:
        self._histogram.record(amount * 1000, attributes, context)


def holds_instruments(meter: Meter, holds: HoldsView, max_series: int) -> None:
    """Instruments for held resources: sessions, copies held (in all, per node, per node
    and group; nodes and groups come from configuration, and at most ``max_series``
    readings are reported), and transfers that lapsed unclaimed."""
    sessions = holds.session_count
    copies = holds.copies_count

    def readings(
        read: Callable[[], list[tuple[dict[str, str], int]]],
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, labels) for labels, value in read()[:max_series]]

        return observe

    meter.create_observable_gauge(
        "ratelimit_service_holds_copies_held_by_node",
        callbacks=[readings(holds.by_node)],
        description="Copies held by this server's sessions, per copy-limited node.",
    )
    meter.create_observable_gauge(
        "ratelimit_service_holds_copies_held_by_group",
        callbacks=[readings(holds.by_group)],
        description="Copies held by this server's sessions, per node and copy group.",
    )
    meter.create_observable_counter(
        "ratelimit_service_holds_transfers_expired",
        callbacks=[lambda options: [Observation(holds.transfers_expired)]],
        description="Staged copies nobody claimed within the transfer's ttl (given back "
        "to the pools).",
    )
    meter.create_observable_gauge(
        "ratelimit_service_holds_sessions_open",
        callbacks=[lambda options: [Observation(sessions())]],
        description="Client sessions open on this server.",
    )
    meter.create_observable_gauge(
        "ratelimit_service_holds_copies_held",
        callbacks=[lambda options: [Observation(copies())]],
        description="Copies held by this server's sessions.",
    )


def capacity_instruments(meter: Meter, capacity: CapacityView, max_series: int) -> None:
    """Instruments for capacity leases, per resource this server holds leases on:
    capacity, the sum of leases and of wants, clients; and unconfigured requests."""

    def reading(index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            rows = capacity.by_resource()[:max_series]
            return [
                Observation(values[index], labels)
                for labels, values in rows
                if math.isfinite(values[index])
            ]

        return observe

    for index, (name, text) in enumerate(
        (
            ("capacity", "Capacity to divide among the resource's clients."),
            ("leased", "Sum of the capacity of the resource's live leases."),
            ("wanted", "Sum of what the resource's clients want."),
            ("clients", "Clients holding a live lease on the resource."),
        )
    ):
        meter.create_observable_gauge(
            f"ratelimit_service_capacity_{name}", callbacks=[reading(index)], description=text
        )
    meter.create_observable_counter(
        "ratelimit_service_capacity_unconfigured_requests",
        callbacks=[lambda options: [Observation(capacity.unconfigured_requests())]],
        description="Capacity requested for resources no template covers (granted as asked).",
    )


def backend_instruments(meter: Meter, backend: Watched) -> None:
    """Instruments for the backend's connections: state (one series per state, 1 for the
    current one), transitions by new state and reason, and the breaker's counts."""

    def states(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(int(c.state == state), {"target": c.name, "state": state})
            for c in backend.connections()
            for state in ("up", "degraded", "down")
        ]

    def transitions(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"target": c.name, "state": state, "reason": kind})
            for c in backend.connections()
            for (state, kind), n in c.transitions.items()
        ]

    def count(read: Callable[[ConnectionState], int]) -> Callable[..., Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(read(c), {"target": c.name}) for c in backend.connections()]

        return observe

    meter.create_observable_gauge(
        "ratelimit_service_backend_state",
        callbacks=[states],
        description="1 for the backend connection's current state (up, degraded, down).",
    )
    meter.create_observable_counter(
        "ratelimit_service_backend_state_transitions",
        callbacks=[transitions],
        description="Changes of the backend connection's state, by new state and reason.",
    )
    meter.create_observable_counter(
        "ratelimit_service_backend_breaker_refused_calls",
        callbacks=[count(lambda c: c.refused)],
        description="Calls answered with the failure policy without asking the backend "
        "(its breaker was open).",
    )
    meter.create_observable_counter(
        "ratelimit_service_backend_breaker_opened",
        callbacks=[count(lambda c: c.breaker_opened)],
        description="Times the backend connection's breaker opened.",
    )
    meter.create_observable_counter(
        "ratelimit_service_backend_probes",
        callbacks=[count(lambda c: c.probes)],
        description="Health probes sent to the backend (each may open a connection).",
    )


def stats_instruments(
    meter: Meter,
    stats: Stats,
    local_cache: SizedCache | None,
    methods: Sequence[str],
) -> None:
    """Create the instruments that read ``stats`` (calls of each gRPC method in
    ``methods``) and the local cache; once."""
    view = _RuleView(stats)
    for stat, description in RULE_HELP.items():
        meter.create_observable_counter(
            f"ratelimit_service_rate_limit_{stat}",
            callbacks=[view.callback(stat)],
            description=description,
        )
    for name, stat_name, description in FIXED_COUNTERS:
        meter.create_observable_counter(
            name, callbacks=[_counter_callback(stats, stat_name)], description=description
        )
    meter.create_observable_counter(
        "ratelimit_service_should_rate_limit_error",
        callbacks=[
            _counter_callback(stats, f"{CALL}.{kind}", {"err_type": kind}) for kind in ERROR_TYPES
        ],
        description="Calls answered with an error (redis_error, service_error) "
        "or, with FAIL_OPEN, answered OK without the backend (degraded).",
    )
    meter.create_observable_counter(
        "ratelimit_service_total_requests",
        callbacks=[
            _counter_callback(stats, total_requests(m), {"grpc_method": m}) for m in methods
        ],
        description="Calls received, by gRPC method.",
    )
    if local_cache is None:
        return
    cache = local_cache
    meter.create_observable_counter(
        "ratelimit_service_local_cache_hits",
        callbacks=[_counter_callback(stats, LOCAL_CACHE_HITS)],
        description="Descriptors answered OVER_LIMIT from the local cache, without the backend.",
    )
    meter.create_observable_gauge(
        "ratelimit_service_local_cache_size_bytes",
        callbacks=[lambda options: [Observation(cache.size_bytes)]],
        unit="By",
        description="Estimated bytes held by the local over-limit cache.",
    )
    meter.create_observable_gauge(
        "ratelimit_service_local_cache_entries",
        callbacks=[lambda options: [Observation(len(cache))]],
        description="Keys held by the local over-limit cache.",
    )
