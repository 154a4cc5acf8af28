"""`ferryman envoy generate`: for every shipped domain the output passes Envoy's own validation
and `ferryman envoy check`, and a real Envoy started on it gets a 429 from a real ferryman."""

from __future__ import annotations

import json
import uuid
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
    in_one_window,
    render,
    request,
)
from helpers.envoy_cli import envoy_cli
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

DESCRIPTORS = ROOT / "descriptors"
DOMAINS = sorted(load_directory(DESCRIPTORS, ignore_dotfiles=True, merge_domains=False).domains)


def _generate(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    run = envoy_cli(capsys, "generate", "--config", str(DESCRIPTORS), *args)
    assert run.code == 0, run.err
    return run.out


def _check(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    run = envoy_cli(capsys, "check", str(path), "--config", str(DESCRIPTORS), "--format", "json")
    assert run.code == 0, run.out + run.err
    report: dict[str, Any] = json.loads(run.out)
    return report


def test_every_shipped_domain_is_generated() -> None:
    """The shipped descriptors hold the four domains the tour uses."""
    assert DOMAINS == ["cookbook", "edge-proxy", "messaging", "multi-service", "workers"]


@pytest.mark.parametrize("domain", DOMAINS)
def test_generated_bootstrap_passes_envoy_validate_and_checks_clean(
    domain: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bootstrap is valid to Envoy, and each of the domain's rules is reached."""
    text = _generate(capsys, "--domain", domain)
    result = envoy_validate(yaml.safe_load(text), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    path = tmp_path / "generated.yaml"
    path.write_text(text)
    report = _check(capsys, path)
    assert report["errors"] == 0
    assert report["entries"] and all(r["reaches"] for e in report["entries"] for r in e["results"])
    unreached = [f for f in report["findings"] if "no Envoy entry reaches" in f["message"]]
    assert unreached == []


@pytest.mark.parametrize("domain", DOMAINS)
def test_generated_envoyfilters_check_clean(
    domain: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--format istio: EnvoyFilter manifests whose entries reach every rule of the domain."""
    text = _generate(capsys, "--domain", domain, "--format", "istio")
    kinds = [doc["kind"] for doc in yaml.safe_load_all(text)]
    assert kinds == ["EnvoyFilter"]
    path = tmp_path / "envoyfilters.yaml"
    path.write_text(text)
    report = _check(capsys, path)
    assert report["errors"] == 0
    assert [f["domain"] for f in report["filters"]] == [domain]
    assert not [f for f in report["findings"] if "no Envoy entry reaches" in f["message"]]


def test_header_mapping_reads_a_key_from_the_named_header(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--header KEY=HEADER replaces the header named after the key."""
    text = _generate(capsys, "--domain", "messaging", "--header", "to_number=X-To-Number")
    assert "header_name: x-to-number" in text
    assert "header_name: to_number" not in text


def test_generated_route_gets_429_at_the_configured_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Envoy on the generated messaging bootstrap, asking a real ferryman: the route of
    messaging.message_type_marketing.to_number (5 a day) answers 200 five times, then 429."""
    text = _generate(capsys, "--domain", "messaging")
    tree = yaml.safe_load(text)
    routes = tree["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"][0]["routes"]
    [route] = [r for r in routes if r.get("name") == "messaging.message_type_marketing.to_number"]
    prefix = route["match"]["prefix"]
    upstream = Upstream().start()
    ferryman = FerrymanProcess(
        tmp_path / "ferryman",
        ["--config", str(DESCRIPTORS), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"],
    ).start()
    envoy: EnvoyProcess | None = None
    try:
        admin, listener = free_port(), free_port()
        ports = {ADMIN: admin, LISTENER: listener, UPSTREAM: upstream.port}
        ports[FERRYMAN] = ferryman.grpc_port
        envoy = EnvoyProcess(render(tree, ports), tmp_path / "envoy", admin).start()

        def send(attempt: int) -> list[int]:
            number = f"{uuid.uuid4().hex}-{attempt}"
            headers = {"message_type": "marketing", "to_number": number}
            return [request(listener, prefix, headers)[0] for _ in range(6)]

        assert in_one_window(send, 86400) == [200] * 5 + [429]
    finally:
        if envoy is not None:
            envoy.stop()
        ferryman.stop()
        upstream.stop()
