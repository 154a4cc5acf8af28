"""Lease trees as Doorman describes them: named parameters, priorities, the refresh interval
halved at each level, STATIC's safe capacity, three levels of real servers (in process, real
gRPC, one manual clock), and TLS on the link to the parent and from ``CapacityClient``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

import grpc
import pytest

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman.algorithms.leases import (
    AlgorithmSpec,
    Band,
    Demand,
    Kind,
    LeaseState,
    ResourceTemplate,
    TemplateSource,
    allocate,
    with_parameters,
)
from ferryman.client import CapacityClient
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.errors import ConfigError

from helpers.certs import Authority
from helpers.ports import free_port
from helpers.server import ConfigDir, Server, ServerFactory, wait_for

ROOT = """
resources:
  - identifier_glob: api
    capacity: 120
    algorithm:
      kind: FAIR_SHARE
      lease_length: 60
      refresh_interval: 8
      learning_mode_duration: 0
      parameters:
        - {name: lease_duration_secs, value: "40"}
"""


def test_fair_share_serves_higher_priorities_first() -> None:
    """A priority-1 demand is served whole before priority 0 shares what is left."""
    demands = [Demand(80, priority=1), Demand(50), Demand(50)]
    assert allocate(Kind.FAIR_SHARE, 100, demands) == pytest.approx([80, 10, 10])
    # A server's bands are served each at its own priority.
    server = Demand(130, 3, 1, (Band(1, 1, 30), Band(0, 2, 100)))
    got = allocate(Kind.FAIR_SHARE, 100, [server, Demand(100)])
    assert got == pytest.approx([30 + 2 * 70 / 3, 70 / 3])
    assert allocate(Kind.PROPORTIONAL_SHARE, 100, demands) == pytest.approx(
        allocate(Kind.PROPORTIONAL_SHARE, 100, [Demand(80), Demand(50), Demand(50)])
    )


def test_named_parameters_replace_the_fields_and_are_checked() -> None:
    """lease_duration_secs and refresh_interval take effect; a bad decay_factor is refused
    with the file, line and path."""
    spec = AlgorithmSpec(
        parameters=(
            ("lease_duration_secs", "30"),
            ("refresh_interval", "3"),
            ("decay_factor", "0.25"),
        )
    )
    resolved = with_parameters(spec)
    assert (resolved.lease_length, resolved.refresh_interval) == (30, 3)
    assert resolved.refresh_below(8) == 2 and AlgorithmSpec().refresh_below(8) == 4
    bad = ROOT.replace('"40"}', '"40"}\n        - {name: decay_factor, value: "2"}')
    with pytest.raises(ConfigError) as info:
        load_sources([("res.yaml", bad)])
    [problem] = info.value.problems
    assert problem.file == "res.yaml" and problem.path == "resources[0].algorithm.parameters"
    assert "decay_factor" in problem.message and problem.line == 11


class _Templates(TemplateSource):
    def __init__(self, template: ResourceTemplate) -> None:
        self._template = template

    def template(self, resource_id: str) -> ResourceTemplate | None:
        return self._template


def test_static_safe_capacity_is_the_per_client_capacity() -> None:
    """STATIC's capacity is each client's: so is its safe capacity, however many clients."""
    spec = AlgorithmSpec(Kind.STATIC, learning_mode_duration=0)
    state = LeaseState(_Templates(ResourceTemplate("s", 10, spec)), min_refresh_interval=0)
    for client in ("a", "b", "c"):
        lease, safe, _ = state.ask(client, "s", wants=50, now=100.0)
        assert lease.capacity == 10 and safe == 10


def _stub(server: Server) -> doorman_pb2_grpc.CapacityStub:
    return doorman_pb2_grpc.CapacityStub(server.channel)  # type: ignore[no-untyped-call]


def _ask(server: Server, client: str, wants: float) -> doorman_pb2.Lease:
    request = doorman_pb2.GetCapacityRequest(
        client_id=client,
        resource=[doorman_pb2.ResourceRequest(resource_id="api", priority=0, wants=wants)],
    )
    reply: doorman_pb2.GetCapacityResponse = _stub(server).GetCapacity(request, timeout=5)
    return reply.response[0].gets


def _exchange(server: Server) -> float:
    """The child asks its parent once; the seconds until it would ask again."""
    parent = server.service.capacity.parent
    assert parent is not None
    return server.run(parent.exchange())


class Tree:
    """root <- region <- zone; client d on the root, c on the region, a and b on the zone."""

    WANTS: ClassVar[dict[str, float]] = {"a": 1000.0, "b": 1000.0, "c": 1000.0, "d": 10.0}

    def __init__(self, make_server: ServerFactory, config_dir: ConfigDir) -> None:
        config_dir.write("resources.yaml", ROOT)
        self.make_server = make_server
        self.root = make_server(doorman_minimum_refresh_interval=0)
        self.region_port = free_port()
        self.region = self.start_region()
        self.zone = make_server(
            doorman_minimum_refresh_interval=0, doorman_parent=f"127.0.0.1:{self.region_port}"
        )
        self.home = {"a": self.zone, "b": self.zone, "c": self.region, "d": self.root}

    def start_region(self) -> Server:
        return self.make_server(
            doorman_minimum_refresh_interval=0,
            doorman_parent=f"127.0.0.1:{self.root.service.grpc_port}",
            grpc_port=self.region_port,
        )

    def refresh(self) -> dict[str, doorman_pb2.Lease]:
        """One refresh interval: every client asks its server, then each child its parent;
        what the clients hold never adds up to more than the root's capacity."""
        leases = {c: _ask(self.home[c], c, w) for c, w in self.WANTS.items()}
        assert sum(lease.capacity for lease in leases.values()) <= 120 + 1e-9
        for child in (self.zone, self.region):
            _exchange(child)
        return leases

    def converge(self) -> dict[str, doorman_pb2.Lease]:
        """The demand reaches the root in one refresh; three more, and the shares settle."""
        self.refresh()
        for _ in range(3):
            leases = self.refresh()
        return leases


def test_three_levels_converge_to_the_flat_shares_and_halve_the_refresh_interval(
    make_server: ServerFactory, config_dir: ConfigDir, clock: ManualClock
) -> None:
    """Three refresh intervals after the demand reached the root, a root, a region and a
    zone give the shares one flat server would; each level down refreshes twice as often;
    the lease lasts the named lease_duration_secs."""
    tree = Tree(make_server, config_dir)
    shares = allocate(Kind.FAIR_SHARE, 120, [Demand(w) for w in tree.WANTS.values()])
    flat = dict(zip(tree.WANTS, shares, strict=True))
    leases = tree.converge()
    assert {c: lease.capacity for c, lease in leases.items()} == pytest.approx(flat)
    assert [leases[c].refresh_interval for c in "dca"] == [8, 4, 2]
    assert leases["d"].expiry_time == math.floor(clock.now()) + 40
    assert all(leases[c].expiry_time <= leases["d"].expiry_time for c in "abc")


def test_the_zone_rides_out_its_region_dying_and_converges_when_it_is_back(
    make_server: ServerFactory, config_dir: ConfigDir, clock: ManualClock
) -> None:
    """The region stops: the zone's clients keep their lease, then get the safe capacity
    once it expires; a region back on the same address brings the shares back."""
    tree = Tree(make_server, config_dir)
    converged = tree.converge()
    tree.region.stop()
    assert _ask(tree.zone, "a", 1000).capacity == pytest.approx(converged["a"].capacity)
    with pytest.raises(grpc.RpcError):
        _exchange(tree.zone)
    clock.advance(41)  # every lease of the tree is over
    # Safe mode: the root's dynamic safe capacity is 120 / 4 clients, 30 each: the zone
    # spoke for two, so it has 60 to share, all of it for the one client asking now.
    assert _ask(tree.zone, "a", 1000).capacity == pytest.approx(60)
    assert _ask(tree.zone, "b", 1000).capacity == 0
    tree.region = tree.start_region()
    tree.home["c"] = tree.region
    # The zone's channel finds the region again on its own reconnection schedule.
    wait_for(
        "the zone reaches the region",
        lambda: _exchange(tree.zone) > 0,
        timeout=10,
        ignoring=(grpc.RpcError,),
    )
    leases = tree.converge()
    assert {c: lease.capacity for c, lease in leases.items()} == pytest.approx(
        {c: lease.capacity for c, lease in converged.items()}
    )


def test_tls_reaches_a_parent_and_a_capacity_client_reaches_a_tls_server(
    make_server: ServerFactory, config_dir: ConfigDir, tmp_path: Path
) -> None:
    """Under mutual TLS the child's parent link and CapacityClient get answers; a plaintext
    CapacityClient does not."""
    ca = Authority(tmp_path / "ca")
    pem, client = ca.server(), ca.client()
    config_dir.write("resources.yaml", ROOT)
    root = make_server(
        doorman_minimum_refresh_interval=0,
        grpc_server_use_tls=True,
        grpc_server_tls_cert=str(pem.cert),
        grpc_server_tls_key=str(pem.key),
        grpc_client_tls_cacert=str(ca.cert),
    )
    target = f"127.0.0.1:{root.service.grpc_port}"
    child = make_server(
        doorman_minimum_refresh_interval=0,
        doorman_parent=target,
        doorman_parent_tls_cacert=str(ca.cert),
        doorman_parent_tls_cert=str(client.cert),
        doorman_parent_tls_key=str(client.key),
    )
    _ask(child, "a", 50)
    _exchange(child)
    assert _ask(child, "a", 50).capacity == 50
    good = CapacityClient(
        target, ca_file=str(ca.cert), cert_file=str(client.cert), key_file=str(client.key)
    )
    with good, CapacityClient(target, timeout=1) as plain:
        good.resource("api", 10)
        plain.resource("api", 10)
        wait_for("a TLS refresh", lambda: good.stats().refreshes > 0, timeout=10)
        wait_for("a plaintext failure", lambda: plain.stats().failures > 0, timeout=10)
        assert good.stats().failures == 0 and plain.stats().refreshes == 0
