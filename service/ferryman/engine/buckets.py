"""Token buckets on descriptor nodes (``token_bucket``): a descriptor's take, and its
status from the store's answer: the fill rate as the limit (the size over the time to fill
it in the headers), the whole tokens left as the remaining, the time to the next token as
the reset."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferryman.algorithms.token_bucket.model import BucketSpec, NodeTake
from ferryman.algorithms.token_bucket.model import Status as TakeStatus
from ferryman.config.model import UNIT_SECONDS, RateLimit, Rule
from ferryman.engine.model import Code, EngineOptions, Status, Tally
from ferryman.engine.policy import BucketNode
from ferryman.stats import Stats

__all__ = ["BucketItem", "BucketLimiter", "sustained"]


def sustained(spec: BucketSpec, name: str = "") -> RateLimit:
    """The bucket's long-run rate as Envoy's ``current_limit``: the fill rate in the
    shortest unit that holds at least one whole token (2/s: 2 per second; 0.5/s: 30 per
    minute). The headers give the burst: the size over the time to fill it."""
    units = sorted(UNIT_SECONDS, key=UNIT_SECONDS.__getitem__)
    for unit in units:
        per_unit = spec.fill_rate * UNIT_SECONDS[unit]
        if per_unit >= 1:
            return RateLimit(min(math.floor(per_unit), 2**32 - 1), unit, name=name)
    return RateLimit(1, units[-1], name=name)


@dataclass(slots=True)
class BucketItem:
    index: int
    rule: Rule
    spec: BucketSpec
    key: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool
    max_wait_millis: int = 0


class BucketLimiter:
    """Plans and answers token-bucket descriptors."""

    def __init__(self, opts: EngineOptions, stats: Stats) -> None:
        self.opts = opts
        self.stats = stats

    @staticmethod
    def key(policy: BucketNode, entries: Sequence[tuple[str, str]]) -> str:
        """The bucket of one tenant (the request's values) of the node: one key, whose hash
        tag is the whole name."""
        return f"{policy.key}|{'_'.join(v for _, v in entries)}}}"

    @staticmethod
    def wait_allowed(spec: BucketSpec, asked_millis: int) -> int:
        """The wait a caller gets at most: what it asks, bounded by the node's timeout."""
        return max(0, min(asked_millis, spec.wait_timeout_millis))

    def count(self, item: BucketItem, granted: bool, waited: bool) -> None:
        stats, key, labels, hits = self.stats, item.stats_key, item.stats_path, item.hits
        stats.rule(key, "total_hits", hits, labels)
        if granted:
            stats.rule(key, "within_limit", hits, labels)
            if waited:
                stats.rule(key, "served_with_wait", hits, labels)
        else:
            stats.rule(key, "over_limit", hits, labels)
            if item.rule.shadow_mode:
                stats.rule(key, "shadow_mode", hits, labels)

    def answer(
        self,
        items: Sequence[BucketItem],
        takes: Sequence[NodeTake],
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for item, take in zip(items, takes, strict=True):
            status = self.status(item, take)
            statuses[item.index] = status
            over = take.status is not TakeStatus.OK
            tally.add(
                status.code is Code.OVER_LIMIT, item.quota, None if over else item.rule.metadata
            )

    def status(self, item: BucketItem, take: NodeTake) -> Status:
        """The Envoy view of a bucket decision (counted in stats)."""
        granted = take.status is TakeStatus.OK
        self.count(item, granted, take.wait_millis > 0)
        spec = item.spec
        window = spec.size / spec.fill_rate
        limit = sustained(spec, item.rule.name)
        remaining = max(0, math.floor(take.stored))
        reset = math.ceil(take.next_token(spec))
        code = Code.OK if granted or item.rule.shadow_mode else Code.OVER_LIMIT
        shown = remaining if granted else 0
        return Status(code, limit, shown, reset, item.quota, window, spec.size)
