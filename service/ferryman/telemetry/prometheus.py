"""Prometheus text exposition of the SDK's collected metrics, rendered on scrape."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator, Mapping

from opentelemetry.sdk.metrics import ObservableCounter, ObservableGauge
from opentelemetry.sdk.metrics.export import (
    Gauge,
    HistogramDataPoint,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData

from ferryman.telemetry.families import PROMETHEUS_CONTENT_TYPE

__all__ = ["PROMETHEUS_CONTENT_TYPE", "PrometheusReader", "render_prometheus"]

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
