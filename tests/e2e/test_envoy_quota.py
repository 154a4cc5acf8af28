"""Two real Envoys (envoy/quota/) enforce one global limit that ferryman's rate limit quota
service divides between them by demand: no request reaches ferryman, only usage reports."""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from ferryman.cli import main

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    UPSTREAM,
    EnvoyProcess,
    FerrymanProcess,
    Load,
    Upstream,
    envoy_validate,
    render,
    wait_for,
)
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

EXAMPLE = ENVOY_DIR / "quota"
LIMIT = 20  # envoy/quota/descriptors/quota.yaml: each tenant, 20 per second
PORTS = ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
ACME = {"tenant": "acme"}


def _page(ferryman: FerrymanProcess, path: str) -> Any:
    url = f"http://127.0.0.1:{ferryman.debug_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _shares(ferryman: FerrymanProcess) -> dict[str, float] | None:
    """Each Envoy's share of the acme bucket, once both have reported a demand, a tick has
    divided it, and b's (10/s) is known to be below a's."""
    buckets = _page(ferryman, "/rlqs")["buckets"]
    acme = [b for b in buckets if b["bucket_id"] == {"tenant": "acme"}]
    if not acme or len(acme[0]["envoys"]) != 2:
        return None
    envoys = acme[0]["envoys"]
    if any(e["demand_per_second"] is None or e["share_per_second"] is None for e in envoys):
        return None  # a demand is divided at the next tick
    shares = {e["envoy"]: e["share_per_second"] for e in envoys}
    return shares if shares["envoy-b"] < 12 else None


def test_two_envoys_share_one_limit_by_demand_without_should_rate_limit(tmp_path: Path) -> None:
    """Envoys driven at 30/s and 10/s against a global 20/s get shares of about 10 and 10 that
    add up to the limit; together they let through no more than the limit (plus one bucket's
    start each); ferryman answers no ShouldRateLimit, only the quota streams."""
    upstream = Upstream().start()
    started: list[FerrymanProcess | EnvoyProcess] = []
    loads: list[Load] = []
    try:
        ferryman = FerrymanProcess(
            tmp_path / "ferryman",
            ["--config", str(EXAMPLE / "descriptors"), *PORTS],
        )
        ferryman.env["GRPC_HOST"] = "127.0.0.1"
        started.append(ferryman.start())
        listeners = []
        for name, admin_port, listen in (("a", ADMIN, LISTENER), ("b", 9902, 10001)):
            admin, listener = free_port(), free_port()
            mapping = {
                admin_port: admin,
                listen: listener,
                UPSTREAM: upstream.port,
                FERRYMAN: ferryman.grpc_port,
            }
            config = render(EXAMPLE / f"envoy-{name}.yaml", mapping)
            started.append(EnvoyProcess(config, tmp_path / f"envoy-{name}", admin).start())
            listeners.append(listener)
        loads = [Load(listeners[0], 30, headers=ACME), Load(listeners[1], 10, headers=ACME)]
        shares: dict[str, float] | None = wait_for(
            lambda: _shares(ferryman),
            timeout=25,
            interval=0.5,
        )
        assert shares is not None
        assert sum(shares.values()) == pytest.approx(LIMIT)
        assert shares["envoy-a"] == pytest.approx(10, abs=1.5)
        # The shares in force in both Envoys: count a few whole seconds from now.
        start = int(time.time()) + 1
        time.sleep(6)
        seconds = range(start, start + 5)
        allowed = [loads[0].ok[s] + loads[1].ok[s] for s in seconds]
        assert sum(allowed) <= LIMIT * len(seconds) * 1.1, allowed
        assert sum(allowed) >= LIMIT * len(seconds) * 0.75, allowed
        assert sum(loads[0].denied[s] for s in seconds) > 0  # a wants more than its share
        stats = _page(ferryman, "/rlqs")["streams"]
        assert sorted(s["envoy"] for s in stats) == ["envoy-a", "envoy-b"]
        with urllib.request.urlopen(
            f"http://127.0.0.1:{ferryman.debug_port}/stats", timeout=5
        ) as response:
            counters = dict(
                line.split(": ") for line in response.read().decode().splitlines() if ": " in line
            )
        # Each gRPC method's calls are counted under one name: the streams were, and no
        # ShouldRateLimit call came.
        assert int(counters["ratelimit_server.StreamRateLimitQuotas.total_requests"]) >= 2
        assert int(counters["ratelimit.service.rlqs.reports"]) >= 4
        assert not [c for c in counters if c.startswith("ratelimit_server.ShouldRateLimit")]
    finally:
        for load in loads:
            load.stop()
        for part in reversed(started):
            part.stop()
        upstream.stop()


TREE = """
domain: shop
descriptors:
  - key: plan
    value: gold
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: plan
    value: "trial-*"
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: plan
    descriptors:
      - key: user
        token_bucket: {size: 10, fill_rate: 2}
  - key: generic_key
    value: all
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: held
    copies: {limit: 3}
"""


def ferryman(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``ferryman ARGS`` in this process: its exit status and what it printed."""
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def test_generated_quota_filters_pass_envoy_and_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``envoy generate --quota`` for exact, wildcard, nested and constant paths passes
    ``envoy --mode validate``; ``envoy check`` names the rule each bucket id builder reaches
    (the held copies, with no rate, left out) and fails a builder that reaches a kind with
    no rate."""
    descriptors = tmp_path / "descriptors"
    descriptors.mkdir()
    (descriptors / "shop.yaml").write_text(TREE)
    config_args = ("--config", str(descriptors))
    code, text = ferryman(
        capsys, "envoy", "generate", "--domain", "shop", *config_args, "--quota", "edge-1"
    )
    assert code == 0
    config = yaml.safe_load(text)
    validated = envoy_validate(config, tmp_path / "validate")
    assert validated.returncode == 0, validated.stdout + validated.stderr
    generated = tmp_path / "envoy.yaml"
    generated.write_text(text)
    code, out = ferryman(capsys, "envoy", "check", str(generated), *config_args, "--format", "json")
    report = json.loads(out)
    assert code == 0, report["findings"]
    reached = sorted(
        r["stats_key"] for e in report["entries"] for x in e["results"] for r in x["reaches"]
    )
    assert reached == [
        "shop.generic_key_all",
        "shop.plan.user",
        "shop.plan_gold",
        "shop.plan_gold",
        "shop.plan_trial-*",
    ]
    listener = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    http_filter = listener["typed_config"]["http_filters"][0]["typed_config"]
    matchers = http_filter["bucket_matchers"]["matcher_list"]["matchers"]
    held = copy.deepcopy(matchers[0])
    settings = held["on_match"]["action"]["typed_config"]
    settings["bucket_id_builder"] = {"bucket_id_builder": {"held": {"string_value": "x"}}}
    matchers.append(held)
    generated.write_text(yaml.safe_dump(config))
    code, out = ferryman(capsys, "envoy", "check", str(generated), *config_args)
    assert code == 1
    assert "is a copies rule, which has no rate to share" in out
