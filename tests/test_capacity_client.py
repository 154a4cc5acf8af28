"""ferryman's CapacityClient against real servers: convergence, mastership, release and
safe mode when the server is gone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferryman.client import CapacityClient

from helpers.capacity import Fleet, resources_yaml
from helpers.redis_procs import RedisProcess
from helpers.server import ConfigDir, wait_for


@pytest.fixture
def fleet(tmp_path: Path, config_dir: ConfigDir) -> Iterator[Fleet]:
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=3))
    fleet = Fleet(tmp_path / "procs", config_dir.path)
    yield fleet
    fleet.close()


@pytest.fixture
def clients() -> Iterator[list[CapacityClient]]:
    made: list[CapacityClient] = []
    yield made
    for client in made:
        client.close()


def test_clients_converge_to_the_fair_split_and_release(
    fleet: Fleet, clients: list[CapacityClient]
) -> None:
    """Three background clients wanting 1000, 50, 10 of 120 settle on 60, 50, 10, as the raw
    protocol client does; when one releases, the largest grows."""
    server = fleet.server()
    clients += [CapacityClient(server.address) for _ in range(3)]
    assert len({c.client_id for c in clients}) == 3
    resources = [c.resource("fair", w) for c, w in zip(clients, (1000, 50, 10), strict=True)]

    def split() -> list[float]:
        assert server.sum_leases("fair") <= 120 + 1e-9
        return [r.capacity for r in resources]

    wait_for("60, 50, 10", lambda: split() == pytest.approx([60, 50, 10]), timeout=15)
    resources[1].release()
    wait_for("the largest grows to 110", lambda: split()[0] == pytest.approx(110), timeout=15)


def test_a_client_given_a_replica_follows_mastership(
    fleet: Fleet, redis_server: RedisProcess, clients: list[CapacityClient]
) -> None:
    """Pointed at the replica that is not master, the client finds the master and leases."""
    env = {"CACHE_KEY_PREFIX": f"t{uuid.uuid4().hex[:12]}_", "DOORMAN_ELECTION_TERM": "1s"}
    replicas = [fleet.server("--backend", redis_server.url, env=env) for _ in range(2)]
    wait_for("a master", lambda: any(r.is_master() for r in replicas), timeout=10)
    master = next(r for r in replicas if r.is_master())
    replica = next(r for r in replicas if r is not master)
    client = CapacityClient(replica.address)
    clients.append(client)
    resource = client.resource("fair", 30)
    # learning_mode_duration is 0 in these templates: the first answer is a real share.
    wait_for("a lease from the master", lambda: resource.capacity == 30, timeout=15)
    assert client.master == master.address


def test_safe_capacity_once_the_server_is_gone_and_the_lease_expired(
    fleet: Fleet, config_dir: ConfigDir, clients: list[CapacityClient]
) -> None:
    """With the server killed a client keeps its lease until it expires, and only then
    falls back to the template's safe capacity."""
    config_dir.write(
        "resources.yaml",
        "resources:\n  - identifier_glob: fair\n    capacity: 120\n    safe_capacity: 5\n"
        "    algorithm: {kind: FAIR_SHARE, lease_length: 3, refresh_interval: 1,\n"
        "                learning_mode_duration: 0}\n",
    )
    server = fleet.server()
    clients += [CapacityClient(server.address) for _ in range(2)]
    first, second = (c.resource("fair", 1000) for c in clients)
    wait_for("60 each", lambda: (first.capacity, second.capacity) == (60, 60), timeout=15)
    assert first.safe_capacity == 5
    server.kill()
    wait_for("safe mode", lambda: first.capacity == 5, timeout=15)
    assert first.lease is not None
    assert first.lease.expiry_time <= time.time()
    assert clients[0].last_error
