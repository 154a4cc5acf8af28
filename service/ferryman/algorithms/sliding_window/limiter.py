"""Sliding-window counters on descriptor nodes (``sliding_window``): a descriptor's hit, and
its status from the store's answer: the limit per unit, what the sliding window has left,
the end of the current window as the reset."""

from __future__ import annotations

import math
from collections.abc import Awaitable

from ferryman.algorithms.sliding_window.model import SlidingResult, SlidingStore
from ferryman.algorithms.sliding_window.spec import SlidingWindow
from ferryman.core.answers import Code, Status
from ferryman.core.per_tenant import TenantItem, TenantLimiter
from ferryman.core.rules import Rule

__all__ = ["TAG", "SlidingLimiter"]

TAG = "sliding"


class SlidingLimiter(TenantLimiter[SlidingWindow, SlidingResult]):
    """Plans and answers sliding-window descriptors."""

    tag = TAG

    def keep(self, rule: Rule) -> SlidingWindow:
        assert isinstance(rule.limit, SlidingWindow)
        return rule.limit

    def call(
        self, store: SlidingStore, item: TenantItem[SlidingWindow], now: float
    ) -> Awaitable[SlidingResult]:
        window = item.limit
        return store.hit(item.key, window.rate.requests_per_unit, window.micros, item.hits, now)

    def fits(self, reply: SlidingResult) -> bool:
        return reply.allowed

    def status(self, item: TenantItem[SlidingWindow], reply: SlidingResult) -> Status:
        self.count(item, reply.allowed)
        window = item.limit
        limit = window.rate
        left = max(0, math.floor(limit.requests_per_unit - reply.estimate))
        reset = math.ceil(reply.left_us / 1e6)
        code = Code.OK if reply.allowed or item.rule.shadow_mode else Code.OVER_LIMIT
        left = left if reply.allowed else 0
        exact = None if window.period.exact else window.seconds
        return Status(code, limit, left, reset, item.quota, exact)
