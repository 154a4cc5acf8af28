"""A child server's view of its parent (``ParentClient``) against a real gRPC parent that can
go away: the grants it keeps, and what its clients get once the parent is out of reach."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman.algorithms.leases.state import LeaseState
from ferryman.apis.capacity_parent import ParentClient
from ferryman.clock import ManualClock

START = 1_700_000_000.0
LEASE = 3


class _Root(doorman_pb2_grpc.CapacityServicer):
    """Grants each asked resource 50 for ``LEASE`` seconds, naming a safe capacity of 5."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.asked: list[list[str]] = []

    async def GetServerCapacity(
        self, request: doorman_pb2.GetServerCapacityRequest, context: object
    ) -> doorman_pb2.GetServerCapacityResponse:
        self.asked.append([r.resource_id for r in request.resource])
        reply = doorman_pb2.GetServerCapacityResponse()
        for resource in request.resource:
            item = reply.response.add(resource_id=resource.resource_id, safe_capacity=5)
            item.gets.expiry_time = int(self.clock.now()) + LEASE
            item.gets.refresh_interval = 1
            item.gets.capacity = 50
            item.algorithm.kind = doorman_pb2.Algorithm.FAIR_SHARE
            item.algorithm.lease_length = LEASE
            item.algorithm.refresh_interval = 1
        return reply


@contextlib.asynccontextmanager
async def _child() -> AsyncIterator[
    tuple[ManualClock, _Root, grpc.aio.Server, ParentClient, LeaseState]
]:
    """A root on a free port and a child's parent client and lease state under it."""
    clock = ManualClock(START)
    root = _Root(clock)
    server = grpc.aio.server()
    doorman_pb2_grpc.add_CapacityServicer_to_server(root, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    holder: list[LeaseState] = []
    address = f"127.0.0.1:{port}"
    parent = ParentClient(address, "child", clock, lambda: holder[0], refresh_floor=1)
    holder.append(LeaseState(parent, min_refresh_interval=0))
    try:
        yield clock, root, server, parent, holder[0]
    finally:
        await parent.stop()
        await server.stop(None)


async def _scenario(resources_when_gone: list[str]) -> tuple[list[float], dict[str, object]]:
    """The root grants, goes away, the lease runs out and the child's state forgets the
    resource (nobody holds it); then a client asks for each of ``resources_when_gone``."""
    async with _child() as (clock, root, server, parent, state):
        assert state.ask("c0", "fair", wants=100, now=clock.now())[0].capacity == 0
        await parent.exchange()
        assert root.asked == [["fair"]]
        assert state.ask("c0", "fair", wants=100, now=clock.now())[0].capacity == 50

        await server.stop(None)
        clock.advance(LEASE + 5)
        state.sweep(clock.now())
        assert not state.resources  # the child's one client let its lease run out
        assert await parent.exchange() > 0  # nothing to ask: the dead parent is not called
        state.ask("c1", "other", wants=100, now=clock.now())
        with pytest.raises(grpc.aio.AioRpcError):
            await parent.exchange()
        got = [
            state.ask("c0", rid, wants=100, now=clock.now())[0].capacity
            for rid in resources_when_gone
        ]
        return got, parent.status()


def test_a_child_keeps_the_safe_capacity_of_an_expired_grant_while_the_parent_is_gone() -> None:
    """A client coming back after the lease ran out gets the safe capacity the parent named,
    not 0; a resource the parent never granted gets 0 (and is not kept)."""
    got, status = asyncio.run(_scenario(["fair", "other"]))
    assert got == [5, 0]
    leases = status["leases"]
    assert isinstance(leases, dict)
    assert set(leases) == {"fair"}
    assert leases["fair"]["expires_in"] < 0


async def _forgotten_once_the_parent_answers() -> dict[str, object]:
    async with _child() as (clock, root, _server, parent, state):
        state.ask("c0", "old", wants=10, now=clock.now())
        await parent.exchange()
        clock.advance(LEASE + 5)
        state.sweep(clock.now())
        state.ask("c0", "new", wants=10, now=clock.now())
        await parent.exchange()
        assert root.asked == [["old"], ["new"]]
        return parent.status()


def test_an_expired_grant_nobody_holds_is_forgotten_when_the_parent_answers() -> None:
    """The kept grants stay bounded: the next answer from the parent drops the expired ones
    of resources no client holds."""
    status = asyncio.run(_forgotten_once_the_parent_answers())
    leases = status["leases"]
    assert isinstance(leases, dict)
    assert set(leases) == {"new"}
