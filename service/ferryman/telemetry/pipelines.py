"""The metric and trace pipelines of one Service, built from Settings."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from time import perf_counter
from typing import TYPE_CHECKING, TypeVar

from ferryman._version import __version__
from ferryman.backends.base import Backend, Watched
from ferryman.engine import ALGORITHMS, BackendTimer
from ferryman.settings import Settings
from ferryman.stats import Stats
from ferryman.telemetry.families import LATENCY_BUCKETS, CapacityView, HoldsView, SizedCache

if TYPE_CHECKING:
    # OpenTelemetry (its API, its SDK and the instruments over them) is imported when a
    # pipeline is built: none is with metrics and traces off.
    from opentelemetry.metrics import Histogram, Meter
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from ferryman.telemetry.prometheus import PrometheusReader

log = logging.getLogger("ferryman.telemetry")
T = TypeVar("T")
SCOPE = "ferryman"
SHUTDOWN_TIMEOUT_MILLIS = 5_000


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
        self.meter: Meter | None = None
        self.tracer_provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        self.request_latency: Histogram | None = None
        self.backend_latency: Histogram | None = None
        self._propagator: TextMapPropagator | None = None
        self._observed = False
        self._closed = False

        readers = list(metric_readers)
        if settings.use_prometheus:
            from ferryman.telemetry.prometheus import PrometheusReader

            self.prometheus = PrometheusReader(settings.metrics_max_series)
            readers.append(self.prometheus)
        if settings.otlp_metrics_endpoint:
            from ferryman.telemetry.export import otlp_metric_reader

            readers.append(otlp_metric_reader(settings))
        resource = None
        if readers or settings.tracing_enabled:
            from ferryman.telemetry.export import telemetry_resource

            resource = telemetry_resource(settings)
        if readers:
            self._start_metrics(readers, resource)
        if settings.tracing_enabled:
            self._start_traces(tracer_provider, span_exporters, resource)

    def _start_metrics(self, readers: list[MetricReader], resource: Resource | None) -> None:
        """The meter provider over ``readers``, with the request and backend latencies."""
        from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider

        from ferryman.telemetry.instruments import Milliseconds

        settings = self.settings
        self.meter_provider = MeterProvider(
            metric_readers=readers,
            resource=resource,
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,
        )
        self.meter = meter = self.meter_provider.get_meter(SCOPE, __version__)
        if settings.prometheus_response_time_as_milliseconds:
            # The reference's legacy form: the same name, the values in milliseconds.
            self.request_latency = Milliseconds(
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

    def _start_traces(
        self,
        tracer_provider: TracerProvider | None,
        span_exporters: Sequence[SpanExporter],
        resource: Resource | None,
    ) -> None:
        """The tracer provider (``tracer_provider`` if given), exporting to
        ``span_exporters`` and to OTLP when an endpoint is set."""
        from opentelemetry.propagators.b3 import B3MultiFormat
        from opentelemetry.propagators.composite import CompositePropagator
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from ferryman.telemetry.export import otlp_span_processor

        settings = self.settings
        self._propagator = CompositePropagator(
            # Last wins: a W3C traceparent beats B3 headers sent alongside it.
            [B3MultiFormat(), TraceContextTextMapPropagator()]
        )
        provider = tracer_provider or TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(settings.tracing_sampling_rate)),
            resource=resource,
            shutdown_on_exit=False,
        )
        for exporter in span_exporters:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        if settings.otlp_traces_endpoint:
            provider.add_span_processor(otlp_span_processor(settings))
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
        """Instruments for held resources (sessions, copies per node and group, transfers)."""
        if self.meter is not None:
            from ferryman.telemetry.instruments import holds_instruments

            holds_instruments(self.meter, holds, max_series)

    def observe_capacity(self, capacity: CapacityView, max_series: int) -> None:
        """Instruments for capacity leases, per resource this server holds leases on."""
        if self.meter is not None:
            from ferryman.telemetry.instruments import capacity_instruments

            capacity_instruments(self.meter, capacity, max_series)

    def observe_backend(self, backend: Watched) -> None:
        """Instruments for the backend's connections: state, transitions, breaker counts."""
        if self.meter is not None:
            from ferryman.telemetry.instruments import backend_instruments

            backend_instruments(self.meter, backend)

    def observe(
        self,
        stats: Stats,
        local_cache: SizedCache | None = None,
        methods: Sequence[str] | Callable[[], Sequence[str]] = ("ShouldRateLimit",),
    ) -> None:
        """Create the instruments that read ``stats`` (calls of each gRPC method in
        ``methods``, or of those it returns: asked only when metrics are on) and the local
        cache; once."""
        if self.meter is None or self._observed:
            return
        self._observed = True
        from ferryman.telemetry.instruments import stats_instruments

        named = methods() if callable(methods) else methods
        stats_instruments(self.meter, stats, local_cache, named)

    def backend_timer(self, backend: Backend) -> BackendTimer | None:
        """A timer of the backend's calls (every algorithm's store), timed and traced as
        configured; None when neither is."""
        histogram = self.backend_latency
        tracer = self.tracer
        if histogram is None and tracer is None:
            return None
        from opentelemetry.trace import SpanKind, get_current_span

        name = backend.name
        attributes = {a.name: {"backend": name, "algorithm": a.name} for a in ALGORITHMS}
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
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind

        assert self.tracer is not None and self._propagator is not None
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
