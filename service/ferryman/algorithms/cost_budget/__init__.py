"""Cost budgets: cost units per window (an LLM's tokens, bytes, rows), an estimate reserved
when a request starts and the actual cost charged when its stream ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from yaml.nodes import Node

from ferryman.algorithms.cost_budget.limiter import (
    BudgetLimiter,
    budget_op,
    tenant_key,
)
from ferryman.algorithms.cost_budget.model import RESERVE, BudgetStore
from ferryman.algorithms.cost_budget.spec import KIND, SETTLE, CostBudget, read_cost_budget
from ferryman.core.algorithm import AlgorithmBase, Rate, StoreOptions, Target
from ferryman.core.answers import EngineOptions
from ferryman.core.nodes import Ctx
from ferryman.core.rules import Rule
from ferryman.stats import Stats

__all__ = ["COST_BUDGET", "SETTLE", "CostBudget", "CostBudgetAlgorithm"]


class CostBudgetAlgorithm(AlgorithmBase):
    """``cost_budget`` on a descriptor node."""

    name = KIND
    keys = (KIND,)
    stats = MappingProxyType(
        {
            "reserved_cost": "Cost units reserved by request-time estimates.",
            "settlements": "Settlements applied (the actual cost charged at stream end).",
            "settled_cost": "Cost units charged by settlements.",
            "duplicate_settlements": "Settlements of a request already settled (ignored).",
            "foreign_settlements": (
                "Settlements of a reservation another identity made, by one not allowed to "
                "settle for it (ignored, answered OVER_LIMIT)."
            ),
            "foreign_reservations": (
                "Reservations of a request id another identity holds open (refused)."
            ),
            "capped_settlements": "Settlements whose cost passed max_cost (charged max_cost).",
            "excess_cost": "Cost units above max_cost, counted and not charged.",
            "refunds": "Settlements that cost less than their reservation.",
            "refunded_cost": "Cost units reserved and given back by settlements.",
            "expired_reservations": (
                "Reservations never settled, charged their estimate when they expired."
            ),
        }
    )

    def parse(self, ctx: Ctx, fields: Mapping[str, Node], path: str) -> CostBudget | None:
        return read_cost_budget(ctx, fields, path)

    def describe(self, limit: CostBudget) -> dict[str, Any]:
        return {
            "kind": KIND,
            "budget": limit.budget,
            "max_debt": limit.max_debt,
            **limit.period.describe(),
            "per": limit.period.text(),
            "settle_key": limit.settle_key,
            "reservation_ttl": limit.reservation_ttl,
            "max_open": limit.max_open,
            "max_cost": limit.most_cost,
        }

    def text(self, described: Mapping[str, Any]) -> str:
        return (
            f"cost budget {described['budget']} per {described['per']} "
            f"(max debt {described['max_debt']}, settled by {described['settle_key']})"
        )

    def rate(self, limit: CostBudget) -> Rate | None:
        return Rate(limit.budget / limit.period.seconds, float(limit.budget))

    def limiter(self, options: EngineOptions, stats: Stats) -> BudgetLimiter:
        return BudgetLimiter(self, options, stats)

    def memory_store(self, options: StoreOptions) -> BudgetStore:
        from ferryman.algorithms.cost_budget.memory import MemoryBudgets

        return MemoryBudgets(options.cap)

    def redis_store(self, connection: Any, options: StoreOptions) -> BudgetStore:
        from ferryman.algorithms.cost_budget.redis import RedisBudgets

        return RedisBudgets(connection, options.server_time)

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        rule = path[-1]
        assert isinstance(rule.limit, CostBudget)
        key = tenant_key(options.cache_key_prefix, rule, entries[: len(path)])
        return Target(key, rule.limit)

    async def peek(self, store: BudgetStore, target: Target, now: float) -> dict[str, Any]:
        budget: CostBudget = target.state
        view = await store.peek(budget_op(target.key, budget, RESERVE, "", 0, now), now)
        return {
            "charged": view.charged,
            "reserved": view.reserved,
            "open_reservations": view.open,
            "remaining": max(0, budget.budget - view.charged - view.reserved),
            "debt": max(0, view.charged - budget.budget),
            "reset_after": budget.period.reset_after(now),
        }

    def now_text(self, fields: Mapping[str, Any]) -> str:
        if "charged" not in fields:
            return ""
        return (
            f"{fields['charged']} charged, {fields['reserved']} reserved by "
            f"{fields['open_reservations']} open requests, {fields['remaining']} left, "
            f"debt {fields['debt']}, window resets in {fields['reset_after']}s"
        )

    async def reset(self, store: BudgetStore, target: Target) -> bool:
        return await store.reset(target.key) > 0


COST_BUDGET = CostBudgetAlgorithm()
