"""Capacity lease instruments on the Prometheus endpoint, per resource, in-process."""

from __future__ import annotations

import http.client

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc

from helpers.capacity import resources_yaml
from helpers.server import ConfigDir, Server, ServerFactory


def _scrape(server: Server) -> dict[str, float]:
    port = server.service.prometheus_port
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", server.settings.prometheus_path)
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_per_resource_capacity_leases_wants_clients_and_unconfigured(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """Two clients on one resource and one unconfigured ask show as gauges and a counter."""
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=30))
    server = make_server(
        use_prometheus=True, prometheus_addr="127.0.0.1:0", doorman_minimum_refresh_interval=0
    )
    with grpc.insecure_channel(f"127.0.0.1:{server.service.grpc_port}") as channel:
        stub = doorman_pb2_grpc.CapacityStub(channel)  # type: ignore[no-untyped-call]
        for client, wants in (("a", 100.0), ("b", 10.0), ("a", 100.0)):
            request = doorman_pb2.GetCapacityRequest(
                client_id=client,
                resource=[doorman_pb2.ResourceRequest(resource_id="fair", priority=0, wants=wants)],
            )
            stub.GetCapacity(request, timeout=5)
        other = doorman_pb2.GetCapacityRequest(
            client_id="a",
            resource=[doorman_pb2.ResourceRequest(resource_id="unknown", priority=0, wants=1)],
        )
        stub.GetCapacity(other, timeout=5)
    samples = _scrape(server)
    label = '{resource="fair"}'
    assert samples[f"ratelimit_service_capacity_capacity{label}"] == 120
    assert samples[f"ratelimit_service_capacity_leased{label}"] == 110
    assert samples[f"ratelimit_service_capacity_wanted{label}"] == 110
    assert samples[f"ratelimit_service_capacity_clients{label}"] == 2
    assert samples["ratelimit_service_capacity_unconfigured_requests"] == 1
