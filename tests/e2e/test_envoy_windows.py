"""Windows of any length and several limits on one node through a real Envoy:
envoy/front-proxy.yaml asking ferryman in process, on a clock the test moves, so that
"30 s later" costs no waiting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ferryman.clock import ManualClock

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    UPSTREAM,
    Client,
    EnvoyProcess,
    Upstream,
    render,
    require_envoy,
)
from helpers.ports import free_port
from helpers.server import EPOCH, ConfigDir, Server, ServerFactory
from helpers.stores import on_stores

pytestmark = [pytest.mark.e2e, on_stores("memory")]

WINDOWS = """
domain: edge-proxy
descriptors:
  - key: remote_address
    rate_limit: {requests_per_unit: 5, window: 30s}
  - key: header_match
    value: partner
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 3}
      - {name: per_minute, unit: minute, requests_per_unit: 5}
"""


@pytest.fixture
def proxy(
    config_dir: ConfigDir, make_server: ServerFactory, tmp_path: Path
) -> Iterator[tuple[int, Server]]:
    """Envoy's listener port in front of an upstream, and the ferryman it asks."""
    require_envoy()
    config_dir.write("edge-proxy.yaml", WINDOWS)
    server = make_server(limit_response_headers_enabled=True)
    upstream = Upstream().start()
    envoy: EnvoyProcess | None = None
    try:
        admin, listener = free_port(), free_port()
        ports = {ADMIN: admin, LISTENER: listener, UPSTREAM: upstream.port}
        ports[FERRYMAN] = server.service.grpc_port
        tree = render(ENVOY_DIR / "front-proxy.yaml", ports)
        envoy = EnvoyProcess(tree, tmp_path / "envoy", admin).start()
        yield listener, server
    finally:
        if envoy is not None:
            envoy.stop()
        upstream.stop()


def test_a_30s_window_and_two_limits_on_one_node(
    proxy: tuple[int, Server], clock: ManualClock
) -> None:
    """5 per 30 s per address: the 6th is 429, and 30 s after the window began requests
    pass again. Partners under 3 per second and 5 per minute: refused by the tighter."""
    port, _ = proxy
    clock.set(EPOCH + 3)  # 3 s into a 30 s window
    with Client(port, source="127.0.9.31") as client:
        replies = [client.get("/") for _ in range(6)]
        assert [status for status, _, _ in replies] == [200] * 5 + [429]
        # Envoy's own headers can only say the unit it was told; ferryman's say the window.
        assert replies[0][1]["x-ratelimit-limit"] == "5, 5;w=60"
        assert replies[5][1]["x-ratelimit-reset"] == "27"
        assert replies[5][1]["ratelimit-limit"] == "5, 5;w=30", replies[5][1]
        clock.set(EPOCH + 29.9)
        assert client.get("/")[0] == 429
        clock.set(EPOCH + 30)
        assert client.get("/")[0] == 200
    # Each batch from its own address, so that the per-address window stays out of it.
    partner = {"x-plan": "partner"}
    clock.set(EPOCH + 40.2)
    with Client(port, source="127.0.9.32") as client:
        assert [client.get("/", partner)[0] for _ in range(4)] == [200, 200, 200, 429]
    clock.set(EPOCH + 41.2)  # a new second; the minute holds 3 of 5
    with Client(port, source="127.0.9.33") as client:
        assert [client.get("/", partner)[0] for _ in range(3)] == [200, 200, 429]
