"""Two real Envoys, each with its own ferryman sidecar (envoy/leased/), share one global
limit held by a parent: HTTP requests answered 200 per second follow each pod's demand."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

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
    render,
    wait_for,
)
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

EXAMPLE = ENVOY_DIR / "leased"
# envoy/leased/root/resources.yaml with a short lease, so that the test converges in seconds.
ROOT = """
resources:
  - identifier_glob: partner_api
    capacity: 100
    algorithm: {kind: FAIR_SHARE, lease_length: 2, refresh_interval: 1,
                learning_mode_duration: 0}
"""


def _leased_capacity(sidecar: FerrymanProcess) -> float:
    url = f"http://127.0.0.1:{sidecar.debug_port}/capacity"
    with urllib.request.urlopen(url, timeout=5) as response:
        page = json.load(response)
    return float(page["leased"]["resources"].get("partner_api", {}).get("capacity", -2))


def test_two_envoys_with_leased_sidecars_split_the_global_limit(tmp_path: Path) -> None:
    """Pods driven at 150/s and 30/s through their Envoys get about 67 and 30 answers of
    200 per second out of the parent's 100/s, never above 110 together."""
    root_config = tmp_path / "root-config"
    root_config.mkdir()
    (root_config / "resources.yaml").write_text(ROOT)
    ports = ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    env = {"DOORMAN_MINIMUM_REFRESH_INTERVAL": "0", "GRPC_HOST": "127.0.0.1"}
    started: list[FerrymanProcess | EnvoyProcess] = []
    loads: list[Load] = []
    upstream = Upstream().start()
    try:
        root = FerrymanProcess(tmp_path / "root", ["--config", str(root_config), *ports])
        root.env.update(env)
        started.append(root.start())
        listeners: list[int] = []
        sidecars: list[FerrymanProcess] = []
        parent = f"127.0.0.1:{root.grpc_port}"
        for name in ("a", "b"):
            sidecar = FerrymanProcess(
                tmp_path / name,
                ["--config", str(EXAMPLE / "sidecar"), "--parent", parent, *ports],
            )
            sidecar.env.update(env)
            started.append(sidecar.start())
            sidecars.append(sidecar)
            admin, listener = free_port(), free_port()
            mapping = {
                ADMIN: admin,
                LISTENER: listener,
                UPSTREAM: upstream.port,
                FERRYMAN: sidecar.grpc_port,
            }
            config = render(EXAMPLE / "envoy.yaml", mapping)
            started.append(EnvoyProcess(config, tmp_path / f"envoy-{name}", admin).start())
            listeners.append(listener)
        loads = [Load(listeners[0], 150, "/partner/call"), Load(listeners[1], 30, "/partner/call")]
        wait_for(
            lambda: [round(_leased_capacity(s)) for s in sidecars] == [67, 33] or None,
            timeout=20,
        )
        start = int(time.time()) + 1
        time.sleep(4.5)
        oks = [[load.ok[s] for s in range(start, start + 3)] for load in loads]
        for a, b in zip(*oks, strict=True):
            assert 60 <= a <= 77, oks
            assert 27 <= b <= 33, oks
            assert a + b <= 110, oks
        assert set(loads[0].statuses) == {200, 429}
    finally:
        for load in loads:
            load.stop()
        for proc in reversed(started):
            if isinstance(proc, FerrymanProcess):
                proc.kill()
            else:
                proc.stop()
        upstream.stop()
