"""`ferryman envoy check`: the shipped Envoy and Istio files against the shipped descriptors,
each kind of mismatch with its message and exit status, and files it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers.envoy_cli import envoy_cli

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """\
domain: shop
descriptors:
  - key: tenant
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: generic_key
    value: checkout
    rate_limit: {unit: second, requests_per_unit: 2}
"""

# Every entry reaches a rule, every rule is reached, no descriptor is dropped.
ENVOY = """\
static_resources:
  listeners:
    - name: shop
      address:
        socket_address: {address: 127.0.0.1, port_value: 10000}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": HCM_TYPE
                stat_prefix: shop
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": RL_TYPE
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
                      rate_limits:
                        - actions:
                            - request_headers:
                                header_name: x-tenant
                                descriptor_key: tenant
                                skip_if_absent: true
                            - generic_key: {descriptor_key: plan, descriptor_value: gold}
                        - actions:
                            - request_headers:
                                header_name: x-user
                                descriptor_key: user
                                skip_if_absent: true
                        - actions:
                            - generic_key: {descriptor_value: checkout}
                      routes:
                        - match: {prefix: /}
                          route: {cluster: upstream}
""".replace(
    "HCM_TYPE",
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager",
).replace("RL_TYPE", "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit")

USER = """\
                            - request_headers:
                                header_name: x-user
                                descriptor_key: user
                                skip_if_absent: true
"""
TENANT_PLAN = """\
                            - request_headers:
                                header_name: x-tenant
                                descriptor_key: tenant
                                skip_if_absent: true
                            - generic_key: {descriptor_key: plan, descriptor_value: gold}
"""
PLAN_TENANT = """\
                            - generic_key: {descriptor_key: plan, descriptor_value: gold}
                            - request_headers:
                                header_name: x-tenant
                                descriptor_key: tenant
                                skip_if_absent: true
"""
CHECKOUT = """\
                        - actions:
                            - generic_key: {descriptor_value: checkout}
"""

# (name, text replaced, replacement, exit status, exit status with --strict, severity, message)
BROKEN = [
    (
        "misspelled key",
        "descriptor_key: user",
        "descriptor_key: usr",
        1,
        1,
        "error",
        "[(usr, <header x-user>)] never matches in domain shop: the walk stops at level 1: "
        "no (usr, <header x-user>) in the tree, which has there: tenant, user, "
        "generic_key=checkout; did you mean 'user'?",
    ),
    (
        "wrong nesting order",
        TENANT_PLAN,
        PLAN_TENANT,
        1,
        1,
        "error",
        "[(plan, gold), (tenant, <header x-tenant>)] never matches in domain shop: the walk "
        "stops at level 1: no (plan, gold) in the tree, which has there: tenant, user, "
        "generic_key=checkout; the tree nests these keys in another order: tenant > plan",
    ),
    (
        "missing descriptor_key",
        "                                descriptor_key: user\n",
        "",
        1,
        1,
        "error",
        "header action for 'x-user' has no descriptor_key: Envoy rejects this entry",
    ),
    (
        "filter domain with no config",
        "domain: shop",
        "domain: shoop",
        1,
        1,
        "error",
        "filter domain 'shoop' has no config (known: shop)",
    ),
    (
        "header action without skip_if_absent",
        USER,
        USER.replace("                                skip_if_absent: true\n", ""),
        0,
        1,
        "warning",
        "Envoy sends no descriptor when the header x-user is missing (add skip_if_absent: "
        "true to send the rest, or make sure it is set)",
    ),
    (
        "unreachable rule",
        CHECKOUT,
        "",
        0,
        1,
        "warning",
        "no Envoy entry reaches this rule",
    ),
]


def _config(tmp_path: Path, text: str = CONFIG) -> Path:
    directory = tmp_path / "descriptors"
    directory.mkdir()
    (directory / "shop.yaml").write_text(text)
    return directory


def _envoy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    return path


SHIPPED = [
    (["envoy/front-proxy.yaml"], "descriptors"),
    (["envoy/front-proxy-fail-closed.yaml"], "descriptors"),
    (["envoy/sidecar.yaml"], "descriptors"),
    (["k8s/overlays/sidecar/envoy.yaml"], "k8s/base/descriptors"),
    (
        [
            "k8s/overlays/istio/envoyfilter-ratelimit.yaml",
            "k8s/overlays/istio/envoyfilter-cluster.yaml",
        ],
        "k8s/base/descriptors",
    ),
]


@pytest.mark.parametrize(("files", "config"), SHIPPED, ids=[s[0][0] for s in SHIPPED])
def test_shipped_envoy_files_reach_the_shipped_descriptors(
    files: list[str], config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every rate_limits entry of the shipped Envoy and Istio files reaches a rule."""
    paths = [str(ROOT / f) for f in files]
    run = envoy_cli(capsys, "check", *paths, "--config", str(ROOT / config), "--format", "json")
    assert run.code == 0, run.out + run.err
    report = json.loads(run.out)
    assert report["errors"] == 0 and report["entries"]
    assert all(r["reaches"] for e in report["entries"] for r in e["results"])


def test_istio_reference_filters_reach_the_reference_configmap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference gateway's EnvoyFilters reach the rules of its ConfigMap."""
    configmap = yaml.safe_load((ROOT / "k8s/istio-reference/ratelimit-config.yaml").read_text())
    config = _config(tmp_path, configmap["data"]["config.yaml"])
    envoyfilters = ROOT / "k8s/istio-reference/envoyfilters.yaml"
    run = envoy_cli(capsys, "check", str(envoyfilters), "--config", str(config), "--strict")
    assert run.code == 0, run.out + run.err
    assert "-> ratelimit.PATH_/productpage: fixed window 1 per minute when header :path" in run.out
    assert "-> ratelimit.PATH: fixed window 100 per minute" in run.out


def test_a_consistent_pair_is_clean_even_when_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's base pair: every entry reaches its rule, no warnings, exit 0 with --strict."""
    config = _config(tmp_path)
    run = envoy_cli(
        capsys, "check", str(_envoy(tmp_path, ENVOY)), "--config", str(config), "--strict"
    )
    assert run.code == 0, run.out
    assert "-> shop.tenant.plan_gold: fixed window 5 per second" in run.out
    assert "-> shop.user: fixed window 10 per minute" in run.out
    assert run.out.endswith("ok: 3 entries, 0 errors, 0 warnings\n")


@pytest.mark.parametrize(
    ("old", "new", "code", "strict_code", "severity", "message"),
    [b[1:] for b in BROKEN],
    ids=[b[0] for b in BROKEN],
)
def test_a_broken_pair_is_reported_with_its_message_and_status(
    old: str,
    new: str,
    code: int,
    strict_code: int,
    severity: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each kind of mismatch: its finding, exit 1 for errors, warnings failing only --strict."""
    assert old in ENVOY
    config = _config(tmp_path)
    envoy = _envoy(tmp_path, ENVOY.replace(old, new))
    run = envoy_cli(capsys, "check", str(envoy), "--config", str(config), "--format", "json")
    assert run.code == code, run.out
    findings = json.loads(run.out)["findings"]
    assert [f["message"] for f in findings if f["severity"] == severity] == [message]
    text = envoy_cli(capsys, "check", str(envoy), "--config", str(config))
    assert f"{severity}: " in text.out and message in text.out
    strict = envoy_cli(capsys, "check", str(envoy), "--config", str(config), "--strict")
    assert strict.code == strict_code


UNREADABLE = [
    (
        "unknown @type",
        "envoy.extensions.filters.http.router.v3.Router",
        "envoy.extensions.filters.http.router.v3.Routr",
        "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[1]"
        ".typed_config.@type: unknown type "
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Routr",
    ),
    ("invalid YAML", 'domains: ["*"]', 'domains: ["*"', "invalid YAML"),
    (
        "a typo in a field",
        "skip_if_absent: true",
        "skip_if_absnet: true",
        "Unknown field 'skip_if_absnet' in message RateLimitActionRequestHeaders",
    ),
    (
        "a value of the wrong type",
        "stat_prefix: shop",
        "stat_prefix: [shop]",
        "invalid HttpConnectionManager: stat_prefix: Input should be a valid string",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "message"), [u[1:] for u in UNREADABLE], ids=[u[0] for u in UNREADABLE]
)
def test_an_unreadable_file_is_a_clear_error_naming_file_and_field(
    old: str, new: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with the file, the YAML path or line, and the problem; no traceback."""
    assert old in ENVOY
    envoy = _envoy(tmp_path, ENVOY.replace(old, new, 1))
    run = envoy_cli(capsys, "check", str(envoy), "--config", str(_config(tmp_path)))
    assert run.code == 2
    assert run.out == ""
    assert run.err.startswith(f"ferryman: {envoy}: ")
    assert message in run.err
    assert "Traceback" not in run.err and "unexpected error" not in run.err


def test_an_entry_of_a_stage_without_filter_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rate_limits entry of a stage no filter runs is never sent: exit 1."""
    config = _config(tmp_path)
    envoy = _envoy(
        tmp_path, ENVOY.replace(CHECKOUT, CHECKOUT + "                          stage: 1\n")
    )
    run = envoy_cli(capsys, "check", str(envoy), "--config", str(config))
    assert run.code == 1
    assert "stage 1 has no rate limit filter: Envoy never sends this entry" in run.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--domain", "nope"], "ferryman: --domain: 'nope' is not configured (known: shop)\n"),
        (
            ["--domain", "shop", "--header", "user"],
            "ferryman: --header 'user': expected KEY=HEADER (a header name)\n",
        ),
    ],
    ids=["unknown domain", "malformed header mapping"],
)
def test_generate_refuses_a_bad_request_with_status_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown domain or a malformed --header: one line naming the flag, exit 2."""
    run = envoy_cli(capsys, "generate", "--config", str(_config(tmp_path)), *args)
    assert (run.code, run.out, run.err) == (2, "", message)


def test_generate_then_check_round_trips_with_a_header_mapping(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The generated routes send each rule's descriptor; --header names the header read."""
    config = _config(tmp_path)
    run = envoy_cli(
        capsys, "generate", "--config", str(config), "--domain", "shop", "--header", "user=X-User"
    )
    assert run.code == 0
    assert "header_name: x-user" in run.out and "descriptor_value: checkout" in run.out
    checked = envoy_cli(capsys, "check", str(_envoy(tmp_path, run.out)), "--config", str(config))
    assert checked.code == 0, checked.out
    assert (
        "-> shop.tenant.plan_gold: fixed window 5 per second when header plan = gold" in checked.out
    )
    assert "no Envoy entry reaches" not in checked.out
