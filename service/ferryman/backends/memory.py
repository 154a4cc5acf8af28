"""The embedded default backend: counters in this process, dropped when their window ends."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

from ferryman.backends.base import BurstRequest, CounterOp, CounterResult
from ferryman.backends.copy_ledger import CopyLedger, Seized
from ferryman.clock import Clock, SystemClock
from ferryman.limits.burst import BurstOutcome, HitLog, TenantState, commit, decide
from ferryman.limits.copies import CopyGroup, CopyPolicy, ReserveOutcome

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """Fixed-window counters in a dict, with expiry buckets so memory tracks live windows only.

    All work happens under one lock with no awaits, so each call is atomic for concurrent
    requests whether they come from one event loop or several threads.
    """

    name = "memory"

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._counts: dict[str, tuple[int, int]] = {}  # key -> (count, expires_at)
        self._buckets: dict[int, list[str]] = {}
        self._heap: list[int] = []
        self._lock = threading.Lock()
        # Burst tiers: node -> (node-wide last-second log, tenant -> (state, last grant)).
        self._nodes: dict[str, tuple[HitLog, dict[str, tuple[TenantState, float]]]] = {}
        self._burst_heap: list[tuple[float, str, str]] = []
        self.ledger = CopyLedger()

    def __len__(self) -> int:
        return len(self._counts)

    def _sweep(self, now: float) -> None:
        heap, buckets, counts = self._heap, self._buckets, self._counts
        while heap and heap[0] <= now:
            at = heapq.heappop(heap)
            for key in buckets.pop(at, ()):
                entry = counts.get(key)
                if entry is not None and entry[1] <= now:
                    del counts[key]

    def _current(self, key: str, now: float) -> int:
        entry = self._counts.get(key)
        if entry is None or entry[1] <= now:
            return 0
        return entry[0]

    def _store(self, op: CounterOp, value: int) -> None:
        entry = self._counts.get(op.key)
        if entry is None:
            bucket = self._buckets.get(op.expires_at)
            if bucket is None:
                bucket = self._buckets[op.expires_at] = []
                heapq.heappush(self._heap, op.expires_at)
            bucket.append(op.key)
        self._counts[op.key] = (value, op.expires_at)

    async def fixed_window(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult]:
        return self.apply(ops, stop_when_over=stop_when_over)

    def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        """The synchronous core of :meth:`fixed_window`."""
        with self._lock:
            now = self._clock.now()
            self._sweep(now)
            values: dict[str, int] = {}

            def current(key: str) -> int:
                return values[key] if key in values else self._current(key, now)

            skip: set[int] = set()
            if stop_when_over:
                trial: dict[str, int] = {}
                over: set[int] = set()
                for i, op in enumerate(ops):
                    seen = trial.get(op.key, current(op.key))
                    if op.hits > 0 and seen + op.hits > op.limit:
                        over.add(i)
                    trial[op.key] = max(0, seen + op.hits)
                if over:
                    skip = set(range(len(ops))) - over
            results: list[CounterResult] = []
            for i, op in enumerate(ops):
                before = current(op.key)
                if i in skip or op.hits == 0:
                    results.append(CounterResult(before, 0))
                    continue
                value = max(0, before + op.hits)
                values[op.key] = value
                self._store(op, value)
                results.append(CounterResult(value, value - before))
            return results

    @property
    def transfers_expired(self) -> int:
        return self.ledger.transfers_expired

    @property
    def burst_tenants(self) -> int:
        """How many (node, tenant) burst states are held."""
        return sum(len(tenants) for _, tenants in self._nodes.values())

    async def burst(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        return self.burst_now(request, self._clock.now() if now is None else now)

    def burst_now(self, request: BurstRequest, now: float) -> BurstOutcome:
        """The synchronous core of :meth:`burst`."""
        with self._lock:
            self._sweep_burst(now)
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
                    heapq.heappush(self._burst_heap, (expires, request.node, request.tenant))
            return outcome

    def _sweep_burst(self, now: float) -> None:
        heap = self._burst_heap
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

    def _ms(self, now: float | None) -> int:
        return round((self._clock.now() if now is None else now) * 1000)

    async def reserve(
        self,
        node: str,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        min_copies: int,
        server: str,
        lease_ms: int,
        now: float | None = None,
    ) -> ReserveOutcome:
        with self._lock:
            return self.ledger.reserve(
                node, tenant, policy, groups, copies, min_copies, server, lease_ms, self._ms(now)
            )

    async def release(
        self,
        node: str,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        server: str,
        lease_ms: int,
        now: float | None = None,
    ) -> None:
        with self._lock:
            self.ledger.release(node, tenant, groups, copies, server, lease_ms, self._ms(now))

    async def transfer(
        self,
        node: str,
        tenant: str,
        groups: tuple[str, ...],
        copies: int,
        ttl: float,
        transfer_id: str,
        server: str,
        lease_ms: int,
        now: float | None = None,
    ) -> None:
        with self._lock:
            self.ledger.transfer(
                node, tenant, groups, copies, round(ttl * 1000), transfer_id, server, lease_ms,
                self._ms(now),
            )  # fmt: skip

    async def seize(
        self, node: str, transfer_id: str, server: str, lease_ms: int, now: float | None = None
    ) -> Seized:
        with self._lock:
            return self.ledger.seize(node, transfer_id, server, lease_ms, self._ms(now))

    async def renew(self, node: str, server: str, lease_ms: int, now: float | None = None) -> None:
        with self._lock:
            self.ledger.renew(node, server, lease_ms, self._ms(now))

    async def envoy_reserve(
        self,
        node: str,
        tenant: str,
        policy: CopyPolicy,
        groups: tuple[CopyGroup, ...],
        copies: int,
        hold_id: str,
        server: str,
        now: float | None = None,
    ) -> ReserveOutcome:
        with self._lock:
            return self.ledger.envoy_reserve(
                node, tenant, policy, groups, copies, hold_id, round(policy.hold_ttl * 1000),
                server, self._ms(now),
            )  # fmt: skip

    async def envoy_release(
        self, node: str, tenant: str, copies: int, server: str, now: float | None = None
    ) -> int:
        with self._lock:
            return self.ledger.envoy_release(node, tenant, copies, server, self._ms(now))

    async def start(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        with self._lock:
            self._counts.clear()
            self._buckets.clear()
            self._heap.clear()
            self._nodes.clear()
            self._burst_heap.clear()
