"""Token buckets on descriptor nodes (``token_bucket``): a descriptor's take, and its
status from the store's answer: the fill rate as the limit (the size over the time to fill
it in the headers), the whole tokens left as the remaining, the time to the next token as
the reset; and ferryman.v1's ``Request`` on a bucket node, which may wait."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from ferryman.algorithms.token_bucket.model import BucketSpec, NodeBucketStore, NodeTake, TakeStatus
from ferryman.algorithms.token_bucket.spec import NodeBucket
from ferryman.core.algorithm import Ask, Granted, Timed
from ferryman.core.answers import Code, Status
from ferryman.core.per_tenant import TenantItem, TenantLimiter, first_granted
from ferryman.core.rules import UNIT_SECONDS, Rule, UnitLimit

__all__ = ["TAG", "BucketLimiter", "sustained", "wait_allowed"]

TAG = "bucket"


def sustained(spec: BucketSpec, name: str = "") -> UnitLimit:
    """The bucket's long-run rate as Envoy's ``current_limit``: the fill rate in the
    shortest unit that holds at least one whole token (2/s: 2 per second; 0.5/s: 30 per
    minute). The headers give the burst: the size over the time to fill it."""
    units = sorted(UNIT_SECONDS, key=UNIT_SECONDS.__getitem__)
    for unit in units:
        per_unit = spec.fill_rate * UNIT_SECONDS[unit]
        if per_unit >= 1:
            return UnitLimit(min(math.floor(per_unit), 2**32 - 1), unit, name=name)
    return UnitLimit(1, units[-1], name=name)


def wait_allowed(spec: BucketSpec, asked_millis: int, max_wait: float = 0.0) -> int:
    """The wait a ferryman.v1 caller gets at most: what it asks, bounded by the node's
    wait_timeout_millis and by its max_wait (seconds; 0: none)."""
    allowed = min(asked_millis, spec.wait_timeout_millis)
    if max_wait:
        allowed = min(allowed, math.floor(max_wait * 1000))
    return max(0, allowed)


class BucketLimiter(TenantLimiter[BucketSpec, NodeTake]):
    """Plans and answers token-bucket descriptors."""

    tag = TAG

    def keep(self, rule: Rule) -> BucketSpec:
        assert isinstance(rule.limit, NodeBucket)
        return rule.limit.spec

    def call(
        self, store: NodeBucketStore, item: TenantItem[BucketSpec], now: float
    ) -> Awaitable[NodeTake]:
        # A node with max_wait lets a hit wait out the debt earlier hits left, up to it
        # (the node's wait_timeout_millis bounds ferryman.v1's callers only).
        wait_ms = math.floor(self.may_wait(item.rule) * 1000) if item.rule.max_wait else 0
        return store.take(item.key, item.limit, item.hits, wait_ms, now)

    def fits(self, reply: NodeTake) -> bool:
        return reply.status is TakeStatus.OK

    def waited(self, reply: NodeTake) -> float:
        return reply.wait_millis / 1000

    def status(self, item: TenantItem[BucketSpec], reply: NodeTake) -> Status:
        """The Envoy view of a bucket decision (counted in stats)."""
        granted = reply.status is TakeStatus.OK
        self.count(item, granted, reply.wait_millis / 1000)
        spec = item.limit
        window = spec.size / spec.fill_rate
        limit = sustained(spec, item.rule.name)
        remaining = max(0, math.floor(reply.stored))
        reset = math.ceil(reply.next_token(spec))
        code = Code.OK if granted or item.rule.shadow_mode else Code.OVER_LIMIT
        shown = remaining if granted else 0
        return Status(code, limit, shown, reset, item.quota, window, spec.size)

    async def request(
        self, store: NodeBucketStore, ask: Ask, now: Callable[[], float], timed: Timed
    ) -> Granted:
        """ferryman.v1's ``Request`` on a bucket node: ``copies`` tokens, else
        ``min_copies``, else none, granted after a wait of at most ``max_wait_millis`` (and
        the node's wait_timeout_millis)."""
        rule = ask.path[-1]
        spec = self.keep(rule)
        key = self.key(rule, ask.entries)
        wait = wait_allowed(spec, ask.max_wait_millis, rule.max_wait)

        def take(n: int) -> Awaitable[NodeTake]:
            return timed(1, store.take(key, spec, n, wait, now()))

        decided = await first_granted(self, ask, take)
        if decided is None:
            return Granted(ask.copies, {"tokens_remaining": spec.size}, {})
        granted, reply = decided
        self.count(self.asked(ask, key), granted > 0, reply.wait_millis / 1000)
        return _granted(spec, ask, granted, reply)


def _granted(spec: BucketSpec, ask: Ask, granted: int, take: NodeTake) -> Granted:
    durations: dict[str, float] = {}
    if granted and take.wait_millis > 0:
        durations["wait"] = take.wait_millis / 1000
    # Hits beyond the size and the debt allowed never pass: no retry_after for them.
    if not granted and ask.min_copies <= spec.size + spec.max_debt_millis * spec.fill_rate / 1e3:
        durations["retry_after"] = take.next_token(spec)
    return Granted(granted, {"tokens_remaining": max(0, math.floor(take.stored))}, durations)
