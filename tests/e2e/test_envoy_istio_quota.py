"""`ferryman envoy generate --quota --format istio` with the real Envoy: each EnvoyFilter's
patches, applied to a proxy-shaped bootstrap the way istiod applies them, pass
`envoy --mode validate`, and a sidecar patched so holds a share from a real ferryman."""

from __future__ import annotations

import copy
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ferryman.config.loader import load_directory

from envoy_procs import (
    ADMIN,
    FERRYMAN,
    LISTENER,
    ROOT,
    UPSTREAM,
    EnvoyProcess,
    FerrymanProcess,
    Upstream,
    envoy_validate,
    render,
    request,
    wait_for,
)
from helpers.envoy_cli import envoy_cli
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

DESCRIPTORS = ROOT / "descriptors"
QUOTA_EXAMPLE = ROOT / "envoy" / "quota" / "descriptors"
DOMAINS = sorted(load_directory(DESCRIPTORS, ignore_dotfiles=True, merge_domains=False).domains)
HCM = "envoy.filters.network.http_connection_manager"
ROUTER = "envoy.filters.http.router"
SERVICE = "ferryman.mesh.svc.cluster.local:8081"
PORTS = ("--grpc-port", "0", "--http-port", "0", "--debug-port", "0")
Doc = dict[str, Any]


def istio(capsys: pytest.CaptureFixture[str], config: Path, domain: str, *args: str) -> list[Doc]:
    """The EnvoyFilters `envoy generate --quota --format istio` prints."""
    run = envoy_cli(
        capsys,
        "generate",
        "--config",
        str(config),
        "--domain",
        domain,
        "--format",
        "istio",
        "--quota",
        *args,
    )
    assert run.code == 0, run.err
    return [doc for doc in yaml.safe_load_all(run.out) if doc]


def quota_config(doc: Doc) -> Doc:
    [value] = [
        p["patch"]["value"] for p in doc["spec"]["configPatches"] if p["applyTo"] == "HTTP_FILTER"
    ]
    config: Doc = value["typed_config"]
    return config


def proxy_bootstrap() -> Doc:
    """A bootstrap shaped like an Istio proxy's HTTP listener: one connection manager whose
    filters end with the router, one catch-all route to an upstream cluster."""
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network"
        ".http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "inbound",
        "http_filters": [
            {
                "name": ROUTER,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "app",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "app"}}],
                }
            ]
        },
    }
    address = {"socket_address": {"address": "127.0.0.1", "port_value": LISTENER}}
    upstream = {"socket_address": {"address": "127.0.0.1", "port_value": UPSTREAM}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ADMIN}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "proxy",
                    "address": address,
                    "filter_chains": [{"filters": [{"name": HCM, "typed_config": manager}]}],
                }
            ],
            "clusters": [
                {
                    "name": "app",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "app",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": upstream}}]}],
                    },
                }
            ],
        },
    }


def apply(doc: Doc) -> Doc:
    """A proxy bootstrap with one EnvoyFilter's patches applied as istiod applies an ADD of
    a cluster and an INSERT_BEFORE of an http filter."""
    tree = proxy_bootstrap()
    manager = tree["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = manager["typed_config"]["http_filters"]
    for patch in doc["spec"]["configPatches"]:
        operation, value = patch["patch"]["operation"], copy.deepcopy(patch["patch"]["value"])
        if patch["applyTo"] == "CLUSTER":
            assert operation == "ADD"
            tree["static_resources"]["clusters"].append(value)
        else:
            assert (patch["applyTo"], operation) == ("HTTP_FILTER", "INSERT_BEFORE")
            chain = patch["match"]["listener"]["filterChain"]["filter"]
            assert chain["name"] == HCM
            names = [f["name"] for f in filters]
            filters.insert(names.index(chain["subFilter"]["name"]), value)
    return tree


@pytest.mark.parametrize("domain", DOMAINS)
def test_each_envoyfilter_applied_to_a_proxy_passes_envoy_validate(
    domain: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each EnvoyFilter's cluster and filter, patched into a proxy bootstrap, pass
    `envoy --mode validate`."""
    for doc in istio(capsys, DESCRIPTORS, domain, "--ferryman", SERVICE):
        result = envoy_validate(apply(doc), tmp_path / doc["metadata"]["name"])
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_istio_quota_overlays_envoyfilters_pass_envoy_validate(tmp_path: Path) -> None:
    """k8s/overlays/istio-quota's EnvoyFilters (headers mapped, the Service's address),
    each applied to a proxy bootstrap, pass `envoy --mode validate`."""
    path = ROOT / "k8s" / "overlays" / "istio-quota" / "envoyfilters.yaml"
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert len(docs) == 2
    for doc in docs:
        result = envoy_validate(apply(doc), tmp_path / doc["metadata"]["name"])
        assert result.returncode == 0, result.stdout + result.stderr


def test_envoy_validate_refuses_a_misspelt_field_of_the_patch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The validation above can fail: a misspelt field or type URL in the filter is refused."""
    [gateway, _] = istio(capsys, DESCRIPTORS, "edge-proxy", "--ferryman", SERVICE)
    misspelt = copy.deepcopy(gateway)
    config = quota_config(misspelt)
    config["bucket_matcher"] = config.pop("bucket_matchers")
    result = envoy_validate(apply(misspelt), tmp_path / "field")
    assert result.returncode != 0
    assert "bucket_matcher" in result.stdout + result.stderr
    config = quota_config(gateway)
    config["@type"] = config["@type"].replace("RateLimitQuotaFilterConfig", "RateLimitQuotaConfig")
    result = envoy_validate(apply(gateway), tmp_path / "type")
    assert result.returncode != 0


def _rlqs(ferryman: FerrymanProcess) -> Any:
    url = f"http://127.0.0.1:{ferryman.debug_port}/rlqs"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def test_a_sidecar_patched_by_its_envoyfilter_holds_a_share_from_ferryman(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real Envoy on a proxy bootstrap patched with the sidecars' EnvoyFilter (the quota
    example's domain) opens a quota stream to a real ferryman, which shows it by its
    address and assigns its bucket a token bucket of the tenant's 20 per second."""
    [_, sidecar] = istio(capsys, QUOTA_EXAMPLE, "quota")
    upstream = Upstream().start()
    ferryman = FerrymanProcess(
        tmp_path / "ferryman",
        ["--config", str(QUOTA_EXAMPLE), *PORTS],
    )
    ferryman.env["GRPC_HOST"] = "127.0.0.1"
    ferryman.start()
    envoy: EnvoyProcess | None = None
    try:
        admin, listener = free_port(), free_port()
        ports = {ADMIN: admin, LISTENER: listener, UPSTREAM: upstream.port}
        ports[FERRYMAN] = ferryman.grpc_port
        envoy = EnvoyProcess(render(apply(sidecar), ports), tmp_path / "envoy", admin).start()
        assert request(listener, "/", {"tenant": "acme"})[0] == 200

        def assigned() -> Any:
            page = _rlqs(ferryman)
            buckets = [b for b in page["buckets"] if b["bucket_id"] == {"tenant": "acme"}]
            envoys = buckets[0]["envoys"] if buckets else []
            return envoys if envoys and envoys[0]["assigned"] else None

        [held] = wait_for(assigned, timeout=20)
        assert held["assigned"]["tokens_per_fill"] / held["assigned"]["fill_interval_seconds"] == 20
        [stream] = _rlqs(ferryman)["streams"]
        assert stream["envoy"].startswith("ipv4:127.0.0.1:")
        assert stream["domain"] == "quota"
    finally:
        if envoy is not None:
            envoy.stop()
        ferryman.stop()
        upstream.stop()
