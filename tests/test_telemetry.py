"""Observability over real sockets: the Prometheus endpoint, OTLP push, traces, logs, /status."""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult
from ferryman.backends.memory import MemoryBackend
from ferryman.errors import BackendError, SettingsError
from ferryman.settings import Settings
from ferryman.stats import FIXED_WINDOW_STATS, STATS_OVERFLOW, Stats
from ferryman.telemetry import Telemetry

from helpers.metrics import PROMETHEUS, samples, scrape
from helpers.redis_procs import RedisProcess
from helpers.server import ConfigDir, Server, ServerFactory, codes, overall, wait_for
from helpers.stores import redis_backend

CONFIG = """
domain: shop
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: region
    value: eu
    descriptors:
      - key: tier
        rate_limit: {unit: minute, requests_per_unit: 1}
"""

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def replace_file(config_dir: ConfigDir, name: str, text: str) -> None:
    """Write a config file atomically, so the watcher never reads half of it."""
    tmp = config_dir.path / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, config_dir.path / name)


class FailingWindows:
    """A fixed-window store that is always down: every call raises BackendError."""

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        raise BackendError("connection refused")

    def clear(self) -> None:
        pass


class FailingBackend(MemoryBackend):
    """A backend whose fixed windows are always down."""

    name = "failing"

    def __init__(self) -> None:
        super().__init__()
        self._stores["fixed_window"] = FailingWindows()

    async def start(self) -> None:
        pass

    def healthy(self) -> bool:
        return False

    async def close(self) -> None:
        pass


# --------------------------------------------------------------------------- metrics


def test_scrape_shows_exact_rule_counters_with_near_limit_arithmetic(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Counters on /metrics equal the reference arithmetic, under its names and labels."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(**PROMETHEUS)
    # limit 10, near threshold floor(10 * 0.8) = 8
    for hits in (7, 3, 4):  # within 7; within 3 of which near 10-8=2; over 4 (already at 10)
        server.ask("shop", [("k", "v")], hits=hits)
    # limit 5, near threshold 4: within 3; then 3->7: over 7-5=2, near 5-max(4,3)=1
    server.ask("shop", [("small", "s")], hits=3)
    assert codes(server.ask("shop", [("small", "s")], hits=4)) == ["OVER_LIMIT"]
    server.ask("shop", [("region", "eu"), ("tier", "gold")], hits=1)

    lines = scrape(server)
    got = samples(lines)
    k = '{domain="shop",key1="k"}'
    assert got[f"ratelimit_service_rate_limit_total_hits{k}"] == "14"
    assert got[f"ratelimit_service_rate_limit_within_limit{k}"] == "10"
    assert got[f"ratelimit_service_rate_limit_near_limit{k}"] == "2"
    assert got[f"ratelimit_service_rate_limit_over_limit{k}"] == "4"
    small = '{domain="shop",key1="small"}'
    assert got[f"ratelimit_service_rate_limit_total_hits{small}"] == "7"
    assert got[f"ratelimit_service_rate_limit_within_limit{small}"] == "3"
    assert got[f"ratelimit_service_rate_limit_near_limit{small}"] == "1"
    assert got[f"ratelimit_service_rate_limit_over_limit{small}"] == "2"
    nested = '{domain="shop",key1="region_eu",key2="tier"}'
    assert got[f"ratelimit_service_rate_limit_within_limit{nested}"] == "1"
    assert got['ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}'] == "6"
    assert "# TYPE ratelimit_service_rate_limit_over_limit counter" in lines
    assert not any("_total{" in line or "_total " in line for line in lines)


def test_scrape_escapes_label_values_and_keeps_dots_inside_labels(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A request value with quotes, backslash, newline and dots stays one escaped label."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(**PROMETHEUS)
    server.ask("shop", [("user", 'a"b\\c\nd.e.f')], hits=2)
    got = samples(scrape(server))
    series = '{domain="shop",key1="user_a\\"b\\\\c\\nd.e.f"}'
    assert got[f"ratelimit_service_rate_limit_total_hits{series}"] == "2"


def test_latency_histograms_count_every_call(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Request and backend latencies are Prometheus histograms with one count per call."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(**PROMETHEUS)
    for _ in range(5):
        server.ask("shop", [("k", "v")])
    server.ask("unknown", [("k", "v")])  # answered without a backend call
    lines = scrape(server)
    got = samples(lines)
    method = 'grpc_method="ShouldRateLimit"'
    assert "# TYPE ratelimit_service_response_time_seconds histogram" in lines
    assert got[f"ratelimit_service_response_time_seconds_count{{{method}}}"] == "6"
    assert got[f'ratelimit_service_response_time_seconds_bucket{{{method},le="+Inf"}}'] == "6"
    assert float(got[f"ratelimit_service_response_time_seconds_sum{{{method}}}"]) > 0
    buckets = [
        int(value)
        for series, value in got.items()
        if series.startswith("ratelimit_service_response_time_seconds_bucket")
    ]
    assert buckets == sorted(buckets) and len(buckets) > 10
    backend = 'backend="memory",algorithm="fixed_window"'
    assert got[f"ratelimit_service_backend_response_time_seconds_count{{{backend}}}"] == "5"


def test_config_load_counters_and_one_log_line_per_load(
    config_dir: ConfigDir, make_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Loads count success or error on /metrics and each logs one line naming what changed."""
    caplog.set_level(logging.INFO, logger="ferryman")
    config_dir.write("shop.yaml", CONFIG)
    config_dir.write("gone.yaml", "domain: gone\ndescriptors: [{key: a}]\n")
    server = make_server(**PROMETHEUS)
    holder = server.service.holder
    replace_file(config_dir, "shop.yaml", "domain: shop\ndescriptors: [{key: k, ratelimit: {}}]\n")
    wait_for("the load error", lambda: server.stat("ratelimit.service.config_load_error") == 1)
    replace_file(config_dir, "shop.yaml", CONFIG.replace("per_unit: 10}", "per_unit: 11}"))
    wait_for("version 2", lambda: holder.version == 2)
    (config_dir.path / "gone.yaml").unlink()
    replace_file(config_dir, "new.yaml", "domain: new\ndescriptors: [{key: a}]\n")
    wait_for(
        "both domains",
        lambda: holder.config is not None and set(holder.config.domains) == {"new", "shop"},
    )
    got = samples(scrape(server))
    assert got["ratelimit_service_config_load_error"] == "1"
    assert got["ratelimit_service_config_load_success"] == str(holder.version)

    lines = [r.getMessage() for r in caplog.records if r.name == "ferryman.config"]
    assert all("\n" not in line for line in lines)
    assert lines[0].startswith("config loaded (version 1)")
    assert lines[0].endswith("2 domains, 4 limits; added: gone, shop")
    assert lines[1].startswith("config rejected, keeping version 1: 1 problem(s): ")
    assert "'ratelimit'" in lines[1]  # the unknown key is named
    assert lines[2] == "config reloaded (version 2): 2 domains, 4 limits; changed: shop"
    # Deleting one file and adding another may be seen as one reload or two.
    later = " | ".join(lines[3:])
    assert "added: new" in later and "removed: gone" in later and "changed" not in later
    assert len(lines) == 2 + holder.version - 1


def test_domain_not_found_is_labelled_by_the_whole_domain(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """An unknown domain counts under domain_not_found with its name, dots and all."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(**PROMETHEUS)
    server.ask("api.example.com", [("k", "v")])
    server.ask("api.example.com", [("k", "w")])
    got = samples(scrape(server))
    assert got['ratelimit_service_rate_limit_domain_not_found{domain="api.example.com"}'] == "2"


def test_error_counters_follow_the_reference_err_type_labels(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Backend failures count redis_error (or degraded with fail-open), bad calls service_error."""
    config_dir.write("shop.yaml", CONFIG)
    down = make_server(FailingBackend(), **PROMETHEUS)
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as caught:
            down.ask("shop", [("k", "v")])
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError):
        down.ask("", [("k", "v")])
    got = samples(scrape(down))
    assert got['ratelimit_service_should_rate_limit_error{err_type="redis_error"}'] == "3"
    assert got['ratelimit_service_should_rate_limit_error{err_type="service_error"}'] == "1"
    assert got['ratelimit_service_should_rate_limit_error{err_type="degraded"}'] == "0"

    open_ = make_server(FailingBackend(), fail_open=True, **PROMETHEUS)
    assert overall(open_.ask("shop", [("k", "v")])) == "OK"
    got = samples(scrape(open_))
    assert got['ratelimit_service_should_rate_limit_error{err_type="degraded"}'] == "1"


def test_local_cache_size_and_hits_are_exported(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Answers from the local over-limit cache count as hits; its entries and bytes are gauges."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(local_cache_size_in_bytes=100_000, **PROMETHEUS)
    tier = [("region", "eu"), ("tier", "gold")]
    server.ask("shop", tier)
    for _ in range(4):  # the first goes over and fills the cache, three answer from it
        assert codes(server.ask("shop", tier)) == ["OVER_LIMIT"]
    got = samples(scrape(server))
    assert got["ratelimit_service_local_cache_hits"] == "3"
    assert got["ratelimit_service_local_cache_entries"] == "1"
    assert int(got["ratelimit_service_local_cache_size_bytes"]) > 0
    series = '{domain="shop",key1="region_eu",key2="tier"}'
    assert got[f"ratelimit_service_rate_limit_over_limit_with_local_cache{series}"] == "3"
    assert got[f"ratelimit_service_rate_limit_over_limit{series}"] == "4"


def test_series_cap_folds_new_series_into_overflow_and_keeps_totals_exact(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Past METRICS_MAX_SERIES, new per-rule series land in one overflow series per stat."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(metrics_max_series=6, **PROMETHEUS)
    for i in range(20):
        server.ask("shop", [("user", f"u{i}")])
    assert server.service.stats.series <= 6 + 2  # the cap, plus overflow total_hits and within
    lines = scrape(server)
    got = samples(lines)
    hits = {s: int(v) for s, v in got.items() if s.startswith("ratelimit_service_rate_limit_total")}
    # 6 series = 3 users x (total_hits, within_limit); the 17 others are folded.
    assert len(hits) == 3 + 1
    assert hits['ratelimit_service_rate_limit_total_hits{overflow="true"}'] == 17
    assert sum(hits.values()) == 20
    assert int(got["ratelimit_service_stats_overflow"]) == 2 * 17
    assert got["ratelimit_service_config_load_success"] == "1"  # fixed names never fold


def test_metrics_off_serves_no_endpoint_and_wraps_nothing(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Without USE_PROMETHEUS or an OTLP endpoint there is no meter, port or wrapper."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server()
    telemetry = server.service.telemetry
    assert server.service.prometheus_port is None
    assert not telemetry.metrics_enabled and telemetry.tracer is None
    assert telemetry.backend_timer(server.service.backend) is None
    assert codes(server.ask("shop", [("k", "v")])) == ["OK"]


# --------------------------------------------------------------------------- OTLP push


class Collector:
    """A real OTLP/gRPC receiver on a loopback port that keeps what it is sent."""

    def __init__(self) -> None:
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        collector = self

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                collector.metrics.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                collector.traces.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            Metrics(), self.server
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            Traces(), self.server
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def points(self, name: str) -> list[tuple[dict[str, str], int]]:
        """(attributes, value) of every data point of the metric ``name``, last export."""
        out = []
        for metric in (
            m
            for rm in self.metrics[-1].resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
        ):
            for point in metric.sum.data_points:
                attributes = {kv.key: kv.value.string_value for kv in point.attributes}
                out.append((attributes, point.as_int))
        return out


@pytest.fixture
def collector() -> Iterator[Collector]:
    receiver = Collector()
    yield receiver
    receiver.server.stop(None)


def test_otlp_push_carries_exact_counters_and_spans(
    config_dir: ConfigDir, make_server: ServerFactory, collector: Collector
) -> None:
    """With OTLP endpoints set, metrics and spans reach a real collector by shutdown."""
    config_dir.write("shop.yaml", CONFIG)
    endpoint = f"http://127.0.0.1:{collector.port}"
    server = make_server(
        otlp_metrics_endpoint=endpoint, otlp_traces_endpoint=endpoint, tracing_enabled=True
    )
    for _ in range(3):
        server.ask("shop", [("k", "v")], hits=4)
    server.stop()
    assert collector.metrics, "no metrics were pushed"
    assert collector.points("ratelimit_service_rate_limit_over_limit") == [
        ({"domain": "shop", "key1": "k"}, 2)
    ]
    assert collector.points("ratelimit_service_rate_limit_total_hits") == [
        ({"domain": "shop", "key1": "k"}, 12)
    ]
    names = [
        span.name
        for request in collector.traces
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert names.count("ShouldRateLimit") == 3
    assert names.count("ratelimit.backend.fixed_window") == 3


# --------------------------------------------------------------------------- traces


def traced(make_server: ServerFactory, exporter: InMemorySpanExporter, **overrides: Any) -> Server:
    """A server with tracing on, exporting to ``exporter``."""
    return make_server(
        telemetry=lambda settings: Telemetry(settings, span_exporters=[exporter]),
        tracing_enabled=True,
        **overrides,
    )


def by_name(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


@pytest.mark.parametrize(
    "metadata",
    [
        [("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01")],
        [("b3", f"{TRACE_ID}-{PARENT_ID}-1")],
        [("x-b3-traceid", TRACE_ID), ("x-b3-spanid", PARENT_ID), ("x-b3-sampled", "1")],
    ],
    ids=["w3c", "b3-single", "b3-multi"],
)
def test_span_continues_the_callers_trace_with_the_backend_call_as_child(
    config_dir: ConfigDir, make_server: ServerFactory, metadata: list[tuple[str, str]]
) -> None:
    """The request span continues the caller's trace; the backend span is its child."""
    config_dir.write("shop.yaml", CONFIG)
    exporter = InMemorySpanExporter()
    server = traced(make_server, exporter)
    server.ask("shop", [("small", "s")], hits=6, metadata=metadata)
    spans = exporter.get_finished_spans()
    [request] = by_name(spans, "ShouldRateLimit")
    [backend] = by_name(spans, "ratelimit.backend.fixed_window")
    context = request.get_span_context()
    assert context is not None and request.parent is not None
    assert format(context.trace_id, "032x") == TRACE_ID
    assert format(request.parent.span_id, "016x") == PARENT_ID
    assert request.parent.is_remote
    assert request.kind is SpanKind.SERVER
    assert request.attributes is not None
    assert request.attributes["ratelimit.domain"] == "shop"
    assert request.attributes["ratelimit.descriptors"] == 1
    assert request.attributes["ratelimit.code"] == "OVER_LIMIT"
    assert backend.parent is not None and backend.context is not None
    assert backend.parent.span_id == context.span_id
    assert backend.context.trace_id == context.trace_id
    assert backend.kind is SpanKind.CLIENT
    assert backend.attributes is not None and backend.attributes["ratelimit.backend"] == "memory"


def test_backend_failure_marks_both_spans_as_errors(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """An UNAVAILABLE answer leaves an error status on the request and the backend span."""
    config_dir.write("shop.yaml", CONFIG)
    exporter = InMemorySpanExporter()
    server = make_server(
        FailingBackend(),
        telemetry=lambda settings: Telemetry(settings, span_exporters=[exporter]),
        tracing_enabled=True,
    )
    with pytest.raises(grpc.RpcError):
        server.ask("shop", [("k", "v")])
    spans = exporter.get_finished_spans()
    [request] = by_name(spans, "ShouldRateLimit")
    [backend] = by_name(spans, "ratelimit.backend.fixed_window")
    assert not request.status.is_ok and not backend.status.is_ok
    assert request.attributes is not None
    assert request.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAVAILABLE.value[0]


def test_sampling_rate_zero_exports_nothing_unless_the_caller_sampled(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """TRACING_SAMPLING_RATE=0 drops root and unsampled calls; a sampled parent still wins."""
    config_dir.write("shop.yaml", CONFIG)
    exporter = InMemorySpanExporter()
    server = traced(make_server, exporter, tracing_sampling_rate=0.0)
    for _ in range(5):
        server.ask("shop", [("k", "v")])
    server.ask("shop", [("k", "v")], metadata=[("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00")])
    assert exporter.get_finished_spans() == ()
    server.ask("shop", [("k", "v")], metadata=[("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01")])
    assert len(by_name(exporter.get_finished_spans(), "ShouldRateLimit")) == 1


def test_tracing_disabled_creates_no_spans(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With TRACING_ENABLED off an exporter handed to Telemetry never sees a span."""
    config_dir.write("shop.yaml", CONFIG)
    exporter = InMemorySpanExporter()
    server = make_server(telemetry=lambda s: Telemetry(s, span_exporters=[exporter]))
    server.ask("shop", [("k", "v")], metadata=[("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01")])
    assert server.service.telemetry.tracer is None
    assert exporter.get_finished_spans() == ()


# --------------------------------------------------------------------------- logs, /status


def test_no_log_line_per_request_at_the_default_level(
    config_dir: ConfigDir, make_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Failing calls are counted, not logged one by one at WARN."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(FailingBackend())
    caplog.set_level(logging.WARNING)
    caplog.clear()
    for _ in range(10):
        with pytest.raises(grpc.RpcError):
            server.ask("shop", [("k", "v")])
    with pytest.raises(grpc.RpcError):
        server.ask("", [("k", "v")])
    server.ask("nowhere", [("k", "v")])
    assert [r.getMessage() for r in caplog.records if r.name.startswith("ferryman")] == []
    assert server.stat("ratelimit.service.call.should_rate_limit.redis_error") == 10


def test_backend_outage_logs_one_line_each_way_and_shows_on_status(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis going down and coming back logs one line per change; /status follows it."""
    config_dir.write("shop.yaml", CONFIG)
    redis_server = RedisProcess(tmp_path / "redis").start()
    try:
        caplog.set_level(logging.WARNING)
        backend = redis_backend(redis_server.url, pool_size=2, timeout=0.5)
        server = make_server(backend)

        def backend_healthy() -> bool:
            code, body = server.http("GET", "/status", debug=True)
            assert code == 200
            healthy: bool = json.loads(body)["backend"]["healthy"]
            return healthy

        wait_for("healthy", backend_healthy)
        redis_server.kill()
        wait_for("unhealthy", lambda: not backend_healthy())
        redis_server.start()
        wait_for("healthy again", backend_healthy)
        lines = [r.getMessage() for r in caplog.records if r.name == "ferryman.redis"]
        # Up, then down (perhaps through degraded) with a reason, then up again: one line
        # per change, none per failed call or probe.
        assert 3 <= len(lines) <= 4, lines
        assert " is up " in lines[0] and " is up " in lines[-1]
        assert any(" is down (" in line for line in lines[1:-1]), lines
        assert all("()" not in line for line in lines)
    finally:
        redis_server.stop()


def test_status_page_reports_config_backend_and_cache(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/status on the debug port is JSON with the config version, errors, backend and cache."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(local_cache_size_in_bytes=50_000)
    server.ask("shop", [("region", "eu"), ("tier", "t")], hits=2)

    def status() -> dict[str, Any]:
        code, body = server.http("GET", "/status", debug=True)
        assert code == 200
        page: dict[str, Any] = json.loads(body)
        return page

    page = status()
    assert page["healthy"] is True
    config = page["config"]
    assert config["version"] == 1 and config["domains"] == 1 and config["limits"] == 4
    assert config["last_error"] is None and config["last_error_at"] is None
    assert config["files"] == [str(config_dir.path / "shop.yaml")]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", config["loaded_at"])
    assert page["backend"] == {"name": "memory", "healthy": True, "connections": [], "sync": []}
    assert page["local_cache"]["entries"] == 1 and page["local_cache"]["max_bytes"] == 50_000
    assert page["stats"]["max_series"] == 10_000 and page["stats"]["series"] > 0
    assert "nodes" not in page

    replace_file(config_dir, "shop.yaml", "domain: shop\ndescriptors: [{key: k, ratelimit: {}}]\n")
    wait_for("the last error", lambda: status()["config"]["last_error"] is not None)
    config = status()["config"]
    assert config["version"] == 1 and "ratelimit" in config["last_error"]
    assert config["last_error_at"] is not None


# --------------------------------------------------------------------------- settings


def test_settings_read_the_observability_variables() -> None:
    """PROMETHEUS_*, METRICS_MAX_SERIES and the OTLP endpoints are read and validated."""
    settings = Settings.from_env(
        {
            "USE_PROMETHEUS": "true",
            "PROMETHEUS_ADDR": "[::1]:9102",
            "PROMETHEUS_PATH": "/m",
            "METRICS_MAX_SERIES": "50",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4317",
        }
    )
    assert settings.use_prometheus and settings.prometheus_addr == "[::1]:9102"
    assert settings.prometheus_path == "/m" and settings.metrics_max_series == 50
    assert settings.otlp_metrics_endpoint == "http://collector:4317"
    assert settings.otlp_traces_endpoint == "http://tempo:4317"
    assert Settings.from_env({}).otlp_metrics_endpoint == ""
    for bad in (
        {"PROMETHEUS_ADDR": "9090"},
        {"PROMETHEUS_ADDR": "::1:9090"},
        {"PROMETHEUS_PATH": "metrics"},
        {"METRICS_MAX_SERIES": "0"},
    ):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            Settings.from_env(bad)


def test_prometheus_listens_on_every_interface_when_the_host_is_empty(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """PROMETHEUS_ADDR=:0 binds every interface on one free port; PROMETHEUS_PATH is used."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(use_prometheus=True, prometheus_addr=":0", prometheus_path="/prom")
    lines = scrape(server)
    assert "# TYPE ratelimit_service_config_load_success counter" in lines
    port = server.service.prometheus_port
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 404
    finally:
        conn.close()


def test_concurrent_scrapes_and_traffic_stay_consistent(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Scrapes racing with traffic never go backwards and end at the exact total."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(**PROMETHEUS)
    seen: list[int] = []
    done = threading.Event()
    series = 'ratelimit_service_rate_limit_total_hits{domain="shop",key1="user_u"}'

    def scraper() -> None:
        while not done.is_set():
            seen.append(int(samples(scrape(server)).get(series, "0")))

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        for _ in range(60):
            server.ask("shop", [("user", "u")])
    finally:
        done.set()
        thread.join(10)
    assert seen == sorted(seen)
    assert samples(scrape(server))[series] == "60"


def test_rule_counts_adds_what_four_rule_calls_would_overflow_included() -> None:
    """The fixed-window hot path's batched update equals four ``rule`` calls, series cap and
    overflow counting included."""
    batched, single = Stats(max_series=5), Stats(max_series=5)
    rows = []
    for i, counts in enumerate([(3, 2, 1, 0), (1, 0, 0, 1), (2, 2, 0, 0), (4, 1, 1, 2)]):
        key = f"dom.user_{i % 3}"
        path = ("dom", f"user_{i % 3}")
        rows.append((key, path, counts))
        for stat, amount in zip(FIXED_WINDOW_STATS, counts, strict=True):
            single.rule(key, stat, amount, path)
    batched.rule_counts(rows[:1])
    batched.rule_counts(rows[1:])
    assert batched.snapshot() == single.snapshot()
    assert batched.rule_series() == single.rule_series()
    assert batched.get(STATS_OVERFLOW) > 0
