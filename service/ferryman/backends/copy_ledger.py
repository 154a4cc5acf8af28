"""The memory backend's copy log: held copies per node, the twin of lua/copies.lua.

Counts per node ("d:<tenant>", "g:<group>", "all"), each server's contribution to them, the
servers' lease expiries, and staged transfers. Every operation first takes back what servers
with lapsed leases held and what transfers nobody seized in time still hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ferryman.errors import HoldError, LeaseLostError, NotFoundError
from ferryman.limits.copies import CopyGroup, CopyPolicy, ReserveOutcome

__all__ = ["CopyLedger", "Seized"]


@dataclass(frozen=True, slots=True)
class Seized:
    """What a seize claimed: enough to hold the copies as if they had been reserved."""

    node: str
    tenant: str
    copies: int
    groups: tuple[str, ...]


@dataclass
class _Transfer:
    tenant: str
    copies: int
    groups: tuple[str, ...]
    expires_ms: int


@dataclass
class _Node:
    counts: dict[str, int] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    contributions: dict[str, dict[str, int]] = field(default_factory=dict)
    transfers: dict[str, _Transfer] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)  # lapsed server -> when (kept a day)


def _fields(tenant: str, groups: tuple[str, ...]) -> list[str]:
    return [f"d:{tenant}", "all", *(f"g:{g}" for g in groups)]


class CopyLedger:
    """Held copies of every copy-limited node, kept in this process."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}

    def _node(self, node: str, server: str, lease_ms: int, now_ms: int) -> _Node:
        """The node, cleared of lapsed leases and expired transfers, with our lease renewed."""
        state = self._nodes.setdefault(node, _Node())
        lost = False
        for sid, expiry in list(state.leases.items()):
            if expiry < now_ms:
                self._forget(state, sid)
                del state.leases[sid]
                state.dead[sid] = now_ms
                lost = lost or sid == server
        for sid, when in list(state.dead.items()):
            if when < now_ms - 86_400_000:
                del state.dead[sid]
        if lost or server in state.dead:
            raise LeaseLostError(f"the lease of server {server} lapsed; its holds were freed")
        for tid, transfer in list(state.transfers.items()):
            if transfer.expires_ms < now_ms:
                for f in _fields(transfer.tenant, transfer.groups):
                    self._add(state.counts, f, -transfer.copies)
                del state.transfers[tid]
        state.leases[server] = now_ms + lease_ms
        return state

    @staticmethod
    def _add(table: dict[str, int], key: str, delta: int) -> None:
        value = table.get(key, 0) + delta
        if value <= 0:
            table.pop(key, None)
        else:
            table[key] = value

    def _forget(self, state: _Node, server: str) -> None:
        for f, n in state.contributions.pop(server, {}).items():
            self._add(state.counts, f, -n)

    def reserve(
        self,
        node: str,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        min_copies: int,
        server: str,
        lease_ms: int,
        now_ms: int,
    ) -> ReserveOutcome:
        state = self._node(node, server, lease_ms, now_ms)
        counts = state.counts
        room = copies
        if policy.limit is not None:
            room = min(room, policy.limit - counts.get(f"d:{tenant}", 0))
        for group in groups:
            room = min(room, group.limit - counts.get(f"g:{group.name}", 0))
        if policy.global_limit is not None:
            room = min(room, policy.global_limit - counts.get("all", 0))
        granted = room if room >= max(min_copies, 1) else 0
        if granted:
            mine = state.contributions.setdefault(server, {})
            for f in _fields(tenant, tuple(g.name for g in groups)):
                self._add(counts, f, granted)
                self._add(mine, f, granted)
        return ReserveOutcome(
            granted,
            counts.get(f"d:{tenant}", 0),
            counts.get("all", 0),
            {g.name: counts.get(f"g:{g.name}", 0) for g in groups},
        )

    def _take(
        self, state: _Node, server: str, tenant: str, groups: tuple[str, ...], n: int
    ) -> None:
        mine = state.contributions.get(server, {})
        for f in _fields(tenant, groups):
            if mine.get(f, 0) < n:
                raise HoldError(
                    "copies", f"{n} is more than this server holds for {f[2:] or 'all'}"
                )
        for f in _fields(tenant, groups):
            self._add(mine, f, -n)

    def release(
        self,
        node: str,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        server: str,
        lease_ms: int,
        now_ms: int,
    ) -> None:
        state = self._node(node, server, lease_ms, now_ms)
        self._take(state, server, tenant, groups, copies)
        for f in _fields(tenant, groups):
            self._add(state.counts, f, -copies)

    def transfer(
        self,
        node: str,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        ttl_ms: int,
        transfer_id: str,
        server: str,
        lease_ms: int,
        now_ms: int,
    ) -> None:
        state = self._node(node, server, lease_ms, now_ms)
        self._take(state, server, tenant, groups, copies)
        state.transfers[transfer_id] = _Transfer(tenant, copies, groups, now_ms + ttl_ms)

    def seize(self, node: str, transfer_id: str, server: str, lease_ms: int, now_ms: int) -> Seized:
        state = self._node(node, server, lease_ms, now_ms)
        transfer = state.transfers.pop(transfer_id, None)
        if transfer is None:
            raise NotFoundError("transfer_id", "unknown or expired transfer")
        mine = state.contributions.setdefault(server, {})
        for f in _fields(transfer.tenant, transfer.groups):
            self._add(mine, f, transfer.copies)
        return Seized(node, transfer.tenant, transfer.copies, transfer.groups)

    def renew(self, node: str, server: str, lease_ms: int, now_ms: int) -> None:
        self._node(node, server, lease_ms, now_ms)

    def counts(self, node: str) -> dict[str, int]:
        """A copy of a node's counts (for status pages and tests)."""
        state = self._nodes.get(node)
        return dict(state.counts) if state is not None else {}
