"""The domain switches and the decision log through a real Envoy: envoy/front-proxy.yaml
asking a real `ferryman serve` whose edge-proxy domain limits each client address."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from ferryman.config.loader import load_directory
from ferryman.replay.decision_log import Logged, read_log
from ferryman.replay.replay import Replay

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    UPSTREAM,
    EnvoyProcess,
    FerrymanProcess,
    Upstream,
    render,
    request,
    require_envoy,
)
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

EDGE = """
domain: edge-proxy
{switch}
descriptors:
  - key: remote_address
    rate_limit: {{unit: minute, requests_per_unit: 2}}
"""


def _wait(what: str, check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_ignore_limits_and_allow_unconfigured_through_envoy_and_the_decision_log(
    tmp_path: Path,
) -> None:
    """With ignore_limits every request passes Envoy (counted, never 429) and the /api/
    route's descriptors, which no rule covers, are recorded; a reload without the switch
    refuses the third request a minute again; the decision log holds the answers Envoy
    got, and its lines after the reload replay to them."""
    require_envoy()
    config = tmp_path / "config"
    config.mkdir()
    edge = config / "edge-proxy.yaml"
    edge.write_text(EDGE.format(switch="ignore_limits: true\nallow_unconfigured: true"))
    log = tmp_path / "decisions.jsonl"
    upstream = Upstream().start()
    args = ["--config", str(config), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    ferryman = FerrymanProcess(tmp_path / "ferryman", args, {**env, "DECISION_LOG": str(log)})
    ferryman.start()
    envoy: EnvoyProcess | None = None
    try:
        admin, listener = free_port(), free_port()
        ports = {ADMIN: admin, LISTENER: listener, UPSTREAM: upstream.port}
        ports[FERRYMAN] = ferryman.grpc_port
        tree = render(ENVOY_DIR / "front-proxy.yaml", ports)
        envoy = EnvoyProcess(tree, tmp_path / "envoy", admin).start()
        ignored = [request(listener, "/api/x", source="127.0.5.1")[0] for _ in range(4)]
        assert ignored == [200] * 4
        debug = f"http://127.0.0.1:{ferryman.debug_port}"
        with urllib.request.urlopen(f"{debug}/unconfigured", timeout=10) as reply:
            top = json.load(reply)["domains"]["edge-proxy"]["top"]
        assert [(t["descriptor"], t["count"]) for t in top] == [
            ("generic_key=slow-path,path=/api/x", 4)
        ]
        edge.write_text(EDGE.format(switch=""))

        def switched_off() -> bool:
            with urllib.request.urlopen(f"{debug}/status", timeout=10) as reply:
                return bool(json.load(reply)["config"]["switches"] == {})

        _wait("the reload", switched_off)
        limited = [request(listener, "/", source="127.0.5.3")[0] for _ in range(3)]
        assert limited == [200, 200, 429]
    finally:
        if envoy is not None:
            envoy.stop()
        ferryman.stop()
        upstream.stop()
    logged = [x for x in read_log(log) if isinstance(x, Logged)]  # ShouldRateLimit's
    assert [x.code for x in logged] == ["OK"] * 6 + ["OVER_LIMIT"]
    replayed = Replay(load_directory(config))  # the config in force after the reload

    async def again() -> list[str]:
        return [(await replayed.decide(x)).code.name for x in logged[4:]]

    assert asyncio.run(again()) == ["OK", "OK", "OVER_LIMIT"]
