"""One copy-limited node on any store, seen from named servers at controlled times."""

from __future__ import annotations

import uuid

from hypothesis import strategies as st

from ferryman.algorithms.copies.model import CopyGroup, CopyPolicy, CopyStore, Holder, Seized
from ferryman.backends.memory import MemoryBackend
from ferryman.errors import HoldError, LeaseLostError, NotFoundError

from helpers.stores import Store

LEASE = 10_000  # ms

PROBATION = CopyGroup("probation", 5, ("new-co", "trial-*"))
VIP = CopyGroup("vip", 50, ("acme",))
WIDE = CopyGroup("wide", 8, ("*",))
POLICY = CopyPolicy(limit=10, global_limit=12, groups=(PROBATION, VIP, WIDE), hold_ttl=20.0)


class CopyNode:
    """A fresh node named for this test on ``store``, its clock ``now`` moved by the test."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.backend = store.backend
        self.copies: CopyStore = store.backend.store("copies")
        self.node = f"copies{uuid.uuid4().hex[:10]}"
        self.now = 1_700_000_000.0

    def at(self, server: str, lease_ms: int = LEASE) -> Holder:
        """``server`` calling on this node at the test's time."""
        return Holder(self.node, server, lease_ms, self.now)

    def reserve(self, tenant: str, copies: int, min_copies: int = 1, server: str = "A") -> int:
        groups = POLICY.groups_of(tenant)
        out = self.store.run(
            self.copies.reserve(self.at(server), tenant, POLICY, groups, copies, min_copies)
        )
        return out.granted

    def release(
        self, tenant: str, copies: int, groups: tuple[str, ...] | None = None, server: str = "A"
    ) -> None:
        names = tuple(g.name for g in POLICY.groups_of(tenant)) if groups is None else groups
        self.store.run(self.copies.release(self.at(server), tenant, names, copies))

    def transfer(self, tenant: str, copies: int, ttl: float, server: str = "A") -> str:
        names = tuple(g.name for g in POLICY.groups_of(tenant))
        tid = uuid.uuid4().hex
        self.store.run(self.copies.transfer(self.at(server), tenant, names, copies, ttl, tid))
        return tid

    def seize(self, tid: str, server: str = "B") -> Seized:
        return self.store.run(self.copies.seize(self.at(server), tid))

    def ereserve(self, tenant: str, copies: int) -> int:
        groups = POLICY.groups_of(tenant)
        hold = uuid.uuid4().hex
        out = self.store.run(
            self.copies.envoy_reserve(self.at("envoy", 0), tenant, POLICY, groups, copies, hold)
        )
        return out.granted

    def erelease(self, tenant: str, copies: int) -> int:
        return self.store.run(self.copies.envoy_release(self.at("envoy", 0), tenant, copies))

    def renew(self, server: str) -> None:
        self.store.run(self.copies.renew(self.at(server)))

    def counts(self) -> dict[str, int]:
        """What the node counts: per tenant (d:), per group (g:) and in all."""
        if isinstance(self.backend, MemoryBackend):
            counts: dict[str, int] = self.copies.counts(self.node)  # type: ignore[attr-defined]
            return counts
        with self.store.redis() as client:
            raw = client.hgetall("{" + self.node + "}:n")
        return {k.decode(): int(v) for k, v in raw.items()}


# (operation, tenant, copies or seconds, server)
Step = tuple[str, str, int, str]

copy_steps = st.lists(
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


def replay_copies(node: CopyNode, steps: list[Step]) -> list[object]:
    """Every step on ``node``: what each answered and the counts after it, kept in bounds."""
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
