"""Nodes with several limits on the request path: one store call per descriptor that
decides every limit at once, and the status of the limit closest to refusing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.limit_list.model import Checked, ListStore, Part
from ferryman.algorithms.limit_list.spec import LimitList, ListedLimit
from ferryman.core.algorithm import Algorithm, Call, Step
from ferryman.core.answers import Code, EngineOptions, Status, Tally
from ferryman.core.keys import stats_key, tenant_key
from ferryman.core.rules import Rule
from ferryman.stats import Stats

__all__ = ["ListItem", "ListLimiter", "ListRule", "node_key"]


def node_key(prefix: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> str:
    """One tenant's limits (the request's values): one hash, its own hash tag."""
    return tenant_key(prefix, "limits", rule, entries)


@dataclass(frozen=True, slots=True)
class ListRule:
    rule: Rule
    limits: LimitList
    path: tuple[Rule, ...]
    quota: bool


@dataclass(slots=True)
class ListItem:
    """One descriptor decided against its node's limits (``items``, fewer when another
    rule of the request replaces some of them)."""

    index: int
    rule: Rule
    items: tuple[ListedLimit, ...]
    key: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool

    def drop(self, replaced: set[str]) -> bool:
        """Leave out the limits ``replaced`` names; whether none is left."""
        self.items = tuple(i for i in self.items if not (i.named and i.name in replaced))
        return not self.items


def parts(items: Sequence[ListedLimit], now: float) -> list[Part]:
    """The store's parts for ``items`` at ``now``: each limit's state is its own field."""
    return [Part(i.name, i.stepper, i.stepper.args(now)) for i in items]


class ListLimiter:
    """Plans and answers descriptors that reach a ``rate_limits`` node."""

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> ListRule:
        rule = path[-1]
        assert isinstance(rule.limit, LimitList)
        return ListRule(rule, rule.limit, path, quota)

    def plan(
        self,
        prepared: ListRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> ListItem:
        key, labels = stats_key(domain, entries, prepared.path)
        return ListItem(
            index,
            prepared.rule,
            prepared.limits.items,
            node_key(self.opts.cache_key_prefix, prepared.rule, entries),
            key,
            labels,
            max(hits, 0),  # nothing is given back: a negative hit only looks
            prepared.quota,
        )

    def calls(self, store: ListStore, items: Sequence[ListItem], now: float) -> list[Call]:
        return [(1, store.check(i.key, parts(i.items, now), i.hits, now)) for i in items]

    def answer(
        self,
        items: Sequence[ListItem],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for item, checked in zip(items, replies, strict=True):
            status = self.status(item, checked)
            statuses[item.index] = status
            over = status.code is Code.OVER_LIMIT
            tally.add(over, item.quota, None if not checked.fits else item.rule.metadata)

    def status(self, item: ListItem, checked: Checked) -> Status:
        """Stats counted for the node and each limit; the status of the limit closest to
        refusing (a refusing one first, the one whose reset is furthest)."""
        key, labels, hits = item.stats_key, item.stats_path, item.hits
        self.stats.outcome(key, labels, hits, checked.fits, item.rule.shadow_mode)
        for listed, step in zip(item.items, checked.steps, strict=True):
            self.stats.outcome(
                f"{key}.{listed.name}", (*labels, listed.name), hits, step.fits, False
            )
        listed, step = min(
            zip(item.items, checked.steps, strict=True),
            key=lambda pair: (pair[1].fits, pair[1].remaining, -pair[1].reset_us),
        )
        code = Code.OK if checked.fits or item.rule.shadow_mode else Code.OVER_LIMIT
        each = tuple(
            _part(i, s, checked.fits, item.quota)
            for i, s in zip(item.items, checked.steps, strict=True)
        )
        shown = _part(listed, step, checked.fits, item.quota)
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
