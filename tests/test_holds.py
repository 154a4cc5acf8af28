"""Held resources through the real servers: sessions, reserve, release, transfer, seize."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.clock import ManualClock

from helpers.holds import JOBS_CONFIG, Holder
from helpers.server import ConfigDir, Server, ServerFactory, codes, descriptor, limiter_stub
from helpers.stores import on_stores

pytestmark = on_stores("memory", "redis")


def groups_of(reply: Any) -> dict[str, tuple[int, int]]:
    return {g.name: (g.limit, g.held) for g in reply.groups}


@pytest.fixture
def pair(config_dir: ConfigDir, make_server: ServerFactory) -> tuple[Server, Server]:
    """Two servers on one shared store (memory: the same backend object; redis: one Redis)."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    a = make_server(hold_lease_seconds=3.0)
    b = make_server(store_of=a, hold_lease_seconds=3.0)
    return a, b


def test_reserve_and_release_count_tenant_groups_and_global(pair: tuple[Server, Server]) -> None:
    """Reserve reports the tenant's groups and every count; release gives them back."""
    a, _ = pair
    h = Holder(a)
    r = h.reserve("acme", 4)
    assert r.granted == 4
    assert (r.limit, r.global_limit, r.tenant_held, r.global_held) == (10, 12, 4, 4)
    assert groups_of(r) == {"vip": (12, 4), "everyone": (9, 4)}  # 50 lowered to the global 12
    h.release("acme", 4, ["vip", "everyone"])
    assert h.reserve("acme", 1).global_held == 1
    h.close()


def test_limits_bind_and_min_copies_fails_whole(pair: tuple[Server, Server]) -> None:
    """Group and global limits cap grants; below min_copies nothing is held."""
    a, b = pair
    h1, h2 = Holder(a), Holder(b)
    assert h1.reserve("trial-1", 9, min_copies=1).granted == 5  # probation: 5
    assert h2.reserve("trial-2", 1).granted == 0  # probation is full (across servers)
    assert h2.reserve("acme", 8, min_copies=5).granted == 0  # everyone: 9 - 5 = 4 < 5
    assert h2.reserve("acme", 8, min_copies=1).granted == 4
    h1.close()
    h2.close()


def test_tenant_in_two_groups_takes_one_copy_in_each(pair: tuple[Server, Server]) -> None:
    """new-co is in probation and everyone: both pools count its copies."""
    a, _ = pair
    h = Holder(a)
    r = h.reserve("new-co", 2)
    assert groups_of(r) == {"probation": (5, 2), "everyone": (9, 2)}
    h.close()


def test_release_names_the_groups_of_the_reservation_after_a_config_change(
    pair: tuple[Server, Server], config_dir: ConfigDir
) -> None:
    """After new-co leaves probation in config, releasing with the old groups still works."""
    a, _ = pair
    h = Holder(a)
    h.reserve("new-co", 2)
    config_dir.write("jobs.yaml", JOBS_CONFIG.replace("[new-co, trial-*]", "[trial-*]"))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and a.service.holder.version < 2:
        time.sleep(0.02)
    assert a.service.holder.version >= 2
    assert groups_of(h.reserve("new-co", 1)) == {"everyone": (9, 3)}
    h.release("new-co", 2, ["probation", "everyone"])
    h.release("new-co", 1, ["everyone"])
    assert h.reserve("trial-1", 5).granted == 5  # probation is free again
    h.close()


def test_over_release_is_rejected_and_changes_nothing(pair: tuple[Server, Server]) -> None:
    """Releasing more than the session holds is INVALID_ARGUMENT; counts stay."""
    a, _ = pair
    h = Holder(a)
    h.reserve("acme", 2)
    with pytest.raises(grpc.RpcError) as info:
        h.release("acme", 3, ["vip", "everyone"])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError):
        h.release("acme", 1, ["vip"])  # not the groups of the reservation
    assert h.reserve("acme", 1).tenant_held == 3
    h.close()


def test_transfer_on_one_server_and_seize_on_the_other(pair: tuple[Server, Server]) -> None:
    """Copies staged on A are seized once on B; the sender can no longer release them."""
    a, b = pair
    sender, receiver = Holder(a), Holder(b)
    sender.reserve("acme", 5)
    tid = sender.transfer("acme", 3, ["vip", "everyone"], ttl=30)
    with pytest.raises(grpc.RpcError):
        sender.release("acme", 3, ["vip", "everyone"])
    seized = receiver.seize(tid)
    assert (seized.domain, seized.copies) == ("jobs", 3)
    assert [(e.key, e.value) for e in seized.descriptor] == [("tenant", "acme")]
    assert set(seized.groups) == {"vip", "everyone"}
    with pytest.raises(grpc.RpcError) as info:
        receiver.seize(tid)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    receiver.release("acme", 3, list(seized.groups))
    sender.release("acme", 2, ["vip", "everyone"])
    assert receiver.reserve("acme", 1).global_held == 1
    sender.close()
    receiver.close()


def test_unclaimed_transfer_expires_and_returns_its_copies(
    pair: tuple[Server, Server], clock: ManualClock
) -> None:
    """A transfer whose ttl passes is released on the next operation; seize then fails."""
    a, b = pair
    sender, receiver = Holder(a), Holder(b)
    sender.reserve("acme", 4)
    tid = sender.transfer("acme", 4, ["vip", "everyone"], ttl=2)
    clock.advance(2.5)
    assert receiver.reserve("acme", 1).tenant_held == 1
    with pytest.raises(grpc.RpcError) as info:
        receiver.seize(tid)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    sender.close()
    receiver.close()


def test_closing_a_session_releases_what_it_holds(pair: tuple[Server, Server]) -> None:
    """When the stream ends, the server releases every copy the session held."""
    a, b = pair
    h = Holder(a)
    h.reserve("acme", 6)
    h.reserve("trial-3", 2)
    h.close()
    other = Holder(b)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        r = other.reserve("acme", 1)
        if r.global_held == 1:
            break
        other.release("acme", 1, ["vip", "everyone"])
        time.sleep(0.02)
    assert r.global_held == 1
    other.close()


def test_calls_without_an_open_session_are_refused(pair: tuple[Server, Server]) -> None:
    """No session metadata, or a session of another server: FAILED_PRECONDITION."""
    a, b = pair
    stub = limiter_stub(a.channel)
    request = limiter_pb2.ReserveRequest(
        domain="jobs", descriptor=[limiter_pb2.Entry(key="tenant", value="acme")], copies=1
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.Reserve(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    other = Holder(b)
    with pytest.raises(grpc.RpcError) as info:
        stub.Reserve(request, metadata=other.md, timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    other.close()


def test_wrong_kind_of_node_is_a_client_error(pair: tuple[Server, Server]) -> None:
    """Reserving a fixed-window node is INVALID_ARGUMENT; an unknown one NOT_FOUND."""
    a, _ = pair
    h = Holder(a)
    for key, code in (
        ("fixed", grpc.StatusCode.INVALID_ARGUMENT),
        ("nope", grpc.StatusCode.NOT_FOUND),
    ):
        request = limiter_pb2.ReserveRequest(
            domain="jobs", descriptor=[limiter_pb2.Entry(key=key, value="x")], copies=1
        )
        with pytest.raises(grpc.RpcError) as info:
            h.stub.Reserve(request, metadata=h.md, timeout=5)
        assert info.value.code() == code
    h.close()


def test_dead_server_copies_are_freed_after_its_lease(
    pair: tuple[Server, Server], clock: ManualClock
) -> None:
    """A server that stops renewing loses its holds: the other frees them, its sessions end."""
    a, b = pair
    h = Holder(a)
    h.reserve("acme", 7)
    # Server A stops renewing (as if it had died); B keeps working past A's lease.
    renewer = a.service.holds._renewer
    assert renewer is not None
    a.loop.call_soon_threadsafe(renewer.cancel)
    clock.advance(4)
    other = Holder(b)
    assert other.reserve("acme", 1).global_held == 1
    # A, back to life, must not serve freed holds: its next call ends its sessions.
    with pytest.raises(grpc.RpcError) as info:
        h.release("acme", 7, ["vip", "everyone"])
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
    other.close()


def test_envoy_concurrency_limit_holds_on_request_and_releases_on_stream_end(
    pair: tuple[Server, Server],
) -> None:
    """ShouldRateLimit takes copies; the negative-hits call (on any replica) gives them back."""
    a, b = pair
    d = [("upstream", "tenant-1")]
    assert codes(a.ask("jobs", d)) == ["OK"]
    assert codes(b.ask("jobs", d)) == ["OK"]
    third = a.ask("jobs", d)
    assert codes(third) == ["OVER_LIMIT"]
    # The first stream ends: Envoy reports it with negative hits, here to the other replica.
    assert codes(b.ask("jobs", descriptor(d, hits=1, negative=True))) == ["OK"]
    assert codes(a.ask("jobs", d)) == ["OK"]
    assert codes(a.ask("jobs", d)) == ["OVER_LIMIT"]
    # Another tenant has its own limit.
    assert codes(a.ask("jobs", [("upstream", "tenant-2")])) == ["OK"]


def test_envoy_holds_expire_after_hold_ttl(pair: tuple[Server, Server], clock: ManualClock) -> None:
    """If the proxy never reports the end of a stream, its hold lapses after hold_ttl."""
    a, _ = pair
    d = [("upstream", "lost")]
    a.ask("jobs", d)
    a.ask("jobs", d)
    assert codes(a.ask("jobs", d)) == ["OVER_LIMIT"]
    clock.advance(31)
    assert codes(a.ask("jobs", d)) == ["OK"]
    # Late stream-end reports for the lapsed holds release what is held, never below zero.
    a.ask("jobs", descriptor(d, hits=2, negative=True))
    assert codes(a.ask("jobs", d)) == ["OK"]
    assert codes(a.ask("jobs", d)) == ["OK"]
    assert codes(a.ask("jobs", d)) == ["OVER_LIMIT"]
