"""Where telemetry goes: the resource that names the service, and the OTLP exporters
(imported only when configured)."""

from __future__ import annotations

from opentelemetry.sdk.metrics import ObservableCounter, ObservableGauge
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor

from ferryman._version import __version__
from ferryman.errors import SettingsError
from ferryman.settings import Settings

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


def _otlp_modules() -> None:
    """Refuse to start, saying why and what mends it, when opentelemetry-proto's modules
    were replaced by the older copies xds-protos ships (installed after it)."""
    from opentelemetry.proto.common.v1 import common_pb2

    if not hasattr(common_pb2, "InstrumentationScope"):
        raise SettingsError(
            "the OTLP exporters cannot load: opentelemetry-proto's modules were overwritten "
            "by an older copy (xds-protos ships one); reinstall it last: python -m pip "
            "install --force-reinstall --no-deps opentelemetry-proto"
        )


def otlp_metric_reader(settings: Settings) -> MetricReader:
    _otlp_modules()
    # Imported only when configured: the exporter pulls in its own protobuf modules.
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    limit = settings.metrics_max_series + 16
    return PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=settings.otlp_metrics_endpoint),
        cardinality_limits={ObservableCounter: limit, ObservableGauge: limit},
    )


def otlp_span_processor(settings: Settings) -> SpanProcessor:
    _otlp_modules()
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
