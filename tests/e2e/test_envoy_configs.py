"""Every Envoy configuration the project ships passes Envoy's own validation: the envoy/
bootstraps and the Istio EnvoyFilter patches applied to a gateway-shaped bootstrap."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from ferryman.config.loader import load_directory

from envoy_procs import ADMIN, ENVOY_DIR, FERRYMAN, LISTENER, ROOT, UPSTREAM, envoy_validate, render

pytestmark = pytest.mark.e2e

CONFIGS = sorted(p.name for p in ENVOY_DIR.glob("*.yaml"))
ENVOYFILTERS = [
    ROOT / "k8s" / "overlays" / "istio" / "envoyfilter-ratelimit.yaml",
    ROOT / "k8s" / "overlays" / "istio" / "envoyfilter-cluster.yaml",
]
REFERENCE_ENVOYFILTERS = [ROOT / "k8s" / "istio-reference" / "envoyfilters.yaml"]
RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute"


def load(name: str) -> dict[str, Any]:
    tree: dict[str, Any] = yaml.safe_load((ENVOY_DIR / name).read_text())
    return tree


def hcm(tree: dict[str, Any]) -> dict[str, Any]:
    [listener] = tree["static_resources"]["listeners"]
    [chain] = listener["filter_chains"]
    [manager] = chain["filters"]
    config: dict[str, Any] = manager["typed_config"]
    return config


def ratelimit_filter(tree: dict[str, Any]) -> dict[str, Any]:
    [entry] = [f for f in hcm(tree)["http_filters"] if f["name"] == RATELIMIT_FILTER]
    config: dict[str, Any] = entry["typed_config"]
    return config


def test_there_are_configs_to_check() -> None:
    """envoy/ holds the front proxy, its fail-closed variant, routing on the rate limit
    answer's dynamic metadata, and the sidecar layout."""
    assert CONFIGS == [
        "dynamic-metadata.yaml",
        "front-proxy-fail-closed.yaml",
        "front-proxy.yaml",
        "sidecar.yaml",
    ]


@pytest.mark.parametrize("name", CONFIGS)
def test_config_passes_envoy_validate(name: str, tmp_path: Path) -> None:
    """`envoy --mode validate` accepts the committed file as it is."""
    result = envoy_validate(load(name), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", CONFIGS)
def test_config_uses_only_the_documented_ports(name: str) -> None:
    """Only ports 9901, 10000, 8000 and 8081 appear: the tour's, which tests remap."""
    identity = {port: port for port in (ADMIN, LISTENER, UPSTREAM, FERRYMAN)}
    render(load(name), identity)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_asks_ferryman_the_documented_way(name: str) -> None:
    """The filter calls HTTP/2 `ferryman` (v3, timeout, draft-03 headers) on known domains."""
    tree = load(name)
    config = ratelimit_filter(tree)
    service = config["rate_limit_service"]
    assert service["transport_api_version"] == "V3"
    cluster_name = service["grpc_service"]["envoy_grpc"]["cluster_name"]
    assert config["enable_x_ratelimit_headers"] == "DRAFT_VERSION_03"
    assert config["timeout"]
    assert isinstance(config["failure_mode_deny"], bool)
    [cluster] = [c for c in tree["static_resources"]["clusters"] if c["name"] == cluster_name]
    options = cluster["typed_extension_protocol_options"]
    [http] = options.values()
    assert "http2_protocol_options" in http["explicit_http_config"]
    domains = {config["domain"]}
    for vhost in hcm(tree)["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            per_route = route.get("typed_per_filter_config", {}).get(RATELIMIT_FILTER, {})
            if per_route.get("domain"):
                domains.add(per_route["domain"])
    loaded = load_directory(ROOT / "descriptors", ignore_dotfiles=True, merge_domains=False)
    assert domains <= set(loaded.domains)


def test_front_proxy_actions_cover_headers_address_generic_keys_and_hits_addend() -> None:
    """The front proxy uses header, address, generic key and header match actions, hits_addend."""
    text = yaml.safe_dump(hcm(load("front-proxy.yaml"))["route_config"])
    for action in ("request_headers", "remote_address", "generic_key", "header_value_match"):
        assert f"{action}:" in text
    assert "hits_addend:" in text


def test_fail_closed_variant_differs_only_in_failure_mode_deny() -> None:
    """front-proxy-fail-closed.yaml is front-proxy.yaml with failure_mode_deny: true."""
    open_tree, closed_tree = load("front-proxy.yaml"), load("front-proxy-fail-closed.yaml")
    assert ratelimit_filter(open_tree)["failure_mode_deny"] is False
    assert ratelimit_filter(closed_tree)["failure_mode_deny"] is True
    ratelimit_filter(closed_tree)["failure_mode_deny"] = False
    assert closed_tree == open_tree


def gateway() -> dict[str, Any]:
    """A bootstrap shaped like an Istio ingress gateway's: one HTTP listener with the router
    and one catch-all virtual host; the EnvoyFilter patches are applied to it."""
    tree = copy.deepcopy(load("front-proxy.yaml"))
    manager = hcm(tree)
    manager["http_filters"] = [f for f in manager["http_filters"] if f["name"] != RATELIMIT_FILTER]
    manager["route_config"]["virtual_hosts"] = [
        {
            "name": "gateway",
            "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}],
        }
    ]
    tree["static_resources"]["clusters"] = [
        c for c in tree["static_resources"]["clusters"] if c["name"] == "upstream"
    ]
    return tree


def apply_envoyfilters(tree: dict[str, Any], documents: list[dict[str, Any]]) -> list[str]:
    """Apply the patches the way istiod does for these operations; the cluster names the
    rate limit filters call."""
    manager = hcm(tree)
    called = []
    for document in documents:
        assert document["kind"] == "EnvoyFilter"
        assert document["spec"]["workloadSelector"]["labels"] == {"istio": "ingressgateway"}
        for patch in document["spec"]["configPatches"]:
            assert patch["match"]["context"] == "GATEWAY"
            operation, value = patch["patch"]["operation"], patch["patch"]["value"]
            if patch["applyTo"] == "HTTP_FILTER":
                assert operation == "INSERT_BEFORE"
                sub = patch["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"]
                names = [f["name"] for f in manager["http_filters"]]
                manager["http_filters"].insert(names.index(sub), value)
                grpc = value["typed_config"]["rate_limit_service"]["grpc_service"]
                called.append(grpc["envoy_grpc"]["cluster_name"])
            elif patch["applyTo"] == "VIRTUAL_HOST":
                assert operation == "MERGE"
                for vhost in manager["route_config"]["virtual_hosts"]:
                    vhost.update(copy.deepcopy(value))
            elif patch["applyTo"] == "CLUSTER":
                assert operation == "ADD"
                tree["static_resources"]["clusters"].append(value)
            else:
                raise AssertionError(f"unexpected applyTo {patch['applyTo']}")
    return called


def envoyfilters(paths: list[Path]) -> list[dict[str, Any]]:
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_istio_overlay_envoyfilter_pair_passes_envoy_validate(tmp_path: Path) -> None:
    """The overlay's filter calls its pair's STRICT_DNS cluster; the patched gateway validates."""
    tree = gateway()
    called = apply_envoyfilters(tree, envoyfilters(ENVOYFILTERS))
    clusters = {c["name"]: c for c in tree["static_resources"]["clusters"]}
    assert called == ["ferryman_ratelimit"]
    cluster = clusters["ferryman_ratelimit"]
    assert cluster["type"] == "STRICT_DNS"
    [[endpoint]] = [e["lb_endpoints"] for e in cluster["load_assignment"]["endpoints"]]
    address = endpoint["endpoint"]["address"]["socket_address"]
    assert address == {"address": "ferryman.default.svc.cluster.local", "port_value": 8081}
    result = envoy_validate(tree, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_istio_reference_envoyfilters_pass_envoy_validate(tmp_path: Path) -> None:
    """The Istio guide's two EnvoyFilters, applied to a gateway bootstrap, validate in Envoy."""
    tree = gateway()
    called = apply_envoyfilters(tree, envoyfilters(REFERENCE_ENVOYFILTERS))
    assert called == ["outbound|8081||ratelimit.default.svc.cluster.local"]
    # istiod generates that cluster from the Service; stand in for it.
    ferryman = copy.deepcopy(
        next(
            c
            for c in load("front-proxy.yaml")["static_resources"]["clusters"]
            if c["name"] == "ferryman"
        )
    )
    ferryman["name"] = ferryman["load_assignment"]["cluster_name"] = called[0]
    tree["static_resources"]["clusters"].append(ferryman)
    result = envoy_validate(tree, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
