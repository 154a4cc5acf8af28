"""OpenTelemetry metrics and traces of one Service, instruments created once at startup.

Metrics. The reference's counters live in ``Stats`` (exact, bounded by METRICS_MAX_SERIES in
all and by MAX_METRIC_SERIES request values per rule, past which a rule's values are folded
into its ``_other_`` series);
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

With metrics and traces off, OpenTelemetry's SDK is not imported at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ferryman.telemetry.families import PROMETHEUS_CONTENT_TYPE, STATS_COUNTER_FAMILIES
from ferryman.telemetry.pipelines import SCOPE, Telemetry

if TYPE_CHECKING:
    from ferryman.telemetry.export import http_traces_url, telemetry_resource
    from ferryman.telemetry.prometheus import PrometheusReader, render_prometheus

# OpenTelemetry's SDK is imported with these, and so only by a service whose metrics or
# traces are on (or by whoever asks for one of them).
_OF_THE_SDK = {
    "http_traces_url": "ferryman.telemetry.export",
    "telemetry_resource": "ferryman.telemetry.export",
    "PrometheusReader": "ferryman.telemetry.prometheus",
    "render_prometheus": "ferryman.telemetry.prometheus",
}


def __getattr__(name: str) -> Any:
    if name not in _OF_THE_SDK:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_OF_THE_SDK[name]), name)


__all__ = [
    "PROMETHEUS_CONTENT_TYPE",
    "SCOPE",
    "STATS_COUNTER_FAMILIES",
    "PrometheusReader",
    "Telemetry",
    "http_traces_url",
    "render_prometheus",
    "telemetry_resource",
]
