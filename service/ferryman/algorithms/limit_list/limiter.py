"""Nodes with several limits on the request path: one store call per descriptor that
decides every limit at once, and the status of the limit closest to refusing."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.limit_list.model import Checked, ListStore, Part
from ferryman.algorithms.limit_list.spec import LimitList, ListedLimit
from ferryman.core.algorithm import Step
from ferryman.core.answers import Code, Status
from ferryman.core.per_tenant import TenantItem, TenantLimiter
from ferryman.core.rules import Rule

__all__ = ["TAG", "ListItem", "ListLimiter"]

TAG = "limits"

Listed = tuple[ListedLimit, ...]


@dataclass(slots=True)
class ListItem(TenantItem[Listed]):
    """One descriptor decided against its node's limits (``limit``, fewer when another
    rule of the request replaces some of them)."""

    def drop(self, replaced: set[str]) -> bool:
        """Leave out the limits ``replaced`` names; whether none is left."""
        self.limit = tuple(i for i in self.limit if not (i.named and i.name in replaced))
        return not self.limit


def parts(items: Sequence[ListedLimit], now: float) -> list[Part]:
    """The store's parts for ``items`` at ``now``: each limit's state is its own field."""
    return [Part(i.name, i.stepper, i.stepper.args(now)) for i in items]


class ListLimiter(TenantLimiter[Listed, Checked]):
    """Plans and answers descriptors that reach a ``rate_limits`` node."""

    tag = TAG
    item = ListItem

    def keep(self, rule: Rule) -> Listed:
        assert isinstance(rule.limit, LimitList)
        return rule.limit.items

    def call(self, store: ListStore, item: TenantItem[Listed], now: float) -> Awaitable[Checked]:
        return store.check(item.key, parts(item.limit, now), item.hits, now)

    def fits(self, reply: Checked) -> bool:
        return reply.fits

    def status(self, item: TenantItem[Listed], reply: Checked) -> Status:
        """Stats counted for the node and each limit; the status of the limit closest to
        refusing (a refusing one first, the one whose reset is furthest)."""
        key, labels, hits = item.stats_key, item.stats_path, item.hits
        self.count(item, reply.fits)
        for listed, step in zip(item.limit, reply.steps, strict=True):
            self.stats.outcome(
                f"{key}.{listed.name}", (*labels, listed.name), hits, step.fits, False
            )
        listed, step = min(
            zip(item.limit, reply.steps, strict=True),
            key=lambda pair: (pair[1].fits, pair[1].remaining, -pair[1].reset_us),
        )
        code = Code.OK if reply.fits or item.rule.shadow_mode else Code.OVER_LIMIT
        each = tuple(
            _part(i, s, reply.fits, item.quota)
            for i, s in zip(item.limit, reply.steps, strict=True)
        )
        shown = _part(listed, step, reply.fits, item.quota)
        shown.code, shown.parts = code, each
        return shown


def _part(listed: ListedLimit, step: Step, fits: bool, quota: bool) -> Status:
    """One limit's status: what it leaves when the request fit, nothing when it did not."""
    code = Code.OK if step.fits else Code.OVER_LIMIT
    remaining = step.remaining if fits else 0
    reset = max(1, math.ceil(step.reset_us / 1e6))
    return Status(code, listed.reported, remaining, reset, quota, listed.stepper.window)


def steps_text(items: Sequence[ListedLimit], steps: Sequence[Step]) -> list[dict[str, Any]]:
    """Each limit's standing, for explain and the console."""
    return [
        {
            "name": listed.name,
            "remaining": step.remaining,
            "reset_after": max(1, math.ceil(step.reset_us / 1e6)),
        }
        for listed, step in zip(items, steps, strict=True)
    ]
