"""Cost budgets on descriptor nodes (``cost_budget``): a request-time descriptor reserves
its estimate (its hits) under its settle key's value, the same descriptor with ``settle``
after that entry charges the actual cost when the stream ends. A request's budgets go to
the store in one call, admitted all or none."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ferryman.algorithms.cost_budget.model import (
    RESERVE,
    SETTLE_OP,
    BudgetOp,
    BudgetResult,
    BudgetStore,
)
from ferryman.algorithms.cost_budget.spec import CostBudget
from ferryman.core import keys
from ferryman.core.algorithm import Algorithm, Call
from ferryman.core.answers import ASKER, Code, EngineOptions, Status, Tally
from ferryman.core.keys import stats_key
from ferryman.core.rules import Rule, UnitLimit
from ferryman.stats import Stats

__all__ = ["BudgetItem", "BudgetLimiter", "BudgetRule", "budget_op", "tenant_key"]

log = logging.getLogger("ferryman.cost_budget")

#: Settlements past max_cost are logged at most once per this many seconds, with a count.
CAPPED_LOG_INTERVAL = 10.0

# A shadow-mode budget never refuses in the store (its refusal would undo the request's
# other reservations); whether it would have is worked out from its answer.
_NO_CAP = 2**52


def tenant_key(prefix: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> str:
    """One tenant's budget (the request's values down to the node): its own hash tag."""
    return keys.tenant_key(prefix, "budget", rule, entries)


def budget_op(
    key: str,
    budget: CostBudget,
    mode: str,
    request_id: str,
    amount: int,
    now: float,
    owner: str = "",
    delegate: bool = False,
) -> BudgetOp:
    """The store's operation on the tenant at ``key`` at ``now``, asked by ``owner``."""
    suffix, start, end = budget.period.window(now)
    return BudgetOp(
        key,
        mode,
        request_id,
        amount,
        budget.cap,
        suffix,
        round(start * 1000),
        round(end * 1000),
        round(budget.reservation_ttl * 1000),
        budget.max_open,
        owner,
        delegate,
    )


@dataclass(frozen=True, slots=True)
class BudgetRule:
    rule: Rule
    budget: CostBudget
    path: tuple[Rule, ...]
    quota: bool
    limit: UnitLimit
    exact: float | None  # the window's length for the headers (None: the unit's)


@dataclass(slots=True)
class BudgetItem:
    index: int
    rule: Rule
    prepared: BudgetRule
    op: BudgetOp
    stats_key: str
    stats_path: tuple[str, ...]
    excess: int  # a settlement's cost above max_cost, not charged


class BudgetLimiter:
    """Plans and answers cost-budget descriptors, reservations and settlements."""

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats
        self._capped_at = -CAPPED_LOG_INTERVAL  # when a capped settlement was last logged
        self._capped_since = 0  # capped settlements since that line

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> BudgetRule:
        rule = path[-1]
        budget = rule.limit
        assert isinstance(budget, CostBudget)
        period = budget.period
        limit = UnitLimit(budget.budget, period.unit)
        exact = None if period.exact else period.seconds
        return BudgetRule(rule, budget, path, quota, limit, exact)

    def plan(
        self,
        prepared: BudgetRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> BudgetItem:
        depth = len(prepared.path)
        own, tail = entries[:depth], entries[depth:]
        key, parts = stats_key(domain, own, prepared.path)
        mode = SETTLE_OP if len(tail) > 1 else RESERVE
        rid = tail[0][1] if tail else ""
        amount, excess = max(hits, 0), 0
        most = prepared.budget.most_cost
        if mode == SETTLE_OP and amount > most:
            amount, excess = most, amount - most
        owner, delegate = "", False
        asker = ASKER.get() if rid else None
        if asker is not None:
            owner = asker.key
            delegate = mode == SETTLE_OP and asker.settles_for(domain)
        op = budget_op(
            tenant_key(self.opts.cache_key_prefix, prepared.rule, own),
            prepared.budget,
            mode,
            rid,
            amount,
            now,
            owner,
            delegate,
        )
        if mode == RESERVE and prepared.rule.shadow_mode:
            op = replace(op, cap=_NO_CAP)
        return BudgetItem(index, prepared.rule, prepared, op, key, parts, excess)

    def calls(self, store: BudgetStore, items: Sequence[BudgetItem], now: float) -> list[Call]:
        return [(len(items), store.apply([item.op for item in items], now))]

    def answer(
        self,
        items: Sequence[BudgetItem],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        (results,) = replies
        for item, result in zip(items, results, strict=True):
            over = self._count(item, result)
            status = self.status(item, result, over and not item.rule.shadow_mode, now)
            statuses[item.index] = status
            over = status.code is Code.OVER_LIMIT
            tally.add(over, item.prepared.quota, None if over else item.rule.metadata, item.index)

    def _count(self, item: BudgetItem, result: BudgetResult) -> bool:
        """Count the item's stats; whether its budget refused (or, in shadow mode, would
        have refused) it."""
        stats, key, path = self.stats, item.stats_key, item.stats_path
        stats.rule(key, "expired_reservations", result.expired, path)
        op = item.op
        if op.mode == SETTLE_OP:
            if item.excess:
                self._capped(item)
            if result.applied:
                stats.rule(key, "settlements", 1, path)
                stats.rule(key, "settled_cost", result.cost, path)
                stats.rule(key, "refunds", 1 if result.refund else 0, path)
                stats.rule(key, "refunded_cost", result.refund, path)
            elif result.foreign:
                stats.rule(key, "foreign_settlements", 1, path)
                return True
            elif result.full:  # counted by the memory cap (refused_keys)
                return True
            else:
                stats.rule(key, "duplicate_settlements", 1, path)
            return False
        if result.foreign:
            stats.rule(key, "foreign_reservations", 1, path)
        over = not result.admitted
        if item.rule.shadow_mode:
            over = result.charged + result.reserved > item.prepared.budget.cap
        stats.rule(key, "total_hits", 1, path)
        stats.rule(key, "over_limit" if over else "within_limit", 1, path)
        if over and item.rule.shadow_mode:
            stats.rule(key, "shadow_mode", 1, path)
        stats.rule(key, "reserved_cost", op.amount if result.applied else 0, path)
        return over

    def _capped(self, item: BudgetItem) -> None:
        """Count a settlement cut to max_cost, and log it at a bounded rate."""
        key, path = item.stats_key, item.stats_path
        self.stats.rule(key, "capped_settlements", 1, path)
        self.stats.rule(key, "excess_cost", item.excess, path)
        self._capped_since += 1
        now = time.monotonic()
        if now - self._capped_at < CAPPED_LOG_INTERVAL:
            return
        count, self._capped_since, self._capped_at = self._capped_since, 0, now
        log.warning(
            "%s: a settlement of %d passed max_cost %d; charged %d "
            "(%d such since the last report; logged at most every %gs)",
            key,
            item.op.amount + item.excess,
            item.prepared.budget.most_cost,
            item.op.amount,
            count,
            CAPPED_LOG_INTERVAL,
            extra={"fields": {"rule": key, "excess": item.excess, "count": count}},
        )

    def status(self, item: BudgetItem, result: BudgetResult, over: bool, now: float) -> Status:
        prepared = item.prepared
        budget = prepared.budget
        left = max(0, budget.budget - result.charged - result.reserved)
        return Status(
            Code.OVER_LIMIT if over else Code.OK,
            prepared.limit,
            0 if over else left,
            budget.period.reset_after(now),
            prepared.quota,
            prepared.exact,
        )
