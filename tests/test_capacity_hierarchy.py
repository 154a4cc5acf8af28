"""A root and two intermediate servers (``--parent``), clients under each: the root never
hands out more than its capacity and every client converges to its fair share of the whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.capacity import Ferryman, Fleet, LeaseClient, resources_yaml
from helpers.server import ConfigDir, wait_for


@pytest.fixture
def fleet(tmp_path: Path, config_dir: ConfigDir) -> Iterator[Fleet]:
    config_dir.write("resources.yaml", resources_yaml(capacity=100, lease=4))
    fleet = Fleet(tmp_path / "procs", config_dir.path)
    yield fleet
    fleet.close()


def _converge(
    root: Ferryman, clients: list[tuple[LeaseClient, float]], expected: list[float]
) -> None:
    got: list[float] = []

    def converged() -> bool:
        got[:] = [client.ask({"fair": wants}).get("fair", -1.0) for client, wants in clients]
        assert root.sum_leases("fair") <= 100 + 1e-9
        return got == pytest.approx(expected)

    wait_for(f"clients converge to {expected} (last {got})", converged, timeout=30, interval=0.2)


@pytest.mark.slow
def test_hierarchy_divides_the_root_capacity_fairly_among_all_clients(fleet: Fleet) -> None:
    """2 + 3 clients wanting 1000 each under two children of a 100 root get 20 each; when the
    first two want 5 each, the other three get 30 each."""
    root = fleet.server()
    left = fleet.server("--parent", root.address)
    right = fleet.server("--parent", root.address)
    clients = [fleet.client(f"l{i}", left) for i in range(2)]
    clients += [fleet.client(f"r{i}", right) for i in range(3)]
    _converge(root, [(c, 1000.0) for c in clients], [20.0] * 5)
    page = root.capacity_page()
    (resource,) = page["resources"]
    servers = {c["client_id"]: c for c in resource["clients"]}
    assert set(servers) == {left.address, right.address}
    assert servers[right.address]["weight"] == 3
    assert servers[right.address]["bands"] == [{"priority": 0, "clients": 3, "wants": 3000.0}]
    assert left.capacity_page()["parent"]["leases"]["fair"]["capacity"] == pytest.approx(40)

    wants = [5.0, 5.0, 1000.0, 1000.0, 1000.0]
    _converge(root, list(zip(clients, wants, strict=True)), [5.0, 5.0, 30.0, 30.0, 30.0])


SAFE = """
resources:
  - identifier_glob: fair
    capacity: 100
    safe_capacity: 5
    algorithm: {kind: FAIR_SHARE, lease_length: 3, refresh_interval: 1,
                learning_mode_duration: 0}
"""


@pytest.mark.slow
def test_a_child_whose_root_is_gone_falls_back_to_safe_capacity(
    fleet: Fleet, config_dir: ConfigDir
) -> None:
    """With the root SIGKILLed, once the child's lease runs out its clients share the safe
    capacity the root named for them (5 per client), not the old lease."""
    config_dir.write("resources.yaml", SAFE)
    root = fleet.server()
    child = fleet.server("--parent", root.address)
    clients = [fleet.client(f"c{i}", child) for i in range(2)]
    _converge(root, [(c, 1000.0) for c in clients], [50.0, 50.0])

    def root_knows_both() -> bool:
        # The root names the safe capacity for the clients the child has told it of.
        (resource,) = root.capacity_page()["resources"]
        return [b["clients"] for c in resource["clients"] for b in c["bands"]] == [2]

    wait_for("the root to know both of the child's clients", root_knows_both, timeout=30)
    root.kill()

    seen: list[dict[str, float]] = []

    def safe_mode() -> bool:
        seen[:] = [c.ask({"fair": 1000}) for c in clients]
        return [answer.get("fair") for answer in seen] == [5.0, 5.0]

    try:
        wait_for("the child's clients in safe mode", safe_mode, timeout=60, interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answers {seen}; child {child.capacity_page()}") from None
    # The lease may run out while the child's call to the dead root is still waiting for
    # its answer: the error it reports comes when that call fails.
    wait_for(
        "the parent's error on the child's page",
        lambda: child.capacity_page()["parent"]["last_error"],
        timeout=30,
    )
