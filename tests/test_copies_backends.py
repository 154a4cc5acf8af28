"""Held copies (a distributed counting semaphore) in memory and in Redis's Lua script."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import RedisBackend
from ferryman.clock import ManualClock
from ferryman.errors import HoldError, LeaseLostError, NotFoundError
from ferryman.limits.copies import CopyGroup, CopyPolicy

from helpers.redis_procs import RedisCluster, RedisProcess
from helpers.stores import redis_backend

T = TypeVar("T")
LEASE = 10_000  # ms

PROBATION = CopyGroup("probation", 5, ("new-co", "trial-*"))
VIP = CopyGroup("vip", 50, ("acme",))
WIDE = CopyGroup("wide", 8, ("*",))
POLICY = CopyPolicy(limit=10, global_limit=12, groups=(PROBATION, VIP, WIDE), hold_ttl=20.0)

Backend = MemoryBackend | RedisBackend


class Node:
    """One copy-limited node on one backend, seen from named servers at controlled times."""

    def __init__(
        self, backend: Backend, redis_port: int | None = None, cluster: bool = False
    ) -> None:
        self.backend = backend
        self.node = f"copies{uuid.uuid4().hex[:10]}"
        self.now = 1_700_000_000.0
        self.port = redis_port
        self.cluster = cluster
        self.loop = asyncio.new_event_loop()
        self.run(backend.start())

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.backend.close())
        self.loop.close()

    def reserve(self, tenant: str, copies: int, min_copies: int = 1, server: str = "A") -> int:
        groups = POLICY.groups_of(tenant)
        out = self.run(
            self.backend.reserve(
                self.node, tenant, POLICY, groups, copies, min_copies, server, LEASE, self.now
            )
        )
        return out.granted

    def release(self, tenant: str, copies: int, groups: tuple[str, ...] | None = None,
                server: str = "A") -> None:  # fmt: skip
        names = tuple(g.name for g in POLICY.groups_of(tenant)) if groups is None else groups
        self.run(self.backend.release(self.node, tenant, names, copies, server, LEASE, self.now))

    def transfer(self, tenant: str, copies: int, ttl: float, server: str = "A") -> str:
        names = tuple(g.name for g in POLICY.groups_of(tenant))
        tid = uuid.uuid4().hex
        self.run(
            self.backend.transfer(
                self.node, tenant, names, copies, ttl, tid, server, LEASE, self.now
            )
        )
        return tid

    def seize(self, tid: str, server: str = "B") -> Any:
        return self.run(self.backend.seize(self.node, tid, server, LEASE, self.now))

    def ereserve(self, tenant: str, copies: int) -> int:
        groups = POLICY.groups_of(tenant)
        hold = uuid.uuid4().hex
        out = self.run(
            self.backend.envoy_reserve(
                self.node, tenant, POLICY, groups, copies, hold, "envoy", self.now
            )
        )
        return out.granted

    def erelease(self, tenant: str, copies: int) -> int:
        return self.run(self.backend.envoy_release(self.node, tenant, copies, "envoy", self.now))

    def renew(self, server: str) -> None:
        self.run(self.backend.renew(self.node, server, LEASE, self.now))

    def counts(self) -> dict[str, int]:
        if isinstance(self.backend, MemoryBackend):
            return self.backend.ledger.counts(self.node)
        assert self.port is not None
        client = (
            redis.RedisCluster(host="127.0.0.1", port=self.port)
            if self.cluster
            else redis.Redis(port=self.port)
        )
        with client:
            raw = client.hgetall("{" + self.node + "}:n")
        return {k.decode(): int(v) for k, v in raw.items()}


@pytest.fixture(params=["memory", "redis", "cluster"])
def make_node(
    request: pytest.FixtureRequest,
) -> Callable[[], Node]:
    nodes: list[Node] = []

    def factory() -> Node:
        if request.param == "memory":
            node = Node(MemoryBackend(ManualClock(0.0)))
        elif request.param == "cluster":
            cluster: RedisCluster = request.getfixturevalue("redis_cluster")
            backend = redis_backend(cluster.url, timeout=5.0, server_time=False)
            node = Node(backend, cluster.nodes[0].port, cluster=True)
        else:
            server: RedisProcess = request.getfixturevalue("redis_server")
            backend = redis_backend(server.url, timeout=5.0, server_time=False)
            node = Node(backend, server.port)
        nodes.append(node)
        return node

    yield factory  # type: ignore[misc]
    for node in nodes:
        node.close()


def test_reserve_counts_tenant_group_and_global(make_node: Callable[[], Node]) -> None:
    """A reservation counts once for the tenant, once in each of its groups and globally."""
    n = make_node()
    assert n.reserve("acme", 3) == 3
    assert n.counts() == {"d:acme": 3, "g:vip": 3, "g:wide": 3, "all": 3}
    n.release("acme", 3)
    assert n.counts() == {}


def test_limits_bind_at_every_level(make_node: Callable[[], Node]) -> None:
    """Tenant limit 10, group limits 5 and 8, global 12: each one caps the grant."""
    n = make_node()
    assert n.reserve("trial-1", 9) == 5  # probation holds 5
    assert n.reserve("trial-2", 1) == 0  # probation is full
    assert n.reserve("acme", 9) == 3  # wide: 8 - 5
    assert n.reserve("acme", 4, min_copies=4) == 0  # wide is full: nothing granted
    assert n.counts()["all"] == 8


def test_tenant_in_two_groups_takes_one_copy_from_each(make_node: Callable[[], Node]) -> None:
    """new-co is in probation and wide: one reservation takes from both pools."""
    n = make_node()
    assert n.reserve("new-co", 2) == 2
    counts = n.counts()
    assert counts["g:probation"] == 2
    assert counts["g:wide"] == 2


def test_release_names_the_groups_as_they_were_at_reserve_time(
    make_node: Callable[[], Node],
) -> None:
    """After membership changes, a release naming the old groups returns the right pools."""
    n = make_node()
    n.reserve("new-co", 2)
    # new-co has since left probation; the release names the groups of the reservation.
    n.release("new-co", 2, groups=("probation", "wide"))
    assert n.counts() == {}


def test_over_release_is_rejected_and_changes_nothing(make_node: Callable[[], Node]) -> None:
    """Releasing more than held, or naming a group not held, raises and leaves counts alone."""
    n = make_node()
    n.reserve("acme", 2)
    before = n.counts()
    with pytest.raises(HoldError):
        n.release("acme", 3)
    with pytest.raises(HoldError):
        n.release("acme", 1, groups=("probation",))
    assert n.counts() == before


def test_transfer_keeps_copies_counted_and_seize_claims_them_once(
    make_node: Callable[[], Node],
) -> None:
    """Staged copies stay counted, cannot be released by the sender, and seize works once."""
    n = make_node()
    n.reserve("acme", 5)
    tid = n.transfer("acme", 3, ttl=30)
    assert n.counts()["all"] == 5
    with pytest.raises(HoldError):
        n.release("acme", 3)  # A holds only 2 now
    seized = n.seize(tid, server="B")
    assert (seized.tenant, seized.copies, set(seized.groups)) == ("acme", 3, {"vip", "wide"})
    with pytest.raises(NotFoundError):
        n.seize(tid, server="B")
    n.release("acme", 3, server="B")
    n.release("acme", 2, server="A")
    assert n.counts() == {}


def test_unclaimed_transfer_returns_its_copies_after_its_ttl(
    make_node: Callable[[], Node],
) -> None:
    """A transfer nobody seizes is released when its ttl passes (on the next operation)."""
    n = make_node()
    n.reserve("acme", 4)
    tid = n.transfer("acme", 4, ttl=5)
    n.now += 6
    n.renew("A")
    assert n.counts() == {}
    with pytest.raises(NotFoundError):
        n.seize(tid)


def test_dead_server_holds_are_freed_by_the_next_operation(
    make_node: Callable[[], Node],
) -> None:
    """When server A stops renewing, B's next call frees A's copies; A then learns it lost."""
    n = make_node()
    n.reserve("acme", 4, server="A")
    n.reserve("trial-1", 2, server="B")
    n.now += LEASE / 1000 / 2
    n.renew("B")
    n.now += LEASE / 1000 / 2 + 1
    assert n.reserve("acme", 1, server="B") == 1
    assert n.counts() == {"d:trial-1": 2, "g:probation": 2, "d:acme": 1, "g:vip": 1,
                          "g:wide": 3, "all": 3}  # fmt: skip
    with pytest.raises(LeaseLostError):
        n.release("acme", 4, server="A")


ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["reserve", "release", "transfer", "seize", "tick", "renew", "ereserve", "erelease"]
        ),
        st.sampled_from(["acme", "new-co", "trial-9", "solo"]),
        st.integers(1, 6),
        st.sampled_from(["A", "B"]),
    ),
    max_size=40,
)


def _replay(node: Node, steps: list[tuple[str, str, int, str]]) -> list[object]:
    seen: list[object] = []
    transfers: list[str] = []
    for op, tenant, n, server in steps:
        try:
            if op == "reserve":
                seen.append(node.reserve(tenant, n, min_copies=1, server=server))
            elif op == "release":
                node.release(tenant, n, server=server)
                seen.append("released")
            elif op == "transfer":
                transfers.append(node.transfer(tenant, n, ttl=n, server=server))
                seen.append("staged")
            elif op == "seize" and transfers:
                seen.append(node.seize(transfers[n % len(transfers)], server=server).copies)
            elif op == "ereserve":
                seen.append(("envoy", node.ereserve(tenant, n)))
            elif op == "erelease":
                seen.append(("released", node.erelease(tenant, n)))
            elif op == "tick":
                node.now += n * 1.5
                seen.append("tick")
            else:
                node.renew(server)
                seen.append("renewed")
        except (HoldError, NotFoundError, LeaseLostError) as exc:
            seen.append(type(exc).__name__)
        counts = node.counts()
        assert all(v > 0 for v in counts.values())
        assert counts.get("all", 0) <= (POLICY.global_limit or 10**9)
        seen.append(counts)
    return seen


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=ops)
def test_random_operations_agree_and_keep_counts_in_bounds(
    redis_server: RedisProcess, steps: list[tuple[str, str, int, str]]
) -> None:
    """Random interleavings across two servers: same answers and counts on both backends."""
    memory = Node(MemoryBackend(ManualClock(0.0)))
    backend = redis_backend(redis_server.url, timeout=5.0, server_time=False)
    remote = Node(backend, redis_server.port)
    try:
        assert _replay(memory, steps) == _replay(remote, steps)
    finally:
        memory.close()
        remote.close()
