"""OpenTelemetry metrics and traces of one Service, instruments created once at startup.

Metrics. The reference's counters live in ``Stats`` (exact, bounded by METRICS_MAX_SERIES);
they are exposed as ObservableCounters whose callbacks read Stats when a reader collects, so
a request pays nothing for them. The per-rule stat ``ratelimit.service.rate_limit.<domain>.
<level1>[.<level2>...].<stat>`` becomes ``ratelimit_service_rate_limit_<stat>`` with labels
``domain``, ``key1``, ``key2``... as in the reference's statsd-to-Prometheus mapping. Latencies
are histograms, one record per call. Readers: ``PrometheusReader`` (USE_PROMETHEUS: rendered on
scrape, under the reference's names, no ``_total`` added) and an OTLP/gRPC push reader when
OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT is set. With neither, no meter exists at all.

Traces (TRACING_ENABLED). A SERVER span per ShouldRateLimit, child of the caller's context
taken from the gRPC metadata (W3C ``traceparent``, B3 single ``b3`` or multi ``x-b3-*``), with
the backend call as a CLIENT child span; ParentBased(TraceIdRatioBased(TRACING_SAMPLING_RATE)).
Disabled, the request path creates no span at all (the servicer takes another branch).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from time import perf_counter
from typing import Protocol, TypeVar

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Histogram, Observation
from opentelemetry.propagators.b3 import B3MultiFormat
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
)
from opentelemetry.sdk.metrics.export import (
    Gauge,
    HistogramDataPoint,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Tracer, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from ferryman._version import __version__
from ferryman.algorithms.fixed_window.local_cache import OverLimitCache
from ferryman.backends.base import Backend, ConnectionState, Watched
from ferryman.engine import ALGORITHMS, BackendTimer
from ferryman.settings import Settings
from ferryman.stats import (
    CALL,
    CONFIG_LOAD_ERROR,
    CONFIG_LOAD_SUCCESS,
    GLOBAL_SHADOW_MODE,
    LOCAL_CACHE_HITS,
    RULE_STATS,
    STATS_OVERFLOW,
    Stats,
    total_requests,
)

__all__ = [
    "PROMETHEUS_CONTENT_TYPE",
    "STATS_COUNTER_FAMILIES",
    "PrometheusReader",
    "Telemetry",
    "http_traces_url",
    "render_prometheus",
    "telemetry_resource",
]

log = logging.getLogger("ferryman.telemetry")
T = TypeVar("T")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SCOPE = "ferryman"
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
SHUTDOWN_TIMEOUT_MILLIS = 5_000
_ERROR_TYPES = ("redis_error", "service_error", "degraded")
_RULE_HELP = {
    "total_hits": "Hits counted against the rule.",
    "over_limit": "Hits over the rule's limit.",
    "near_limit": "Hits within the limit but above NEAR_LIMIT_RATIO of it.",
    "within_limit": "Hits within the rule's limit.",
    "shadow_mode": "Over-limit hits let through by the rule's shadow_mode.",
    "over_limit_with_local_cache": "Over-limit hits answered from the local over-limit cache.",
    "domain_not_found": "Requests for a domain that no configuration defines.",
    "burst": "Requests on a burst-tier node that entered a higher tier.",
    "tier_hits": "Hits granted on a burst-tier node, by the tier the tenant was in after them.",
}
# (name, stat, help): the service-wide counters read from Stats.
_FIXED_COUNTERS = (
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
        "ratelimit_service_stats_overflow",
        STATS_OVERFLOW,
        "Increments folded into the overflow series past METRICS_MAX_SERIES.",
    ),
)

#: The Prometheus families that are Stats counters under their built-in names: with a
#: PROMETHEUS_MAPPER_YAML file these are served through the mapping instead.
STATS_COUNTER_FAMILIES = frozenset(
    [f"ratelimit_service_rate_limit_{stat}" for stat in RULE_STATS]
    + [name for name, _, _ in _FIXED_COUNTERS]
    + [
        "ratelimit_service_should_rate_limit_error",
        "ratelimit_service_total_requests",
        "ratelimit_service_local_cache_hits",
    ]
)


DEFAULT_SERVICE_NAME = "RateLimit"


def telemetry_resource(settings: Settings) -> Resource:
    """The reference's TRACING_SERVICE_NAME / _NAMESPACE / _INSTANCE_ID when set; else
    OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the service is "RateLimit" otherwise,
    as the reference names it."""
    resource = Resource.create({"service.version": __version__})
    own: dict[str, str] = {}
    if settings.tracing_service_name:
        own[SERVICE_NAME] = settings.tracing_service_name
    elif str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        own[SERVICE_NAME] = DEFAULT_SERVICE_NAME
    if settings.tracing_service_namespace:
        own["service.namespace"] = settings.tracing_service_namespace
    if settings.tracing_service_instance_id:
        own["service.instance.id"] = settings.tracing_service_instance_id
    return resource.merge(Resource(own)) if own else resource


# --------------------------------------------------------------------------- Prometheus text

_NAME_BAD = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")


def _metric_name(name: str) -> str:
    name = _NAME_BAD.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


def _label_name(name: str) -> str:
    name = _LABEL_BAD.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


def _label_value(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _labels(attributes: Mapping[str, object] | None, extra: str = "") -> str:
    parts = [f'{_label_name(k)}="{_label_value(v)}"' for k, v in (attributes or {}).items()]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def render_prometheus(data: MetricsData | None, leave_out: frozenset[str] = frozenset()) -> str:
    """Prometheus text exposition (0.0.4) of ``data``, metric names kept exactly as given.

    Monotonic sums are counters (no ``_total`` is added: the reference's names are the
    contract), other sums and gauges are gauges, histograms are ``_bucket``/``_sum``/``_count``.
    """
    families: dict[str, tuple[str, str, list[str]]] = {}
    for resource_metrics in data.resource_metrics if data is not None else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                name = _metric_name(metric.name)
                if name in leave_out:
                    continue
                point_data = metric.data
                lines: list[str] = []
                if isinstance(point_data, Sum):
                    kind = "counter" if point_data.is_monotonic else "gauge"
                    for point in point_data.data_points:
                        lines.append(_sample(name, point))
                elif isinstance(point_data, Gauge):
                    kind = "gauge"
                    for point in point_data.data_points:
                        lines.append(_sample(name, point))
                elif isinstance(point_data, HistogramData):
                    kind = "histogram"
                    for hpoint in point_data.data_points:
                        lines.extend(_histogram(name, hpoint))
                else:  # exponential histograms: not configured by ferryman
                    continue
                family = families.setdefault(name, (kind, metric.description or "", []))
                family[2].extend(lines)
    out: list[str] = []
    for name, (kind, description, lines) in families.items():
        if description:
            out.append(f"# HELP {name} {_help(description)}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
    return "\n".join(out) + "\n" if out else ""


def _sample(name: str, point: NumberDataPoint) -> str:
    return f"{name}{_labels(point.attributes)} {_number(point.value)}"


def _histogram(name: str, point: HistogramDataPoint) -> Iterator[str]:
    cumulative = 0
    for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
        cumulative += count
        le = f'le="{_number(float(bound))}"'
        yield f"{name}_bucket{_labels(point.attributes, le)} {cumulative}"
    inf = 'le="+Inf"'
    yield f"{name}_bucket{_labels(point.attributes, inf)} {point.count}"
    yield f"{name}_sum{_labels(point.attributes)} {_number(point.sum)}"
    yield f"{name}_count{_labels(point.attributes)} {point.count}"


class PrometheusReader(MetricReader):
    """A pull reader: each ``render()`` collects from the SDK and returns Prometheus text."""

    def __init__(self, max_series: int = 10_000) -> None:
        # Room for every Stats series of one stat, plus its overflow series.
        limit = max_series + 16
        super().__init__(cardinality_limits={ObservableCounter: limit, ObservableGauge: limit})
        self._lock = threading.Lock()
        self._data: MetricsData | None = None

    def render(self, leave_out: frozenset[str] = frozenset()) -> str:
        """Collect, then the text of every family but those named in ``leave_out``."""
        with self._lock:
            self._data = None
            self.collect()
            return render_prometheus(self._data, leave_out)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> None:
        self._data = metrics_data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self._data = None


# --------------------------------------------------------------------------- Stats views


class _RuleView:
    """One read of Stats' per-rule series, shared by the instruments of one collection.

    A callback that was already served from the current read starts a new one, so a
    collection reads Stats once and no callback ever sees a read older than its last one.
    """

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._lock = threading.Lock()
        self._by_stat: dict[str, list[Observation]] = {}
        self._served: set[str] = set(RULE_STATS)
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


# --------------------------------------------------------------------------- Telemetry


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


class _Milliseconds(Histogram):
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


class Telemetry:
    """The metric and trace pipelines of one Service, built from Settings.

    ``tracer_provider`` replaces the one built from TRACING_SAMPLING_RATE, ``span_exporters``
    are added to it (a test's InMemorySpanExporter) and ``metric_readers`` are added to the
    Prometheus and OTLP ones; tracing still needs TRACING_ENABLED.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        tracer_provider: TracerProvider | None = None,
        span_exporters: Sequence[SpanExporter] = (),
        metric_readers: Sequence[MetricReader] = (),
    ) -> None:
        self.settings = settings
        self.prometheus: PrometheusReader | None = None
        self.meter_provider: MeterProvider | None = None
        self.tracer_provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        self.request_latency: Histogram | None = None
        self.backend_latency: Histogram | None = None
        self._propagator = CompositePropagator(
            # Last wins: a W3C traceparent beats B3 headers sent alongside it.
            [B3MultiFormat(), TraceContextTextMapPropagator()]
        )
        self._observed = False
        self._closed = False

        readers = list(metric_readers)
        if settings.use_prometheus:
            self.prometheus = PrometheusReader(settings.metrics_max_series)
            readers.append(self.prometheus)
        if settings.otlp_metrics_endpoint:
            readers.append(_otlp_metric_reader(settings))
        resource = telemetry_resource(settings) if readers or settings.tracing_enabled else None
        if readers:
            self.meter_provider = MeterProvider(
                metric_readers=readers,
                resource=resource,
                exemplar_filter=AlwaysOffExemplarFilter(),
                shutdown_on_exit=False,
            )
            meter = self.meter_provider.get_meter(SCOPE, __version__)
            if settings.prometheus_response_time_as_milliseconds:
                # The reference's legacy form: the same name, the values in milliseconds.
                self.request_latency = _Milliseconds(
                    meter.create_histogram(
                        "ratelimit_service_response_time_seconds",
                        unit="ms",
                        description="Time to answer a call, by gRPC method (milliseconds).",
                        explicit_bucket_boundaries_advisory=[b * 1000 for b in LATENCY_BUCKETS],
                    )
                )
            else:
                self.request_latency = meter.create_histogram(
                    "ratelimit_service_response_time_seconds",
                    unit="s",
                    description="Time to answer a call, by gRPC method.",
                    explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
                )
            self.backend_latency = meter.create_histogram(
                "ratelimit_service_backend_response_time_seconds",
                unit="s",
                description="Time of one backend call (all the counters of a request).",
                explicit_bucket_boundaries_advisory=LATENCY_BUCKETS,
            )

        if settings.tracing_enabled:
            provider = tracer_provider or TracerProvider(
                sampler=ParentBased(TraceIdRatioBased(settings.tracing_sampling_rate)),
                resource=resource,
                shutdown_on_exit=False,
            )
            for exporter in span_exporters:
                provider.add_span_processor(SimpleSpanProcessor(exporter))
            if settings.otlp_traces_endpoint:
                provider.add_span_processor(_otlp_span_processor(settings))
            self.tracer_provider = provider
            self.tracer = provider.get_tracer(SCOPE, __version__)

    @property
    def metrics_enabled(self) -> bool:
        return self.meter_provider is not None

    def describe(self) -> str:
        """One phrase for the startup banner."""
        parts = []
        if self.prometheus is not None:
            parts.append(f"prometheus {self.settings.prometheus_path}")
        if self.settings.otlp_metrics_endpoint and self.metrics_enabled:
            parts.append(f"otlp metrics {self.settings.otlp_metrics_endpoint}")
        if self.tracer is not None:
            where = self.settings.otlp_traces_endpoint or "no exporter"
            parts.append(f"tracing {self.settings.tracing_sampling_rate:g} ({where})")
        return ", ".join(parts) or "metrics and tracing off"

    def observe_holds(self, holds: HoldsView, max_series: int) -> None:
        """Instruments for held resources: sessions, copies held (in all, per node, per node
        and group; nodes and groups come from configuration, and at most ``max_series``
        readings are reported), and transfers that lapsed unclaimed."""
        if self.meter_provider is None:
            return
        meter = self.meter_provider.get_meter(SCOPE, __version__)
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

    def observe_capacity(self, capacity: CapacityView, max_series: int) -> None:
        """Instruments for capacity leases, per resource this server holds leases on:
        capacity, the sum of leases and of wants, clients; and unconfigured requests."""
        if self.meter_provider is None:
            return
        meter = self.meter_provider.get_meter(SCOPE, __version__)

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

    def observe_backend(self, backend: Watched) -> None:
        """Instruments for the backend's connections: state (one series per state, 1 for the
        current one), transitions by new state and reason, and the breaker's counts."""
        if self.meter_provider is None:
            return
        meter = self.meter_provider.get_meter(SCOPE, __version__)

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

    def observe(
        self,
        stats: Stats,
        local_cache: OverLimitCache | None = None,
        methods: Sequence[str] = ("ShouldRateLimit",),
    ) -> None:
        """Create the instruments that read ``stats`` (calls of each gRPC method in
        ``methods``) and the local cache; once."""
        if self.meter_provider is None or self._observed:
            return
        self._observed = True
        meter = self.meter_provider.get_meter(SCOPE, __version__)
        view = _RuleView(stats)
        for stat in RULE_STATS:
            meter.create_observable_counter(
                f"ratelimit_service_rate_limit_{stat}",
                callbacks=[view.callback(stat)],
                description=_RULE_HELP[stat],
            )
        for name, stat_name, description in _FIXED_COUNTERS:
            meter.create_observable_counter(
                name, callbacks=[_counter_callback(stats, stat_name)], description=description
            )
        meter.create_observable_counter(
            "ratelimit_service_should_rate_limit_error",
            callbacks=[
                _counter_callback(stats, f"{CALL}.{kind}", {"err_type": kind})
                for kind in _ERROR_TYPES
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
            description="Descriptors answered OVER_LIMIT from the local cache, without "
            "the backend.",
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

    def backend_timer(self, backend: Backend) -> BackendTimer | None:
        """A timer of the backend's calls (every algorithm's store), timed and traced as
        configured; None when neither is."""
        histogram = self.backend_latency
        tracer = self.tracer
        if histogram is None and tracer is None:
            return None
        name = backend.name
        attributes = {alg: {"backend": name, "algorithm": alg} for alg in ALGORITHMS}
        span_attributes: dict[str, str | int] = {"ratelimit.backend": name}
        if name.startswith("redis"):
            span_attributes["db.system.name"] = "redis"

        async def timed(algorithm: str, items: int, call: Awaitable[T]) -> T:
            start = perf_counter()
            try:
                if tracer is None or not get_current_span().is_recording():
                    # Not traced, or the request was not sampled: its child would not be.
                    return await call
                with tracer.start_as_current_span(
                    f"ratelimit.backend.{algorithm}",
                    kind=SpanKind.CLIENT,
                    attributes={**span_attributes, "ratelimit.counters": items},
                ):
                    return await call
            finally:
                if histogram is not None:
                    histogram.record(perf_counter() - start, attributes[algorithm])

        return timed

    def server_span(
        self,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        service: str,
        method: str,
        attributes: Mapping[str, str | int],
    ) -> AbstractContextManager[Span]:
        """The current SERVER span of one call, child of the caller's context."""
        assert self.tracer is not None
        carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
        parent = self._propagator.extract(carrier, Context())
        return self.tracer.start_as_current_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": service,
                "rpc.method": method,
                **attributes,
            },
        )

    def shutdown(self) -> None:
        """Flush and stop the pipelines, once (blocking: call it from a worker thread)."""
        if self._closed:
            return
        self._closed = True
        started = time.monotonic()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            left = SHUTDOWN_TIMEOUT_MILLIS - (time.monotonic() - started) * 1000
            self.meter_provider.shutdown(timeout_millis=max(left, 100))


def _otlp_metric_reader(settings: Settings) -> MetricReader:
    # Imported only when configured: the exporter pulls in its own protobuf modules.
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    limit = settings.metrics_max_series + 16
    return PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=settings.otlp_metrics_endpoint),
        cardinality_limits={ObservableCounter: limit, ObservableGauge: limit},
    )


def _otlp_span_processor(settings: Settings) -> SpanProcessor:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    endpoint = settings.otlp_traces_endpoint
    if settings.tracing_exporter_protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        return BatchSpanProcessor(HttpSpanExporter(endpoint=http_traces_url(endpoint)))
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))


def http_traces_url(endpoint: str) -> str:
    """OTLP/HTTP's URL for spans: a base endpoint (no path, as OTEL_EXPORTER_OTLP_ENDPOINT
    is) gets ``/v1/traces``; a bare ``host:port`` gets ``http://``."""
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    scheme, _, rest = endpoint.partition("://")
    host, _, path = rest.partition("/")
    if not path:
        return f"{scheme}://{host}/v1/traces"
    return endpoint
