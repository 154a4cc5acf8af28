"""``cost_budget`` on a descriptor node: a budget of cost units per window, charged what
each response really cost when its stream ends.

```yaml
- key: user
  cost_budget:
    budget: 100000          # cost units per window
    window: 1h              # or unit: hour, or calendar: {unit: month, time_zone: UTC}
    max_debt: 20000         # how far responses may overdraw before requests are refused
    settle_key: request_id  # the entry that pairs a request with its settlement
    reservation_ttl: 5m     # an estimate never settled is charged when this has passed
    max_open: 10000         # open reservations kept per tenant (the oldest is charged first)
    max_cost: 100000        # what one settlement charges at most (default: the budget)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from yaml.nodes import MappingNode, Node

from ferryman.core.nodes import Ctx, duration, join, mapping, string, whole
from ferryman.core.periods import Period, read_period
from ferryman.core.rules import Unnamed

__all__ = ["KIND", "SETTLE", "CostBudget", "read_cost_budget"]

KIND = "cost_budget"
#: The entry after the settle key's that marks a settlement.
SETTLE = "settle"
_KEYS = frozenset(
    {
        "budget",
        "unit",
        "window",
        "calendar",
        "max_debt",
        "settle_key",
        "reservation_ttl",
        "max_open",
        "max_cost",
    }
)
# Lua numbers are doubles: sums stay exact below 2^53.
_MAX_COST = 2**50
_MAX_TTL = 7 * 86400.0


@dataclass(frozen=True)
class CostBudget(Unnamed):
    """``budget`` cost units per window of ``period``; requests are refused once what is
    charged and reserved would pass ``budget + max_debt``."""

    budget: int
    period: Period
    max_debt: int = 0
    settle_key: str = "request_id"
    reservation_ttl: float = 300.0
    max_open: int = 10000
    max_cost: int = 0  # 0: the budget
    kind: ClassVar[str] = KIND

    @property
    def trailing(self) -> tuple[str, str]:
        """The entries after the node's that this kind reads itself: they pair a request
        with its settlement and never become a tree level, a counter or a stats key."""
        return (self.settle_key, SETTLE)

    @property
    def most_cost(self) -> int:
        """What one settlement charges at most: past it the excess is counted, not charged."""
        return self.max_cost or self.budget

    @property
    def cap(self) -> int:
        """What charged and reserved cost together may reach before requests are refused."""
        return self.budget + self.max_debt


def read_cost_budget(ctx: Ctx, fields: Mapping[str, Node], path: str) -> CostBudget | None:
    """``cost_budget: {budget, unit | window | calendar, max_debt, settle_key,
    reservation_ttl, max_open, max_cost}``."""
    node = fields.get(KIND)
    if node is None:
        return None
    path = join(path, KIND)
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    before = len(ctx.problems)
    period = read_period(ctx, node, own, path)
    budget = whole(ctx, own.get("budget"), join(path, "budget"), 1, _MAX_COST)
    if "budget" not in own:
        ctx.error(node, path, "a cost_budget needs 'budget' (cost units per window)")
    debt = whole(ctx, own.get("max_debt"), join(path, "max_debt"), 0, _MAX_COST)
    settle_key = _settle_key(ctx, own.get("settle_key"), join(path, "settle_key"))
    ttl = duration(ctx, own.get("reservation_ttl"), join(path, "reservation_ttl"))
    if ttl is not None and not 0.001 <= ttl <= _MAX_TTL:
        message = "reservation_ttl is from 1ms to 7 days"
        ctx.error(own["reservation_ttl"], join(path, "reservation_ttl"), message)
    max_open = whole(ctx, own.get("max_open"), join(path, "max_open"), 1, 1_000_000)
    max_cost = whole(ctx, own.get("max_cost"), join(path, "max_cost"), 1, _MAX_COST)
    if len(ctx.problems) > before or budget is None or period is None:
        return None
    return CostBudget(
        budget,
        period,
        debt or 0,
        settle_key,
        300.0 if ttl is None else ttl,
        10000 if max_open is None else max_open,
        max_cost or 0,
    )


def _settle_key(ctx: Ctx, node: Node | None, path: str) -> str:
    if node is None:
        return "request_id"
    key = string(ctx, node, path)
    if not key or key == SETTLE:
        ctx.error(node, path, f"settle_key is a descriptor key other than {SETTLE!r}")
    return key
