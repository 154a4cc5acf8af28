"""``ferryman explain --envoy``: for a route of an Envoy or Istio file, the descriptors it
sends and what each reaches, on the shipped files and descriptors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ferryman.cli import main

from helpers.envoy_cli import Run

ROOT = Path(__file__).resolve().parents[1]
FRONT = str(ROOT / "envoy" / "front-proxy.yaml")
SIDECAR = str(ROOT / "k8s" / "overlays" / "sidecar" / "envoy.yaml")
DESCRIPTORS = str(ROOT / "descriptors")
K8S_DESCRIPTORS = str(ROOT / "k8s" / "base" / "descriptors")
SHIPPED = [
    (["envoy/front-proxy.yaml"], "descriptors"),
    (["envoy/front-proxy-fail-closed.yaml"], "descriptors"),
    (["envoy/sidecar.yaml"], "descriptors"),
    (["k8s/overlays/sidecar/envoy.yaml"], "k8s/base/descriptors"),
    (["k8s/overlays/istio/envoyfilter-ratelimit.yaml"], "k8s/base/descriptors"),
]
# A tenant header that may be absent, before a fixed plan; a user header that must be there.
OPTIONAL = """\
static_resources:
  listeners:
    - name: shop
      address:
        socket_address: {address: 127.0.0.1, port_value: 10000}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": HCM
                stat_prefix: shop
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": RL
                      domain: shop
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {cluster_name: ferryman}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                route_config:
                  virtual_hosts:
                    - name: shop
                      domains: ["*"]
                      routes:
                        - name: checkout
                          match: {prefix: /checkout}
                          route:
                            cluster: upstream
                            rate_limits:
                              - actions:
                                  - request_headers:
                                      header_name: x-tenant
                                      descriptor_key: tenant
                                      skip_if_absent: true
                                  - generic_key: {descriptor_key: plan, descriptor_value: gold}
                              - actions:
                                  - request_headers: {header_name: x-user, descriptor_key: usr}
""".replace(
    "HCM",
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager",
).replace("RL", "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit")
SHOP = """\
domain: shop
descriptors:
  - key: plan
    value: gold
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: tenant
    value: acme
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
"""


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    """``ferryman explain ARGS`` in this process: its exit status and what it printed."""
    capsys.readouterr()
    code = main(["explain", *args])
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)


def answer(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    run = explain(capsys, *args, "--format", "json")
    assert run.code in (0, 1), run.err
    found: dict[str, Any] = json.loads(run.out)
    return run.code, found


@pytest.mark.parametrize(("files", "config"), SHIPPED, ids=[s[0][0] for s in SHIPPED])
def test_every_route_of_the_shipped_files_reaches_a_rule(
    files: list[str], config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every entry of every route, each variable left open, reaches a rule of its domain."""
    args = [a for f in files for a in ("--envoy", str(ROOT / f))]
    code, found = answer(capsys, *args, "--config", str(ROOT / config))
    assert code == 0 and found["entries"]
    for entry in found["entries"]:
        assert "error" not in entry and entry["descriptors"], entry
        for d in entry["descriptors"]:
            assert d["reaches"] if "reaches" in d else d["explain"]["rule"], d


def test_a_route_with_its_header_is_explained_as_explain_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/api/ with its :path given: the descriptor it sends walks as ``ferryman explain``
    walks it (exact, then the wildcard); the virtual host's entries come with it, the
    client address left variable."""
    code, found = answer(
        capsys, "--envoy", FRONT, "--config", DESCRIPTORS, "--route", "/api/",
        "--header", ":path=/api/v1",
    )  # fmt: skip
    assert code == 0
    sends = [e["sends"] for e in found["entries"]]
    assert sends == [
        "(generic_key, slow-path), (path, <header :path>)",
        "(remote_address, <client address>)",
        "(header_match, partner)",
    ]
    first = found["entries"][0]["descriptors"][0]["explain"]
    code, direct = answer(
        capsys, "--config", DESCRIPTORS, "--domain", "edge-proxy",
        "--descriptor", "generic_key=slow-path,path=/api/v1",
    )  # fmt: skip
    assert first["walk"] == direct["descriptors"][0]["walk"]
    assert first["rule"] == direct["descriptors"][0]["rule"]
    assert [s["matched"] for s in first["walk"]] == ["exact", "wildcard"]
    text = explain(
        capsys, "--envoy", FRONT, "--config", DESCRIPTORS, "--route", "/api/",
        "--header", ":PATH=/api/v1",
    ).out  # fmt: skip
    assert "route /api/ (virtual host edge) -> domain edge-proxy" in text
    assert "descriptor generic_key=slow-path,path=/api/v1" in text
    assert "level 2: path=/api/v1: wildcard /api/*" in text
    assert "descriptor remote_address=<client address>" in text
    assert "-> fixed window 100 per minute (name per_ip)" in text
    assert "not sent when the headers do not match" in text


def test_a_variable_header_lists_the_rules_it_reaches_and_for_which_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With no header given, each value the tree names is a way down, and a value it does
    not name reaches nothing; a header that must be there is named as dropping the
    descriptor when missing."""
    code, found = answer(capsys, "--envoy", SIDECAR, "--config", K8S_DESCRIPTORS)
    assert code == 0
    first = found["entries"][0]
    assert first["routes"] == ["/messages"] and first["domain"] == "messaging"
    [d] = first["descriptors"]
    assert [(r["stats_key"], r["only_when"]) for r in d["reaches"]] == [
        ("messaging.message_type_marketing.to_number", ["header x-message-type = marketing"])
    ]
    assert d["dropped_when"] == ["header x-message-type missing", "header x-to-number missing"]
    text = explain(capsys, "--envoy", SIDECAR, "--config", K8S_DESCRIPTORS).out
    assert "when header x-message-type = marketing" in text
    assert "-> any other value: no rule, nothing counted" in text
    assert "not sent at all when the header x-to-number is missing" in text


def test_the_client_address_is_given_and_an_unknown_route_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--remote-address fills the remote_address entry, which is then explained (bare key,
    its counter); a route no entry is sent for exits 1 naming the routes there are."""
    code, found = answer(
        capsys, "--envoy", FRONT, "--config", DESCRIPTORS, "--route", "/bulk",
        "--remote-address", "10.0.0.7",
    )  # fmt: skip
    assert code == 0
    explained = [d["explain"] for e in found["entries"] for d in e["descriptors"] if "explain" in d]
    by_entries = {tuple(map(tuple, x["entries"])): x for x in explained}
    remote = by_entries[(("remote_address", "10.0.0.7"),)]
    assert remote["walk"][0]["matched"] == "bare key"
    assert remote["counter_key"].startswith("edge-proxy_remote_address_10.0.0.7_")
    run = explain(capsys, "--envoy", FRONT, "--config", DESCRIPTORS, "--route", "/nope")
    assert run.code == 1
    assert "no rate_limits entry for route '/nope' (routes: /, /api/, /bulk" in run.out


def test_an_optional_header_sends_two_descriptors_and_a_miss_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A skip_if_absent header: the descriptor with it (reaching the tenant's rule when the
    tree names the value) and without it; an entry whose key the tree lacks says where the
    walk stopped and what the tree has there, and the command exits 1."""
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(OPTIONAL)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "shop.yaml").write_text(SHOP)
    config = str(tmp_path / "config")
    code, found = answer(capsys, "--envoy", str(envoy), "--config", config, "--route", "checkout")
    assert code == 1
    optional, missing = found["entries"]
    with_tenant, without = optional["descriptors"]
    assert [r["stats_key"] for r in with_tenant["reaches"]] == ["shop.tenant_acme.plan_gold"]
    assert with_tenant["reaches"][0]["only_when"] == ["header x-tenant = acme"]
    assert without["absent"] == ["header x-tenant"]
    assert without["explain"]["rule"]["stats_key"] == "shop.plan_gold"
    [stop] = missing["descriptors"][0]["stops"]
    assert stop["key"] == "usr" and stop["expected"] == ["plan=gold", "tenant=acme", "user"]
    text = explain(
        capsys, "--envoy", str(envoy), "--config", config, "--header", "x-tenant=acme"
    ).out
    assert "descriptor tenant=acme,plan=gold" in text
    assert "rule: fixed window 5 per second" in text
    assert "when absent: header x-tenant" in text
    assert "-> stops at level 1: no (usr, <header x-user>); the tree has there: plan=gold" in text


def test_bad_uses_are_refused_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """--envoy with --target or --descriptor, a header not NAME=VALUE, a client address that
    is not an IP address, and explain with neither --envoy nor --domain: exit 2 with a
    message."""
    cases = [
        (["--envoy", FRONT, "--target", "127.0.0.1:1"], "--target"),
        (["--envoy", FRONT, "--descriptor", "a=b"], "--descriptor"),
        (["--envoy", FRONT, "--config", DESCRIPTORS, "--header", "novalue"], "--header"),
        (["--envoy", FRONT, "--config", DESCRIPTORS, "--remote-address", "x"], "--remote-address"),
        (["--config", DESCRIPTORS], "--domain"),
    ]
    for args, named in cases:
        run = explain(capsys, *args)
        assert run.code == 2, (args, run.out)
        assert named in run.err and "Traceback" not in run.err
