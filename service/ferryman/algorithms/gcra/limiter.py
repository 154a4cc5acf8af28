"""GCRA on descriptor nodes (``gcra``): a descriptor's request of its hits, and its status
from the store's answer: ``rate`` per the smallest unit not shorter than ``per`` as the
limit (the burst over the time a full burst takes to come back in the headers), the burst
left as the remaining, the time until the bucket is full again as the reset; and
ferryman.v1's ``Request``, which may wait (a shaper). A node with ``max_wait`` books a
ShouldRateLimit's hits the same way, for a caller that waits on the server."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from ferryman.algorithms.gcra.model import GcraResult, GcraStore
from ferryman.algorithms.gcra.spec import Gcra
from ferryman.core.algorithm import Ask, Granted, Timed
from ferryman.core.answers import Code, Status, unit_for
from ferryman.core.per_tenant import TenantItem, TenantLimiter, first_granted
from ferryman.core.rules import Rule, UnitLimit

__all__ = ["TAG", "GcraLimiter", "reported"]

TAG = "gcra"


def reported(limit: Gcra) -> UnitLimit:
    """The limit as Envoy is told it: ``rate`` per the smallest unit not shorter than
    ``per``."""
    return UnitLimit(limit.rate, unit_for(limit.per), name=limit.name)


class GcraLimiter(TenantLimiter[tuple[Gcra, UnitLimit], GcraResult]):
    """Plans and answers GCRA descriptors (ShouldRateLimit and Limiter.Request); it keeps
    each node's limit with the limit Envoy is told."""

    tag = TAG

    def keep(self, rule: Rule) -> tuple[Gcra, UnitLimit]:
        assert isinstance(rule.limit, Gcra)
        return rule.limit, reported(rule.limit)

    def call(
        self, store: GcraStore, item: TenantItem[tuple[Gcra, UnitLimit]], now: float
    ) -> Awaitable[GcraResult]:
        # A node with max_wait books a hit that fits within the wait (a later arrival
        # waits behind it); the answer is then held until its turn.
        wait_us = math.floor(self.may_wait(item.rule) * 1e6) if item.rule.max_wait else 0
        return store.take(item.key, item.limit[0].params, item.hits, wait_us, now)

    def fits(self, reply: GcraResult) -> bool:
        return reply.allowed

    def waited(self, reply: GcraResult) -> float:
        return reply.wait_us / 1e6

    def status(self, item: TenantItem[tuple[Gcra, UnitLimit]], reply: GcraResult) -> Status:
        self.count(item, reply.allowed, reply.wait_us / 1e6)
        limit, shown_limit = item.limit
        code = Code.OK if reply.allowed or item.rule.shadow_mode else Code.OVER_LIMIT
        shown = reply.remaining if reply.allowed else 0
        reset = math.ceil(reply.full_us / 1e6)
        window = limit.burst * limit.per / limit.rate
        return Status(code, shown_limit, shown, reset, item.quota, window, limit.burst)

    async def request(
        self, store: GcraStore, ask: Ask, now: Callable[[], float], timed: Timed
    ) -> Granted:
        """ferryman.v1's ``Request`` on a GCRA node: ``copies`` hits, else ``min_copies``,
        else none, granted after a wait of at most ``max_wait_millis``. With FAIL_OPEN a
        backend error grants them all (counted)."""
        rule = ask.path[-1]
        limit = rule.limit
        assert isinstance(limit, Gcra)
        key = self.key(rule, ask.entries)
        wait_us = max(0, ask.max_wait_millis) * 1000
        if rule.max_wait:  # the node's own bound on every wait it gives
            wait_us = min(wait_us, math.floor(rule.max_wait * 1e6))

        def take(n: int) -> Awaitable[GcraResult]:
            return timed(1, store.take(key, limit.params, n, wait_us, now()))

        decided = await first_granted(self, ask, take)
        if decided is None:
            return Granted(ask.copies, {"tokens_remaining": limit.burst}, {})
        granted, result = decided
        self.count(self.asked(ask, key), granted > 0, result.wait_us / 1e6)
        return _granted(granted, result)


def _granted(granted: int, result: GcraResult) -> Granted:
    durations: dict[str, float] = {}
    if granted and result.wait_us > 0:
        durations["wait"] = result.wait_us / 1e6
    if not granted and result.retry_us >= 0:  # -1: more than the burst never passes
        durations["retry_after"] = result.retry_us / 1e6
    return Granted(granted, {"tokens_remaining": result.remaining}, durations)
