"""`ferryman envoy generate --quota --format istio`: one EnvoyFilter for the ingress gateway
and one for the sidecars, each adding the HTTP/2 cluster its rate limit quota filter calls;
the filter's bucket matchers are the bootstrap's and `ferryman envoy check` reaches every
rule with them. tests/e2e/test_envoy_istio_quota.py runs Envoy on the patches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ferryman.config.loader import load_directory

from helpers.envoy_cli import envoy_cli

ROOT = Path(__file__).resolve().parents[1]
DESCRIPTORS = ROOT / "descriptors"
DOMAINS = sorted(load_directory(DESCRIPTORS, ignore_dotfiles=True, merge_domains=False).domains)
QUOTA_FILTER = "envoy.filters.http.rate_limit_quota"
SERVICE = "ferryman.mesh.svc.cluster.local:8081"
Doc = dict[str, Any]


def generate(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> str:
    run = envoy_cli(capsys, "generate", "--config", str(config), *args)
    assert run.code == 0, run.err
    return run.out


def istio(capsys: pytest.CaptureFixture[str], domain: str, *args: str) -> list[Doc]:
    text = generate(capsys, DESCRIPTORS, "--domain", domain, "--format", "istio", "--quota", *args)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def patches(doc: Doc, apply_to: str) -> list[Doc]:
    return [p for p in doc["spec"]["configPatches"] if p["applyTo"] == apply_to]


def quota_config(doc: Doc) -> Doc:
    [patch] = patches(doc, "HTTP_FILTER")
    value: Doc = patch["patch"]["value"]
    assert value["name"] == QUOTA_FILTER
    config: Doc = value["typed_config"]
    return config


def test_a_gateway_and_a_sidecar_envoyfilter_each_add_the_cluster_their_filter_calls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The gateway's EnvoyFilter selects the ingress gateway in istio-system; the sidecars'
    selects the pods labelled with the domain and adds the cluster outbound and the filter
    inbound; both call ferryman's address over HTTP/2 through the one cluster they add."""
    gateway, sidecar = istio(capsys, "edge-proxy", "--ferryman", SERVICE)
    assert gateway["metadata"] == {
        "name": "ferryman-quota-edge-proxy-gateway",
        "namespace": "istio-system",
    }
    assert gateway["spec"]["workloadSelector"] == {"labels": {"istio": "ingressgateway"}}
    assert sidecar["metadata"] == {"name": "ferryman-quota-edge-proxy-sidecar"}
    assert sidecar["spec"]["workloadSelector"] == {"labels": {"ferryman/quota": "edge-proxy"}}
    contexts = {
        doc["metadata"]["name"].rsplit("-", 1)[1]: {
            p["applyTo"]: p["match"]["context"] for p in doc["spec"]["configPatches"]
        }
        for doc in (gateway, sidecar)
    }
    assert contexts == {
        "gateway": {"CLUSTER": "GATEWAY", "HTTP_FILTER": "GATEWAY"},
        "sidecar": {"CLUSTER": "SIDECAR_OUTBOUND", "HTTP_FILTER": "SIDECAR_INBOUND"},
    }
    for doc in (gateway, sidecar):
        [cluster] = [p["patch"]["value"] for p in patches(doc, "CLUSTER")]
        grpc = quota_config(doc)["rlqs_server"]["envoy_grpc"]
        assert grpc == {"cluster_name": cluster["name"], "authority": SERVICE.split(":")[0]}
        assert cluster["type"] == "STRICT_DNS"
        [options] = cluster["typed_extension_protocol_options"].values()
        assert "http2_protocol_options" in options["explicit_http_config"]
        [[endpoint]] = [e["lb_endpoints"] for e in cluster["load_assignment"]["endpoints"]]
        address = endpoint["endpoint"]["address"]["socket_address"]
        assert f"{address['address']}:{address['port_value']}" == SERVICE


@pytest.mark.parametrize("domain", DOMAINS)
def test_the_filter_builds_the_bootstraps_buckets(
    domain: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Istio filter's domain and bucket matchers are the `--quota` bootstrap's."""
    text = generate(capsys, DESCRIPTORS, "--domain", domain, "--quota")
    tree = yaml.safe_load(text)
    manager = tree["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    [bootstrap] = [
        f["typed_config"]
        for f in manager["typed_config"]["http_filters"]
        if f["name"] == QUOTA_FILTER
    ]
    for doc in istio(capsys, domain):
        config = quota_config(doc)
        assert config["domain"] == domain
        assert config["bucket_matchers"] == bootstrap["bucket_matchers"]


def test_envoys_are_unnamed_unless_a_name_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """Without NAME no initial metadata is sent (ferryman shows each Envoy's address: Envoy
    sends initial_metadata as written); with NAME every Envoy sends it as ferryman-envoy."""
    for doc in istio(capsys, "edge-proxy"):
        assert "initial_metadata" not in quota_config(doc)["rlqs_server"]
    for doc in istio(capsys, "edge-proxy", "edge"):
        metadata = quota_config(doc)["rlqs_server"]["initial_metadata"]
        assert metadata == [{"key": "ferryman-envoy", "value": "edge"}]


@pytest.mark.parametrize("domain", DOMAINS)
def test_envoy_check_reaches_every_shared_rule_through_the_envoyfilters(
    domain: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ferryman envoy check` reads both EnvoyFilters' quota filters with no error: every
    bucket matcher of each is an entry, and each entry's bucket id reaches a rule."""
    text = generate(capsys, DESCRIPTORS, "--domain", domain, "--format", "istio", "--quota")
    path = tmp_path / "envoyfilters.yaml"
    path.write_text(text)
    run = envoy_cli(capsys, "check", str(path), "--config", str(DESCRIPTORS), "--format", "json")
    assert run.code == 0, run.err
    report = json.loads(run.out)
    assert report["errors"] == 0, report["findings"]
    matchers = 0
    for doc in yaml.safe_load_all(text):
        found = quota_config(doc)["bucket_matchers"]
        matchers += len(found.get("matcher_list", {}).get("matchers", []))
        matchers += "on_no_match" in found
    quota = [e for e in report["entries"] if e.get("quota")]
    assert len(quota) == matchers
    assert all(r["reaches"] for e in quota for r in e["results"])


def test_a_name_that_is_no_object_name_is_made_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A domain with capitals or underscores gives EnvoyFilter names and a label value
    Kubernetes accepts."""
    (tmp_path / "d.yaml").write_text(
        "domain: Shop_Front\ndescriptors:\n"
        "  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
    )
    text = generate(capsys, tmp_path, "--domain", "Shop_Front", "--format", "istio", "--quota")
    docs = [doc for doc in yaml.safe_load_all(text) if doc]
    names = [doc["metadata"]["name"] for doc in docs]
    assert names == ["ferryman-quota-shop-front-gateway", "ferryman-quota-shop-front-sidecar"]
    assert docs[1]["spec"]["workloadSelector"]["labels"] == {"ferryman/quota": "shop-front"}
