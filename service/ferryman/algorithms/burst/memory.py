"""Burst-tier state in this process: per node a last-second log, per tenant its tiers,
dropped once nothing in them can matter any more.

Tenants count against the memory backend's cap (``MEMORY_MAX_KEYS``, shared with every
kind: ``core.memory_cap``). A new tenant that would pass it first makes room: tenants
whose every tier is inactive and whose last second is empty go (they are as good as new),
least recently granted first; a tenant in a tier, in cooldown or at its hard limit is
never forgotten, since that would let it in again. With no room, the new tenant's request
is refused (nothing granted) and leaves no state.
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import replace

from ferryman.algorithms.burst.model import (
    INACTIVE,
    BurstOutcome,
    BurstPolicy,
    BurstRequest,
    HitLog,
    TenantState,
    TenantView,
    commit,
    decide,
    view,
)
from ferryman.clock import Clock
from ferryman.core.memory_cap import SCAN_PAST, MemoryCap

__all__ = ["MemoryBursts"]

# (state, when it may be forgotten, its policy, its serial: which heap entry is its own).
_Entry = tuple[TenantState, float, BurstPolicy, int]


def _idle(entry: _Entry, now: float) -> bool:
    """Whether a tenant is as good as new at ``now``: no tier active or cooling down, and
    nothing in its last second."""
    state, _, policy, _ = entry
    tiers = zip(policy.tiers, state.entered, strict=False)  # a reload may change their number
    if any(t.phase(e, now) != INACTIVE for t, e in tiers):
        return False
    return all(when <= now - 1.0 for when, _ in state.second.items())


class MemoryBursts:
    """The burst-tier store of the memory backend; each decision is atomic under one lock."""

    def __init__(self, clock: Clock, cap: MemoryCap | None = None) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # node -> (node-wide last-second log, tenant -> entry); each node's tenants least
        # recently granted first.
        self._nodes: dict[str, tuple[HitLog, dict[str, _Entry]]] = {}
        self._heap: list[tuple[float, int, str, str]] = []
        self._count = 0
        self._serial = 0
        self._now = 0.0  # the last decision's time, for making room between decisions
        self.cap = MemoryCap() if cap is None else cap
        self.cap.join("burst", self)

    @property
    def tenants(self) -> int:
        """How many (node, tenant) burst states are held."""
        return self._count

    def __len__(self) -> int:
        return self._count

    def make_room(self, want: int) -> int:
        with self._lock:
            return self._make_room(want)

    def _make_room(self, want: int) -> int:
        """Forget up to ``want`` tenants as good as new, least recently granted first (the
        oldest few only: those further in were granted later and are no nearer idle)."""
        now, gone, budget = self._now, 0, SCAN_PAST
        for _, tenants in self._nodes.values():
            names: list[str] = []
            for name, entry in tenants.items():
                if gone + len(names) >= want or budget < 0:
                    break
                if _idle(entry, now):
                    names.append(name)
                else:
                    budget -= 1
            for name in names:
                del tenants[name]
            gone += len(names)
            if gone >= want:
                break
        self._count -= gone
        return gone

    async def decide(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        return self.decide_now(request, self._clock.now() if now is None else now)

    def decide_now(self, request: BurstRequest, now: float) -> BurstOutcome:
        """The synchronous core of :meth:`decide`."""
        with self._lock:
            self._sweep(now)
            self._now = now
            node = self._nodes.get(request.node)
            if node is None:
                node = self._nodes[request.node] = (HitLog(), {})
            glob, tenants = node
            entry = tenants.pop(request.tenant, None)  # back in last: most recently used
            state = entry[0] if entry is not None else TenantState.empty(len(request.policy.tiers))
            if entry is not None:
                tenants[request.tenant] = entry
            outcome, plan = decide(
                request.policy, state, glob, now, request.copies, request.min_copies
            )
            if plan is not None:
                new = entry is None and self.cap.max_keys
                if new and not self.cap.admit(self, 1, self._make_room):
                    return replace(outcome, granted=0, burst=False)  # no room
                commit(plan, state, glob)
                expires = now + request.policy.horizon
                if entry is None:
                    self._count += 1
                    self._serial += 1
                    # One heap entry per tenant: the sweep moves it on if the tenant was
                    # active since (so the heap tracks tenants, not grants); one left by a
                    # tenant since forgotten is not its successor's.
                    serial = self._serial
                    heapq.heappush(self._heap, (expires, serial, request.node, request.tenant))
                else:
                    serial = entry[3]
                tenants[request.tenant] = (state, expires, request.policy, serial)
            return outcome

    async def peek(
        self, node: str, tenant: str, policy: BurstPolicy, now: float | None = None
    ) -> TenantView:
        now = self._clock.now() if now is None else now
        with self._lock:
            held = self._nodes.get(node)
            entry = held[1].get(tenant) if held is not None else None
            if entry is None:
                return view(policy, [], [], (), now)
            state = entry[0]
            logs = [list(log.items()) for log in state.logs]
            return view(policy, list(state.entered), logs, list(state.second.items()), now)

    async def reset(self, node: str, tenant: str, tiers: int) -> int:
        with self._lock:
            held = self._nodes.get(node)
            if held is None or held[1].pop(tenant, None) is None:
                return 0
            self._count -= 1
            return 1

    def _sweep(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, serial, node_key, tenant = heapq.heappop(heap)
            node = self._nodes.get(node_key)
            if node is None:
                continue
            entry = node[1].get(tenant)
            if entry is None or entry[3] != serial:
                continue
            if entry[1] > now:
                heapq.heappush(heap, (entry[1], serial, node_key, tenant))
                continue
            del node[1][tenant]
            self._count -= 1
            if not node[1] and not node[0].total:
                del self._nodes[node_key]

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()
            self._heap.clear()
            self._count = 0
