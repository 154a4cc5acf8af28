"""Replicas of ``ferryman serve`` on one real Redis: one master at a time; SIGKILL it and
the other takes over within its term, learns the outstanding leases, then divides again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferryman._proto.doorman import doorman_pb2

from helpers.capacity import Ferryman, Fleet, LeaseClient, resources_yaml
from helpers.redis_procs import RedisProcess
from helpers.server import ConfigDir, wait_for

WANTS = {"a": 1000.0, "b": 50.0, "c": 10.0}
FAIR = {"a": 60.0, "b": 50.0, "c": 10.0}


@pytest.fixture
def fleet(tmp_path: Path, config_dir: ConfigDir) -> Iterator[Fleet]:
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=10, learning=3))
    fleet = Fleet(tmp_path / "procs", config_dir.path)
    yield fleet
    fleet.close()


def _replicas(fleet: Fleet, redis_server: RedisProcess) -> list[Ferryman]:
    env = {"CACHE_KEY_PREFIX": f"t{uuid.uuid4().hex[:12]}_", "DOORMAN_ELECTION_TERM": "1s"}
    return [fleet.server("--backend", redis_server.url, env=env) for _ in range(2)]


def _one_master(replicas: list[Ferryman]) -> Ferryman | None:
    masters = [r for r in replicas if r.is_master()]
    assert len(masters) <= 1, "two masters at once"
    return masters[0] if masters else None


def _round(clients: dict[str, LeaseClient]) -> dict[str, float]:
    return {
        name: client.ask({"fair": WANTS[name]}).get("fair", -1.0)
        for name, client in clients.items()
    }


def test_one_master_and_replicas_point_to_it(fleet: Fleet, redis_server: RedisProcess) -> None:
    """Exactly one replica is master; the other answers Discovery and GetCapacity with an
    empty response that names the master's address."""
    replicas = _replicas(fleet, redis_server)
    wait_for("a master", lambda: _one_master(replicas) is not None, timeout=10)
    master = _one_master(replicas)
    assert master is not None
    (other,) = [r for r in replicas if r is not master]
    discovery = other.stub.Discovery(doorman_pb2.DiscoveryRequest(), timeout=5)
    assert (discovery.is_master, discovery.mastership.master_address) == (False, master.address)
    request = doorman_pb2.GetCapacityRequest(
        client_id="x",
        resource=[doorman_pb2.ResourceRequest(resource_id="fair", priority=0, wants=5)],
    )
    reply = other.stub.GetCapacity(request, timeout=5)
    assert list(reply.response) == []
    assert reply.mastership.master_address == master.address
    assert other.capacity_page()["resources"] == []


@pytest.mark.slow
def test_sigkill_the_master_and_the_other_takes_over_in_learning_mode(
    fleet: Fleet, redis_server: RedisProcess
) -> None:
    """After SIGKILL the other replica becomes master, grants what clients hold while it
    learns (nothing to a newcomer), and once learning ends they converge without over-commit."""
    replicas = _replicas(fleet, redis_server)
    wait_for("a master", lambda: _one_master(replicas) is not None, timeout=10)
    master = _one_master(replicas)
    assert master is not None
    (survivor,) = [r for r in replicas if r is not master]
    # Clients start at the replica: they must follow mastership to the master.
    clients = {name: fleet.client(name, survivor, master) for name in WANTS}

    def learned() -> bool:
        page = master.capacity_page()
        return bool(page["resources"]) and not page["resources"][0]["learning"]

    _round(clients)
    wait_for("the first master out of learning mode", learned, timeout=15, interval=0.2)
    for _ in range(2):
        got = _round(clients)
    assert got == pytest.approx(FAIR)
    assert master.sum_leases("fair") <= 120

    master.kill()
    wait_for("the survivor is master", survivor.is_master, timeout=10, interval=0.05)
    page = survivor.capacity_page()
    assert page["master_address"] == survivor.address
    held = _round(clients)
    assert held == pytest.approx(FAIR)  # learning: what each holds, capped by wants
    assert survivor.capacity_page()["resources"][0]["learning"] is True
    newcomer = fleet.client("d", survivor)
    assert newcomer.ask({"fair": 100}) == {"fair": 0}

    def converged() -> bool:
        resources = survivor.capacity_page()["resources"]
        learning = resources[0]["learning"]
        got = _round(clients)
        if not learning:
            assert survivor.sum_leases("fair") <= 120 + 1e-9
        return not learning and got == pytest.approx(FAIR)

    wait_for("convergence after learning mode", converged, timeout=20, interval=0.2)


def test_replicas_advertising_one_address_still_elect_one_master(
    fleet: Fleet, redis_server: RedisProcess
) -> None:
    """Two replicas configured with the same DOORMAN_ADVERTISE_ADDRESS never both hold the
    term: each holds it under its own nonce."""
    env = {
        "CACHE_KEY_PREFIX": f"t{uuid.uuid4().hex[:12]}_",
        "DOORMAN_ELECTION_TERM": "1s",
        "DOORMAN_ADVERTISE_ADDRESS": "capacity.internal:8081",
    }
    replicas = [fleet.server("--backend", redis_server.url, env=env) for _ in range(2)]
    wait_for("a master", lambda: _one_master(replicas) is not None, timeout=10)
    for replica in replicas:
        page = replica.capacity_page()
        assert page["master_address"] == "capacity.internal:8081"
    checks: list[int] = []

    def watched() -> bool:
        _one_master(replicas)  # fails on two masters
        checks.append(1)
        return len(checks) >= 30

    wait_for("30 looks at mastership, across several terms", watched, timeout=30, interval=0.1)
