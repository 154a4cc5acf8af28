"""Cost budgets in process memory: the embedded store, and the reference for the Redis
one."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ferryman.algorithms.cost_budget.model import (
    BudgetOp,
    BudgetResult,
    BudgetState,
    BudgetView,
    apply,
    bring_to,
)

__all__ = ["MemoryBudgets"]


class MemoryBudgets:
    """Tenants in least recently used order; an idle one at the front (its window over,
    nothing open or remembered) is dropped. Every call runs without awaiting, hence
    atomically."""

    name = "memory"

    def __init__(self) -> None:
        self._states: OrderedDict[str, BudgetState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    async def apply(self, ops: Sequence[BudgetOp], now: float) -> list[BudgetResult]:
        return self.apply_at(ops, round(now * 1000))

    def apply_at(self, ops: Sequence[BudgetOp], now_ms: int) -> list[BudgetResult]:
        states = self._states
        for _ in range(2):
            if not states:
                break
            first = next(iter(states))
            if not states[first].idle(now_ms):
                break
            del states[first]
        results = apply(states, ops, now_ms)
        for op in ops:
            if op.key in states:
                states.move_to_end(op.key)
        return results

    async def peek(self, op: BudgetOp, now: float) -> BudgetView:
        found = self._states.get(op.key)
        state = BudgetState() if found is None else found.copy()
        bring_to(state, op, round(now * 1000))
        return BudgetView(state.charged, state.reserved, len(state.open))

    async def reset(self, key: str) -> int:
        return 0 if self._states.pop(key, None) is None else 1

    def clear(self) -> None:
        self._states.clear()
