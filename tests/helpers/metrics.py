"""The Prometheus endpoint as a test reads it, and a domain of ferryman's own features."""

from __future__ import annotations

import http.client
from collections.abc import Sequence

from helpers.server import Server

PROMETHEUS = {"use_prometheus": True, "prometheus_addr": "127.0.0.1:0"}

# Burst tiers and held copies in one domain, for the metrics of ferryman's own features.
FEATURES_CONFIG = """
domain: jobs
descriptors:
  - key: user
    burst_tiers:
      - {limit: 2, window: 1s, active: 1h}
      - {limit: 10, window: 1s, active: 5s, cooldown: 10s}
  - key: tenant
    copies: {limit: 5}
"""


def scrape(server: Server) -> list[str]:
    """GET the real /metrics endpoint; its lines."""
    port = server.service.prometheus_port
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", server.settings.prometheus_path)
        response = conn.getresponse()
        body = response.read().decode()
        assert response.status == 200, body
        assert response.getheader("Content-Type", "").startswith("text/plain; version=0.0.4")
    finally:
        conn.close()
    return body.splitlines()


def samples(lines: Sequence[str]) -> dict[str, str]:
    """``name{labels}`` -> value, for every sample line."""
    out = {}
    for line in lines:
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = value
    return out
