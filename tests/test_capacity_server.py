"""doorman.Capacity on a real ``ferryman serve`` process: fairness, expiry, release, bad
input, hot reload and the debug page."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc

from helpers.capacity import Ferryman, Fleet, resources_yaml
from helpers.server import ConfigDir, wait_for


@pytest.fixture
def fleet(tmp_path: Path, config_dir: ConfigDir) -> Iterator[Fleet]:
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=3))
    fleet = Fleet(tmp_path / "procs", config_dir.path)
    yield fleet
    fleet.close()


def test_three_clients_converge_and_an_expired_client_frees_its_share(fleet: Fleet) -> None:
    """Wants 1000, 50, 10 of 120 converge to 60, 50, 10 in two refreshes, never over 120;
    when the third stops refreshing its lease expires and the first grows to 70."""
    server = fleet.server()
    wants = {"a": 1000.0, "b": 50.0, "c": 10.0}
    clients = {name: fleet.client(name, server) for name in wants}
    got: dict[str, float] = {}
    for _ in range(2):
        for name, client in clients.items():
            got[name] = client.ask({"fair": wants[name]})["fair"]
            assert sum(got.values()) <= 120
    assert got == pytest.approx({"a": 60, "b": 50, "c": 10})
    assert server.sum_leases("fair") == pytest.approx(120)

    def grown() -> bool:
        got["a"] = clients["a"].ask({"fair": 1000})["fair"]
        got["b"] = clients["b"].ask({"fair": 50})["fair"]
        assert got["a"] + got["b"] + 10 * ("c" in _clients_of(server, "fair")) <= 120 + 1e-9
        return got["a"] == pytest.approx(70)

    wait_for("the first client grows to 70 once the third's lease expires", grown, timeout=15)
    assert _clients_of(server, "fair") == {"a", "b"}


def _clients_of(server: Ferryman, resource_id: str) -> set[str]:
    page = server.capacity_page()
    for resource in page["resources"]:
        if resource["resource_id"] == resource_id:
            return {c["client_id"] for c in resource["clients"]}
    return set()


def test_release_frees_capacity_at_once(fleet: Fleet) -> None:
    """After ReleaseCapacity the other client gets the whole capacity on its next refresh."""
    server = fleet.server()
    a, b = fleet.client("a", server), fleet.client("b", server)
    assert a.ask({"fair": 500})["fair"] == 120
    assert b.ask({"fair": 500})["fair"] == 0
    a.release("fair")
    assert b.ask({"fair": 500})["fair"] == 120


def test_proportional_share_and_safe_capacity(fleet: Fleet) -> None:
    """PROPORTIONAL_SHARE of 120 among 1000, 50, 10 is 69.69, 40.31, 10; safe is 120 / 3."""
    server = fleet.server()
    wants = {"a": 1000.0, "b": 50.0, "c": 10.0}
    clients = {name: fleet.client(name, server) for name in wants}
    got = {}
    for _ in range(2):
        got = {n: c.ask({"prop": wants[n]})["prop"] for n, c in clients.items()}
    assert got == pytest.approx({"a": 69.6907, "b": 40.3093, "c": 10}, abs=1e-4)
    assert clients["c"].safe["prop"] == pytest.approx(40)


def test_unconfigured_resource_is_granted_what_it_wants(fleet: Fleet) -> None:
    """A resource no template covers is granted as asked and counted."""
    server = fleet.server()
    assert fleet.client("a", server).ask({"nothing-here": 12345})["nothing-here"] == 12345
    assert server.capacity_page()["unconfigured_requests"] == 1


def test_minimum_refresh_interval_keeps_the_lease(fleet: Fleet) -> None:
    """With a minimum refresh interval, asking again early returns the same lease."""
    server = fleet.server(env={"DOORMAN_MINIMUM_REFRESH_INTERVAL": "1h"})
    client = fleet.client("a", server)
    first = client.ask({"fair": 10})
    lease = client.leases["fair"]
    assert client.ask({"fair": 100}) == first
    assert client.leases["fair"] == lease


BAD = [
    (doorman_pb2.GetCapacityRequest(client_id=""), "client_id"),
    (
        doorman_pb2.GetCapacityRequest(
            client_id="x", resource=[doorman_pb2.ResourceRequest(resource_id="", wants=1)]
        ),
        "resource[0].resource_id",
    ),
    (
        doorman_pb2.GetCapacityRequest(
            client_id="x",
            resource=[
                doorman_pb2.ResourceRequest(resource_id="fair", wants=1),
                doorman_pb2.ResourceRequest(resource_id="fair2", wants=-1),
            ],
        ),
        "resource[1].wants",
    ),
    (
        doorman_pb2.GetCapacityRequest(
            client_id="x", resource=[doorman_pb2.ResourceRequest(resource_id="f", wants=1e999)]
        ),
        "resource[0].wants",
    ),
    (
        doorman_pb2.GetCapacityRequest(
            client_id="x",
            resource=[doorman_pb2.ResourceRequest(resource_id="f", wants=float("nan"))],
        ),
        "resource[0].wants",
    ),
    (
        doorman_pb2.GetCapacityRequest(
            client_id="x",
            resource=[
                doorman_pb2.ResourceRequest(resource_id="fair", wants=1),
                doorman_pb2.ResourceRequest(resource_id="fair", wants=2),
            ],
        ),
        "resource[1].resource_id",
    ),
]


def test_bad_requests_are_refused_naming_the_field_and_store_nothing(fleet: Fleet) -> None:
    """Empty ids, negative / NaN / infinite wants and repeated resources: INVALID_ARGUMENT
    naming the field, and no lease is stored for the valid parts."""
    server = fleet.server()
    for request, field in BAD:
        for item in request.resource:
            item.priority = 0
        with pytest.raises(grpc.RpcError) as info:
            server.stub.GetCapacity(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith(field), info.value.details()
    server_request = doorman_pb2.GetServerCapacityRequest(
        server_id="s",
        resource=[
            doorman_pb2.ServerCapacityResourceRequest(
                resource_id="fair",
                wants=[doorman_pb2.PriorityBandAggregate(priority=0, num_clients=1, wants=-5)],
            )
        ],
    )
    with pytest.raises(grpc.RpcError) as info:
        server.stub.GetServerCapacity(server_request, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("resource[0].wants[0].wants")
    release = doorman_pb2.ReleaseCapacityRequest(client_id="")
    with pytest.raises(grpc.RpcError) as info:
        server.stub.ReleaseCapacity(release, timeout=5)
    assert (info.value.details() or "").startswith("client_id")
    assert server.capacity_page()["resources"] == []


def test_resources_reload_and_a_bad_file_keeps_the_last_good(
    fleet: Fleet, config_dir: ConfigDir
) -> None:
    """A new capacity takes effect on reload; a broken file is refused and the old stays."""
    server = fleet.server()
    client = fleet.client("a", server)
    assert client.ask({"fair": 1000})["fair"] == 120
    config_dir.write("resources.yaml", resources_yaml(capacity=300, lease=3))
    wait_for(
        "capacity 300 in force",
        lambda: client.ask({"fair": 1000})["fair"] == 300,
        timeout=15,
        interval=0.1,
    )
    config_dir.write("resources.yaml", "resources:\n  - identifier_glob: fair*\n    capacity: -3\n")
    wait_for(
        "the bad file rejected",
        lambda: server.status_page()["config"]["last_error"],
        timeout=15,
        interval=0.1,
    )
    error = server.status_page()["config"]["last_error"]
    assert "resources.yaml:3:" in error and "resources[0].capacity" in error
    assert client.ask({"fair": 1000})["fair"] == 300


def test_debug_page_lists_resources_clients_and_leases(fleet: Fleet) -> None:
    """/capacity shows mastership, the templates, and each resource's clients and leases."""
    server = fleet.server()
    fleet.client("a", server).ask({"fair": 30})
    page = server.capacity_page()
    assert page["is_master"] is True
    assert page["master_address"] == server.address
    assert [t["identifier_glob"] for t in page["templates"]] == ["fair*", "prop*"]
    (resource,) = page["resources"]
    assert resource["resource_id"] == "fair"
    assert (resource["capacity"], resource["sum_leases"], resource["sum_wants"]) == (120, 30, 30)
    (client,) = resource["clients"]
    assert (client["client_id"], client["capacity"], client["refresh_interval"]) == ("a", 30, 1)
    assert 0 < client["expires_in"] <= 3


def test_discovery_on_a_single_memory_server_says_master(fleet: Fleet) -> None:
    """On the memory backend the one server is master and advertises its own address."""
    server = fleet.server()
    reply = server.stub.Discovery(doorman_pb2.DiscoveryRequest(), timeout=5)
    assert reply.is_master
    assert reply.mastership.master_address == server.address


def test_concurrent_refreshes_never_over_commit(fleet: Fleet) -> None:
    """30 clients refreshing from 8 threads with changing wants: every answer is at most
    what was wanted and the latest leases never sum above the capacity."""
    server = fleet.server()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with grpc.insecure_channel(server.address) as channel:
            stub = doorman_pb2_grpc.CapacityStub(channel)  # type: ignore[no-untyped-call]
            for _ in range(60):
                client = f"c{rng.randrange(30)}"
                wants = rng.choice([0.0, 1.0, 7.5, 40.0, 500.0])
                request = doorman_pb2.GetCapacityRequest(
                    client_id=client,
                    resource=[
                        doorman_pb2.ResourceRequest(resource_id="fair", priority=0, wants=wants)
                    ],
                )
                got = stub.GetCapacity(request, timeout=10).response[0].gets.capacity
                assert got <= wants

    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(worker, seed) for seed in range(8)]:
            future.result()
    assert server.sum_leases("fair") <= 120 + 1e-9
    (resource,) = server.capacity_page()["resources"]
    assert sum(c["capacity"] for c in resource["clients"]) <= 120 + 1e-9
