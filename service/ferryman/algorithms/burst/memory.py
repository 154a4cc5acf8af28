"""Burst-tier state in this process: per node a last-second log, per tenant its tiers,
dropped once nothing in them can matter any more."""

from __future__ import annotations

import heapq
import threading

from ferryman.algorithms.burst.model import (
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

__all__ = ["MemoryBursts"]


class MemoryBursts:
    """The burst-tier store of the memory backend; each decision is atomic under one lock."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # node -> (node-wide last-second log, tenant -> (state, when it may be forgotten)).
        self._nodes: dict[str, tuple[HitLog, dict[str, tuple[TenantState, float]]]] = {}
        self._heap: list[tuple[float, str, str]] = []

    @property
    def tenants(self) -> int:
        """How many (node, tenant) burst states are held."""
        return sum(len(tenants) for _, tenants in self._nodes.values())

    async def decide(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        return self.decide_now(request, self._clock.now() if now is None else now)

    def decide_now(self, request: BurstRequest, now: float) -> BurstOutcome:
        """The synchronous core of :meth:`decide`."""
        with self._lock:
            self._sweep(now)
            node = self._nodes.get(request.node)
            if node is None:
                node = self._nodes[request.node] = (HitLog(), {})
            glob, tenants = node
            entry = tenants.get(request.tenant)
            state = entry[0] if entry is not None else TenantState.empty(len(request.policy.tiers))
            outcome, plan = decide(
                request.policy, state, glob, now, request.copies, request.min_copies
            )
            if plan is not None:
                commit(plan, state, glob)
                expires = now + request.policy.horizon
                tenants[request.tenant] = (state, expires)
                if entry is None:
                    # One heap entry per tenant: the sweep moves it on if the tenant was
                    # active since (so the heap tracks tenants, not grants).
                    heapq.heappush(self._heap, (expires, request.node, request.tenant))
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
            return 1

    def _sweep(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, node_key, tenant = heapq.heappop(heap)
            node = self._nodes.get(node_key)
            if node is None:
                continue
            entry = node[1].get(tenant)
            if entry is None:
                continue
            if entry[1] > now:
                heapq.heappush(heap, (entry[1], node_key, tenant))
                continue
            del node[1][tenant]
            if not node[1] and not node[0].total:
                del self._nodes[node_key]

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()
            self._heap.clear()
