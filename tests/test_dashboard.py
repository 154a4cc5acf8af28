"""The Grafana dashboard in k8s/dashboards: well formed, and every query names metrics that a
real ferryman exports."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from typing import Any

import ferryman
from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2

from helpers.capacity import resources_yaml
from helpers.server import MIXED, MIXED_REQUEST, ConfigDir, Server, ServerFactory, quota_stub

DASHBOARD = Path(__file__).resolve().parents[1] / "k8s" / "dashboards" / "ferryman.json"
# Words in PromQL that are not metric names.
PROMQL_WORDS = {
    "sum", "by", "rate", "increase", "histogram_quantile", "topk", "or", "vector",
    "label_values", "le", "without", "on", "ignoring",
}  # fmt: skip
GROUPS = """
domain: jobs
descriptors:
  - key: tenant
    copies:
      limit: 10
      groups:
        - {name: everyone, limit: 20, members: ["*"]}
"""


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside label matchers,
    ranges and strings, that are neither functions, keywords nor grouping labels."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)) - PROMQL_WORDS
    # label_values(metric, label): the label is no metric.
    for _metric, label in re.findall(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", expr):
        names.discard(label)
    return names


def scrape(server: Server) -> dict[str, set[str]]:
    """The metrics in a real /metrics answer: name -> the label names its samples carry."""
    port = server.service.prometheus_port
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", server.settings.prometheus_path)
        response = conn.getresponse()
        body = response.read().decode()
        assert response.status == 200, body
    finally:
        conn.close()
    metrics: dict[str, set[str]] = {}
    for line in body.splitlines():
        if line[:1] == "#" or not line:
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        labels = re.findall(r'[{,](\w+)="', line)
        metrics.setdefault(name, set()).update(labels)
    return metrics


def grouping_labels(expr: str) -> set[str]:
    """The labels a query groups by (``by (a, b)``)."""
    found: set[str] = set()
    for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
        found.update(label.strip() for label in group.split(",") if label.strip())
    return found


def test_metric_name_extraction() -> None:
    """The checker itself: functions, grouping labels, matchers and ranges are not names."""
    expr = (
        'histogram_quantile(0.99, sum by (le, algorithm) (rate(a_bucket{domain=~"$d"}[5m])))'
        " - (sum(rate(b[$__rate_interval])) or vector(0))"
    )
    assert metric_names(expr) == {"a_bucket", "b"}
    assert metric_names("label_values(c_total, domain)") == {"c_total"}
    assert grouping_labels(expr) == {"le", "algorithm"}


def test_dashboard_is_well_formed() -> None:
    """Unique panel ids, every panel on the grid and on the dashboard's Prometheus data
    source variable, and a panel for each part of the console."""
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "domain"} <= variables
    for panel in panels(dashboard):
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    titles = " | ".join(p["title"].lower() for p in panels(dashboard))
    for part in (
        "by domain",
        "by rule",
        "over the limit",
        "backend latency",
        "errors",
        "top over-limit",
        "by tier",
        "copies held",
        "configuration loads",
        "leases",
        "token bucket",
    ):
        assert part in titles, part


def test_every_query_names_a_metric_the_service_exports(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Traffic of every kind (fixed windows over the limit and in shadow mode, burst tiers,
    held and transferred copies, a capacity lease, a quota bucket), then each metric a
    dashboard query selects is in the server's real /metrics."""
    config_dir.write("mx.yaml", MIXED)
    config_dir.write("jobs.yaml", GROUPS)
    config_dir.write(
        "web.yaml",
        "domain: web\ndescriptors:\n"
        "  - key: bulk\n    shadow_mode: true\n"
        "    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    config_dir.write("resources.yaml", resources_yaml())
    config_dir.write("quota.yaml", "global_default_bucket: {size: 3, fill_rate: 1}\n")
    server = make_server(use_prometheus=True, prometheus_addr="127.0.0.1:0")
    lease = doorman_pb2.GetCapacityRequest(client_id="c")
    lease.resource.add(resource_id="fair", priority=1, wants=5)
    doorman_pb2_grpc.CapacityStub(server.channel).GetCapacity(lease, timeout=10)  # type: ignore[no-untyped-call]
    allow = quota_service_pb2.AllowRequest(namespace="n", bucket_name="b", tokens_requested=1)
    assert quota_stub(server.channel).Allow(allow, timeout=10).status == 0
    for _ in range(3):
        server.ask("mx", *MIXED_REQUEST)
        server.ask("web", [("bulk", "b")])
    target = f"127.0.0.1:{server.service.grpc_port}"
    with (
        ferryman.Client(target, fail_open=False) as giver,
        ferryman.Client(target, fail_open=False) as taker,
        giver.hold_copy("jobs", {"tenant": "acme"}, copies=3) as hold,
    ):
        assert hold.success
        staged = hold.transfer(1, ttl=30)
        with taker.seize_copy(staged) as seized:
            assert seized.copies == 1
            exported = scrape(server)

    dashboard = json.loads(DASHBOARD.read_text())
    names = set().union(*(metric_names(q) for q in queries(dashboard)))
    assert len(names) >= 20  # the extraction found the dashboard's metrics
    assert not names - set(exported), f"not exported: {sorted(names - set(exported))}"
    # Each label a query groups by is carried by a metric it reads (``le`` by histograms'
    # buckets; deeper levels than key1 only by rules that deep, so they may be absent).
    for query in queries(dashboard):
        carried = set().union(*(exported[name] for name in metric_names(query)))
        missing = grouping_labels(query) - carried - {"le", "key2", "key3"}
        assert not missing, f"{query}: no metric carries {sorted(missing)}"
