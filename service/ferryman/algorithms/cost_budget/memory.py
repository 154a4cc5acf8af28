"""Cost budgets in process memory: the embedded store, and the reference for the Redis
one."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ferryman.algorithms.cost_budget.model import (
    RESERVE,
    BudgetOp,
    BudgetResult,
    BudgetState,
    BudgetView,
    apply,
    bring_to,
)
from ferryman.core.memory_cap import MemoryCap

__all__ = ["MemoryBudgets"]


class MemoryBudgets:
    """Tenants in least recently used order; an idle one at the front (its window over,
    nothing open or remembered) is dropped. Every call runs without awaiting, hence
    atomically.

    A tenant, each of its open reservations and each id it remembers is one entry against
    the memory backend's cap. To make room, tenants are taken from the front: their open
    reservations are charged their estimate and dropped, their remembered ids forgotten,
    and the tenant itself forgotten unless it is spent (forgetting it would let its caller
    in again). A call that would add entries when no room can be made changes nothing and
    is refused (``full``)."""

    name = "memory"

    def __init__(self, cap: MemoryCap | None = None) -> None:
        self._states: OrderedDict[str, BudgetState] = OrderedDict()
        self._entries = 0
        self._now_ms = 0  # the last call's time, for making room between calls
        self.cap = MemoryCap() if cap is None else cap
        self.cap.join("cost_budget", self)

    def __len__(self) -> int:
        return self._entries

    @property
    def tenants(self) -> int:
        return len(self._states)

    async def apply(self, ops: Sequence[BudgetOp], now: float) -> list[BudgetResult]:
        return self.apply_at(ops, round(now * 1000))

    def apply_at(self, ops: Sequence[BudgetOp], now_ms: int) -> list[BudgetResult]:
        states = self._states
        self._now_ms = now_ms
        for _ in range(2):
            if not states:
                break
            first = next(iter(states))
            if not states[first].idle(now_ms):
                break
            self._entries -= states.pop(first).size
        if self.cap.max_keys:
            need = self._growth(ops)
            if need and not self.cap.admit(self, need):
                return [self._full(op) for op in ops]
        before = {}
        for op in ops:
            state = states.get(op.key)
            before[op.key] = 0 if state is None else 1 + len(state.open) + len(state.settled)
        results = apply(states, ops, now_ms)
        for key, size in before.items():
            state = states[key]
            self._entries += 1 + len(state.open) + len(state.settled) - size
            states.move_to_end(key)
        return results

    def _growth(self, ops: Sequence[BudgetOp]) -> int:
        """At most how many entries ``ops`` add: new tenants, and ids neither open nor
        remembered (a settlement of an open reservation moves its entry)."""
        states = self._states
        need = len({op.key for op in ops if op.key not in states})
        for op in ops:
            state = states.get(op.key)
            rid = op.request_id
            if not rid or (op.mode == RESERVE and op.amount <= 0):
                continue
            if state is None:
                need += 1
            elif rid not in state.open:
                need += op.mode == RESERVE or rid not in state.settled
        return need

    def _full(self, op: BudgetOp) -> BudgetResult:
        state = self._states.get(op.key)
        if state is None:
            return BudgetResult(False, False, 0, 0, 0, full=True)
        return BudgetResult(False, False, state.charged, state.reserved, len(state.open), full=True)

    def make_room(self, want: int) -> int:
        """Free up to ``want`` entries from the least recently used tenants."""
        states, now_ms = self._states, self._now_ms
        freed, gone = 0, []
        for key, state in states.items():
            if freed >= want:
                break
            freed += state.shed()
            if not state.spent(now_ms):
                gone.append(key)
                freed += 1
        for key in gone:
            del states[key]
        self._entries -= freed
        return freed

    async def peek(self, op: BudgetOp, now: float) -> BudgetView:
        found = self._states.get(op.key)
        state = BudgetState() if found is None else found.copy()
        bring_to(state, op, round(now * 1000))
        return BudgetView(state.charged, state.reserved, len(state.open))

    async def reset(self, key: str) -> int:
        found = self._states.pop(key, None)
        if found is None:
            return 0
        self._entries -= found.size
        return 1

    def clear(self) -> None:
        self._states.clear()
        self._entries = 0
