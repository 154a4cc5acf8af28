"""Reservations that wait on the server for held copies: order, priorities, deadlines,
disconnections, replicas, caps."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.algorithms.copies.model import Wait
from ferryman.clock import ManualClock
from ferryman.errors import HoldError, LeaseLostError

from helpers.copies import POLICY, CopyNode
from helpers.holds import Holder
from helpers.server import ConfigDir, Server, ServerFactory
from helpers.stores import Store, memory_store, on_stores

BOTH = on_stores("memory", "redis")
#: Where the queue's keys must share one Cluster slot, and replicas meet without pub/sub.
ALL = on_stores("memory", "redis", "cluster")

QUEUE_CONFIG = """
domain: q
descriptors:
  - key: pool
    copies: {global_limit: 2}
  - key: wide
    copies: {global_limit: 4}
  - key: team
    copies: {limit: 2, global_limit: 3}
"""


class Waiter(Holder):
    """A session that reserves copies of the ``q`` domain, waiting when asked to."""

    def request(
        self,
        key: str,
        copies: int,
        max_wait: float,
        priority: int,
        min_copies: int | None,
        value: str = "x",
    ) -> limiter_pb2.ReserveRequest:
        request = limiter_pb2.ReserveRequest(
            domain="q", descriptor=[limiter_pb2.Entry(key=key, value=value)], copies=copies,
            priority=priority,
        )  # fmt: skip
        if max_wait:
            request.max_wait.FromMilliseconds(round(max_wait * 1000))
        if min_copies is not None:
            request.min_copies = min_copies
        return request

    def take(
        self,
        copies: int,
        *,
        value: str = "x",
        key: str = "pool",
        max_wait: float = 0.0,
        priority: int = 0,
        min_copies: int | None = None,
    ) -> Any:
        request = self.request(key, copies, max_wait, priority, min_copies, value)
        return self.stub.Reserve(request, metadata=self.md, timeout=30)

    def later(
        self,
        copies: int,
        *,
        value: str = "x",
        key: str = "pool",
        max_wait: float = 30.0,
        priority: int = 0,
        min_copies: int | None = None,
    ) -> Any:
        """The Reserve call, sent: a future of its answer."""
        request = self.request(key, copies, max_wait, priority, min_copies, value)
        return self.stub.Reserve.future(request, metadata=self.md, timeout=60)

    def give(self, copies: int, key: str = "pool", value: str = "x") -> None:
        self.stub.Release(
            limiter_pb2.ReleaseRequest(
                domain="q", descriptor=[limiter_pb2.Entry(key=key, value=value)], copies=copies
            ),
            metadata=self.md,
            timeout=10,
        )


def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (boundedly) for a state the servers reach on their own."""
    deadline = time.monotonic() + 15
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


def waiting(server: Server) -> int:
    return len(server.service.holds.queue.waiters)


def queue_in(server: Server, want: int) -> None:
    until(lambda: waiting(server) == want, f"{want} waiting on the server")


def first_done(futures: list[Any]) -> list[int]:
    """Which of ``futures`` have an answer, once at least one has."""
    until(lambda: any(f.done() for f in futures), "an answer")
    return [i for i, f in enumerate(futures) if f.done()]


@pytest.fixture
def pair(config_dir: ConfigDir, make_server: ServerFactory) -> tuple[Server, Server]:
    """Two servers on one shared store, serving the ``q`` domain."""
    config_dir.write("q.yaml", QUEUE_CONFIG)
    a = make_server(hold_lease_seconds=3.0)
    b = make_server(store_of=a, hold_lease_seconds=3.0)
    return a, b


@ALL
def test_waiters_of_one_priority_are_granted_in_arrival_order(
    pair: tuple[Server, Server],
) -> None:
    """Copies freed one at a time go to the waiters in the order they arrived."""
    a, _ = pair
    owner = Waiter(a)
    assert owner.take(2).granted == 2
    waiters = [Waiter(a) for _ in range(4)]
    futures = []
    for i, w in enumerate(waiters):
        futures.append(w.later(1))
        queue_in(a, i + 1)
    owner.give(1)
    assert first_done(futures) == [0]
    owner.give(1)
    until(lambda: futures[1].done(), "the second grant")
    assert [f.done() for f in futures] == [True, True, False, False]
    waiters[0].give(1)
    assert first_done(futures[2:]) == [0]
    waiters[1].give(1)
    until(lambda: futures[3].done(), "the last grant")
    assert [(f.result().granted, f.result().queued) for f in futures] == [(1, True)] * 4


@ALL
def test_a_higher_priority_is_served_before_earlier_lower_ones(
    pair: tuple[Server, Server],
) -> None:
    """A waiter of priority 5 arriving last is granted before two of priority 0."""
    a, _ = pair
    owner = Waiter(a)
    owner.take(2)
    sessions = [Waiter(a) for _ in range(3)]
    low = [sessions[0].later(1), sessions[1].later(1)]
    queue_in(a, 2)
    high = sessions[2].later(1, priority=5)
    queue_in(a, 3)
    owner.give(1)
    until(high.done, "the high priority's grant")
    assert high.result().granted == 1
    assert not any(f.done() for f in low)
    owner.give(1)
    assert first_done(low) == [0]


@BOTH
def test_min_copies_waiter_is_granted_what_is_worth_having(pair: tuple[Server, Server]) -> None:
    """A waiter for 3 copies of which 2 will do is granted 2 when 2 are freed."""
    a, _ = pair
    owner = Waiter(a)
    assert owner.take(4, key="wide").granted == 4
    waiter = Waiter(a)
    future = waiter.later(3, key="wide", min_copies=2)
    queue_in(a, 1)
    owner.give(1, key="wide")
    owner.give(1, key="wide")
    until(future.done, "the partial grant")
    reply = future.result()
    assert (reply.granted, reply.global_held) == (2, 4)


@BOTH
def test_a_waiter_held_back_by_its_own_tenant_limit_blocks_only_its_tenant(
    pair: tuple[Server, Server],
) -> None:
    """A copy the first waiter's tenant may not have goes to the next tenant's waiter; one
    the shared pool lacks keeps everyone waiting."""
    a, _ = pair
    full, other = Waiter(a), Waiter(a)
    assert full.take(2, key="team", value="red").granted == 2  # red's own limit
    assert other.take(1, key="team", value="blue").granted == 1  # the node's 3 are held
    red, blue = Waiter(a), Waiter(a)
    red_wait = red.later(1, key="team", value="red")
    queue_in(a, 1)
    blue_wait = blue.later(1, key="team", value="blue")
    queue_in(a, 2)
    other.give(1, key="team", value="blue")
    until(blue_wait.done, "the grant to the tenant with room")
    assert blue_wait.result().granted == 1 and not red_wait.done()
    full.give(1, key="team", value="red")
    until(red_wait.done, "red's grant once its tenant has room")
    assert red_wait.result().granted == 1


@BOTH
def test_waiter_whose_deadline_passes_holds_nothing(pair: tuple[Server, Server]) -> None:
    """At max_wait a waiter is answered 0 copies and leaves nothing held or queued."""
    a, _ = pair
    owner = Waiter(a)
    owner.take(2)
    reply = Waiter(a).take(1, max_wait=0.2)
    assert (reply.granted, reply.queued) == (0, True)
    assert waiting(a) == 0
    owner.give(2)
    assert owner.take(2).granted == 2


@BOTH
def test_waiter_within_the_calls_deadline_is_answered_by_it(pair: tuple[Server, Server]) -> None:
    """A call's own deadline shorter than its max_wait ends the wait with an answer."""
    a, _ = pair
    owner, waiter = Waiter(a), Waiter(a)
    owner.take(2)
    request = waiter.request("pool", 1, 30.0, 0, None)
    reply = waiter.stub.Reserve(request, metadata=waiter.md, timeout=1.0)
    assert (reply.granted, reply.queued) == (0, True)
    assert waiting(a) == 0


@BOTH
def test_disconnected_waiter_leaves_the_queue(pair: tuple[Server, Server]) -> None:
    """A cancelled call leaves the queue: the freed copy goes to the next waiter."""
    a, _ = pair
    owner = Waiter(a)
    owner.take(2)
    first, second = Waiter(a), Waiter(a)
    gone = first.later(1)
    queue_in(a, 1)
    stays = second.later(1)
    queue_in(a, 2)
    gone.cancel()
    queue_in(a, 1)
    owner.give(1)
    until(stays.done, "the grant to the waiter that stayed")
    assert stays.result().granted == 1
    owner.give(1)
    assert owner.take(1).granted == 1  # the cancelled waiter holds nothing


@BOTH
def test_no_wait_reserve_does_not_jump_the_queue(pair: tuple[Server, Server]) -> None:
    """A copy freed while the head waiter needs two stays free: a later caller may not take it."""
    a, _ = pair
    owner, head = Waiter(a), Waiter(a)
    owner.take(2)
    queued = head.later(2)
    queue_in(a, 1)
    owner.give(1)
    assert Waiter(a).take(1).granted == 0
    assert Waiter(a).take(1, max_wait=0.1).granted == 0
    owner.give(1)
    until(queued.done, "the head waiter's grant")
    assert queued.result().granted == 2


@BOTH
def test_a_sessions_end_wakes_the_waiter(pair: tuple[Server, Server]) -> None:
    """Copies freed because their session ended go to the waiter."""
    a, b = pair
    owner, waiter = Waiter(a), Waiter(b)
    owner.take(2)
    future = waiter.later(2)
    queue_in(b, 1)
    owner.close()
    until(future.done, "the grant after the session ended")
    assert future.result().granted == 2


@BOTH
def test_an_unclaimed_transfer_that_lapses_wakes_the_waiter(
    pair: tuple[Server, Server], clock: ManualClock
) -> None:
    """Copies staged for a transfer nobody seizes go to the waiter when the transfer lapses."""
    a, _ = pair
    owner, waiter = Waiter(a), Waiter(a)
    owner.take(2)
    request = limiter_pb2.TransferRequest(
        domain="q", descriptor=[limiter_pb2.Entry(key="pool", value="x")], copies=2
    )
    request.ttl.FromMilliseconds(500)
    owner.stub.Transfer(request, metadata=owner.md, timeout=10)
    future = waiter.later(1)
    queue_in(a, 1)
    clock.advance(1)
    # The waiting server renews its lease on the node now and then: that call sees the lapse.
    until(future.done, "the grant after the transfer lapsed")
    assert future.result().granted == 1


@ALL
def test_release_on_one_replica_wakes_a_waiter_on_another(pair: tuple[Server, Server]) -> None:
    """Copies released through server A are granted to the caller waiting on server B."""
    a, b = pair
    owner = Waiter(a)
    owner.take(2)
    waiter = Waiter(b)
    future = waiter.later(2)
    queue_in(b, 1)
    owner.give(2)
    until(future.done, "the grant on the other replica")
    assert future.result().granted == 2
    assert owner.take(1).granted == 0


@BOTH
def test_replica_dead_while_its_callers_wait_loses_no_copy(
    pair: tuple[Server, Server], clock: ManualClock
) -> None:
    """A dead replica's waiters lose their places and its copies come back: none is lost."""
    a, b = pair
    doomed = Waiter(b)
    assert doomed.take(2).granted == 2
    pending = doomed.later(1, max_wait=30)
    queue_in(b, 1)
    # B stops renewing (as if it had died); A, past B's lease, finds every copy free.
    renewer = b.service.holds._renewer
    assert renewer is not None
    b.loop.call_soon_threadsafe(renewer.cancel)
    clock.advance(4)
    owner = Waiter(a)
    assert owner.take(2).granted == 2
    owner.give(2)
    assert owner.take(2).granted == 2  # the dead replica's waiter was granted nothing
    assert not pending.done() or pending.result().granted == 0


@BOTH
def test_queue_cap_refuses_more_waiters(config_dir: ConfigDir, make_server: ServerFactory) -> None:
    """Past HOLD_QUEUE_MAX_PER_NODE a waiter is refused at once, and counted."""
    config_dir.write("q.yaml", QUEUE_CONFIG)
    a = make_server(hold_queue_max_per_node=1)
    owner = Waiter(a)
    owner.take(2)
    waiter = Waiter(a)
    first = waiter.later(1)
    queue_in(a, 1)
    with pytest.raises(grpc.RpcError) as info:
        Waiter(a).take(1, max_wait=5)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert a.service.holds.queue.status()["full"] == 1
    assert a.service.stats.get("ratelimit.service.holds.queue_full") == 1
    owner.give(1)
    until(first.done, "the queued waiter's grant")


@BOTH
def test_access_policy_caps_the_priority_a_caller_claims(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """max_priority in the access policy refuses a higher priority, allows up to it."""
    config_dir.write("q.yaml", QUEUE_CONFIG)
    config_dir.write(
        "access.yaml",
        "access:\n  - identities: [anonymous]\n    allow: {holds: true}\n    max_priority: 2\n",
    )
    a = make_server()
    w = Waiter(a)
    assert w.take(1, priority=2).granted == 1
    with pytest.raises(grpc.RpcError) as info:
        w.take(1, priority=3)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "priority over 2" in (info.value.details() or "")


@BOTH
def test_explain_and_status_show_the_queue(pair: tuple[Server, Server]) -> None:
    """/explain reads a node's counts and queue length; /status counts the waits' ends."""
    a, _ = pair
    owner, waiter = Waiter(a), Waiter(a)
    owner.take(2)
    future = waiter.later(1)
    queue_in(a, 1)
    status, body = a.http("GET", "/explain?domain=q&descriptor=pool=x", debug=True)
    assert status == 200, body
    [d] = json.loads(body)["descriptors"]
    assert (d["global_held"], d["waiting"]) == (2, 1)
    owner.give(1)
    until(future.done, "the grant")
    status, body = a.http("GET", "/status", debug=True)
    queue = json.loads(body)["holds"]["queue"]
    assert (queue["waiting"], queue["granted"], queue["nodes"]) == (0, 1, {})


@BOTH
def test_a_trim_keeps_what_a_waiter_was_granted_until_it_leaves(store: Store) -> None:
    """Copies granted to a waiter not yet collected are not stranded: a trim frees them only
    once the waiter has left without them."""
    node = CopyNode(store)
    run, copies = store.run, node.copies
    groups = POLICY.groups_of("solo")
    assert node.reserve("solo", 8, server="B") == 8  # the group wide (8) is full
    wait = Wait("w1", 0, 60_000, "-")
    out = run(copies.reserve(node.at("A"), "solo", POLICY, groups, 2, 2, wait))
    assert (out.granted, out.queued) == (0, True)
    node.release("solo", 3, server="B")
    assert run(copies.granted(node.at("A"), ["w1"])) == ["w1"]
    assert run(copies.trim(node.at("A"), {})) == 0
    assert node.counts()["all"] == 7
    assert run(copies.leave(node.at("A"), "w1")) == 2
    assert run(copies.trim(node.at("A"), {})) == 2  # no session took them: stranded now
    assert node.counts()["all"] == 5


# (operation, tenant, copies or seconds, priority, server)
QueueStep = tuple[str, str, int, int, str]

queue_steps = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "wait", "wait", "leave", "release", "tick", "renew"]),
        st.sampled_from(["acme", "new-co", "trial-9", "solo"]),
        st.integers(1, 6),
        st.integers(0, 2),
        st.sampled_from(["A", "B"]),
    ),
    max_size=40,
)


def replay_queue(node: CopyNode, steps: list[QueueStep]) -> list[object]:
    """Every step on ``node`` (waiters included): answers, grants and counts after each."""
    seen: list[object] = []
    waiters: list[tuple[str, str]] = []  # (id, server), in arrival order
    run, copies = node.store.run, node.copies
    for i, (op, tenant, n, priority, server) in enumerate(steps):
        groups = POLICY.groups_of(tenant)
        try:
            if op in ("reserve", "wait"):
                wait = Wait(f"w{i}", priority, n * 1000, "-") if op == "wait" else None
                out = run(copies.reserve(node.at(server), tenant, POLICY, groups, n, 1, wait))
                seen.append((out.granted, out.queued))
                if out.queued:
                    waiters.append((f"w{i}", server))
            elif op == "leave" and waiters:
                wid, owner = waiters.pop(n % len(waiters))
                seen.append(("left", run(copies.leave(node.at(owner), wid))))
            elif op == "release":
                node.release(tenant, n, server=server)
                seen.append("released")
            elif op == "tick":
                node.now += n * 1.5
                seen.append("tick")
            else:
                node.renew(server)
                seen.append("renewed")
        except (HoldError, LeaseLostError) as exc:
            seen.append(type(exc).__name__)
        ids = [w for w, _ in waiters]
        seen.append(run(copies.granted(node.at("A"), ids)) if ids else [])
        counts = node.counts()
        assert counts.get("all", 0) <= (POLICY.global_limit or 10**9)
        seen.append(counts)
    return seen


@on_stores("redis")
@settings(
    deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=queue_steps)
def test_random_queues_agree_on_memory_and_redis(store: Store, steps: list[QueueStep]) -> None:
    """Random waits, leaves, releases and lapses across two servers: Redis grants exactly
    what memory grants, to the same waiters, in the same order."""
    with memory_store(ManualClock(0.0)) as reference:
        assert replay_queue(CopyNode(reference), steps) == replay_queue(CopyNode(store), steps)
