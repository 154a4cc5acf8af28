"""A client built only from Doorman's published doorman.proto (stubs generated at test time,
in a process that never imports ferryman) gets the same answers as ferryman's own stubs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferryman._proto.doorman import doorman_pb2

from helpers.capacity import Ferryman, Fleet, resources_yaml
from helpers.server import ConfigDir

ROOT = Path(__file__).resolve().parents[1]
# Doorman's published contract, kept with the tests (tests/contracts/README.md).
SPEC = ROOT / "tests" / "contracts" / "doorman.proto"
OWN = ROOT / "service" / "ferryman" / "_proto" / "doorman" / "doorman.proto"

# Runs in its own interpreter with only the generated stubs on its path.
RAW_CLIENT = """
import json, sys
import grpc
import doorman_pb2 as pb, doorman_pb2_grpc as rpc

stub = rpc.CapacityStub(grpc.insecure_channel(sys.argv[1]))
resource = sys.argv[2]
out = {"discovery": None, "rounds": [], "refused": None}
reply = stub.Discovery(pb.DiscoveryRequest(), timeout=5)
out["discovery"] = [reply.is_master, reply.mastership.master_address]
for _ in range(2):
    answers = []
    for client, wants in (("a", 1000.0), ("b", 50.0), ("c", 10.0)):
        request = pb.GetCapacityRequest(client_id=client, resource=[
            pb.ResourceRequest(resource_id=resource, priority=1, wants=wants)])
        item = stub.GetCapacity(request, timeout=5).response[0]
        answers.append([item.resource_id, item.gets.capacity, item.gets.refresh_interval,
                        item.safe_capacity])
    out["rounds"].append(answers)
stub.ReleaseCapacity(pb.ReleaseCapacityRequest(client_id="a", resource_id=[resource]), timeout=5)
try:
    stub.GetCapacity(pb.GetCapacityRequest(client_id="", resource=[]), timeout=5)
except grpc.RpcError as exc:
    out["refused"] = [exc.code().name, exc.details()]
print(json.dumps(out))
"""


@pytest.fixture
def fleet(tmp_path: Path, config_dir: ConfigDir) -> Iterator[Fleet]:
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=30))
    fleet = Fleet(tmp_path / "procs", config_dir.path)
    yield fleet
    fleet.close()


def _own_client(server: Ferryman, resource: str) -> dict[str, Any]:
    """The raw client's script, through ferryman's generated stubs."""
    reply = server.stub.Discovery(doorman_pb2.DiscoveryRequest(), timeout=5)
    out: dict[str, Any] = {"discovery": [reply.is_master, reply.mastership.master_address]}
    out["rounds"] = []
    for _ in range(2):
        answers = []
        for client, wants in (("a", 1000.0), ("b", 50.0), ("c", 10.0)):
            request = doorman_pb2.GetCapacityRequest(
                client_id=client,
                resource=[
                    doorman_pb2.ResourceRequest(resource_id=resource, priority=1, wants=wants)
                ],
            )
            item = server.stub.GetCapacity(request, timeout=5).response[0]
            answers.append(
                [
                    item.resource_id,
                    item.gets.capacity,
                    item.gets.refresh_interval,
                    item.safe_capacity,
                ]
            )
        out["rounds"].append(answers)
    return out


def test_the_spec_proto_is_the_served_contract() -> None:
    """ferryman serves Doorman's published doorman.proto unchanged."""
    assert OWN.read_text() == SPEC.read_text()


def test_raw_protocol_client_gets_the_same_answers(fleet: Fleet, tmp_path: Path) -> None:
    """Discovery, two rounds of GetCapacity, release and a refusal read the same through stubs
    generated from the spec as through ferryman's."""
    stubs = tmp_path / "raw"
    stubs.mkdir()
    from grpc_tools import protoc  # type: ignore[import-untyped]

    status = protoc.main(
        [
            "protoc",
            f"-I{SPEC.parent}",
            f"--python_out={stubs}",
            f"--grpc_python_out={stubs}",
            str(SPEC),
        ]
    )
    assert status == 0
    (stubs / "client.py").write_text(RAW_CLIENT)
    server = fleet.server()
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(stubs)}
    result = subprocess.run(
        [sys.executable, str(stubs / "client.py"), server.address, "fair-raw"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    raw = json.loads(result.stdout)
    own = _own_client(server, "fair-own")
    assert raw["discovery"] == own["discovery"] == [True, server.address]
    for raw_round, own_round in zip(raw["rounds"], own["rounds"], strict=True):
        for raw_answer, own_answer in zip(raw_round, own_round, strict=True):
            assert raw_answer[0] == "fair-raw" and own_answer[0] == "fair-own"
            assert raw_answer[1:] == pytest.approx(own_answer[1:])
    assert [a[1] for a in raw["rounds"][1]] == pytest.approx([60, 50, 10])
    assert raw["refused"] == ["INVALID_ARGUMENT", "client_id must not be empty"]
    clients = {r["resource_id"]: r["client_count"] for r in server.capacity_page()["resources"]}
    assert clients == {"fair-raw": 2, "fair-own": 3}
