"""Token buckets on descriptor nodes (``token_bucket``): a descriptor's take, and its
status from the store's answer: the fill rate as the limit (the size over the time to fill
it in the headers), the whole tokens left as the remaining, the time to the next token as
the reset; and ferryman.v1's ``Request`` on a bucket node, which may wait."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.token_bucket.model import BucketSpec, NodeBucketStore, NodeTake, TakeStatus
from ferryman.algorithms.token_bucket.spec import NodeBucket
from ferryman.core.algorithm import Algorithm, Ask, Call, Granted, Timed
from ferryman.core.answers import Code, EngineOptions, Status, Tally
from ferryman.core.keys import stats_key, tenant_key
from ferryman.core.rules import UNIT_SECONDS, Rule, UnitLimit
from ferryman.errors import BackendError
from ferryman.stats import REQUEST_CALL, Stats

__all__ = ["BucketItem", "BucketLimiter", "BucketRule", "bucket_key", "sustained"]


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


def bucket_key(prefix: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> str:
    """The bucket of one tenant (the request's values) of a node: one key, whose hash tag
    is the whole name."""
    return tenant_key(prefix, "bucket", rule, entries)


@dataclass(frozen=True, slots=True)
class BucketRule:
    rule: Rule
    spec: BucketSpec
    path: tuple[Rule, ...]
    quota: bool


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

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> BucketRule:
        rule = path[-1]
        assert isinstance(rule.limit, NodeBucket)
        return BucketRule(rule, rule.limit.spec, path, quota)

    def plan(
        self,
        prepared: BucketRule,
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> BucketItem:
        key, parts = stats_key(domain, entries, prepared.path)
        return BucketItem(
            index,
            prepared.rule,
            prepared.spec,
            bucket_key(self.opts.cache_key_prefix, prepared.rule, entries),
            key,
            parts,
            max(hits, 0),  # a bucket gives nothing back: a negative hit only looks
            prepared.quota,
        )

    def calls(self, store: NodeBucketStore, items: Sequence[BucketItem], now: float) -> list[Call]:
        return [(1, store.take(t.key, t.spec, t.hits, t.max_wait_millis, now)) for t in items]

    @staticmethod
    def wait_allowed(spec: BucketSpec, asked_millis: int) -> int:
        """The wait a caller gets at most: what it asks, bounded by the node's timeout."""
        return max(0, min(asked_millis, spec.wait_timeout_millis))

    def count(self, item: BucketItem, granted: bool, waited: bool) -> None:
        stats, shadow = self.stats, item.rule.shadow_mode
        stats.outcome(item.stats_key, item.stats_path, item.hits, granted, shadow, waited)

    def answer(
        self,
        items: Sequence[BucketItem],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for item, take in zip(items, replies, strict=True):
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

    async def request(
        self, store: NodeBucketStore, ask: Ask, now: Callable[[], float], timed: Timed
    ) -> Granted:
        """ferryman.v1's ``Request`` on a bucket node: ``copies`` tokens, else
        ``min_copies``, else none, granted after a wait of at most ``max_wait_millis`` (and
        the node's wait_timeout_millis)."""
        rule = ask.path[-1]
        assert isinstance(rule.limit, NodeBucket)
        spec = rule.limit.spec
        key = bucket_key(self.opts.cache_key_prefix, rule, ask.entries)
        wait = self.wait_allowed(spec, ask.max_wait_millis)
        granted, take = 0, None
        try:
            counts = (ask.copies, ask.min_copies) if ask.min_copies < ask.copies else (ask.copies,)
            for n in counts:
                take = await timed(1, store.take(key, spec, n, wait, now()))
                if take.status is TakeStatus.OK:
                    granted = n
                    break
        except BackendError:
            if not self.opts.fail_open:
                raise
            self.stats.inc(f"{REQUEST_CALL}.degraded")
            return Granted(ask.copies, {"tokens_remaining": spec.size}, {})
        assert take is not None
        self._count_request(ask, key, granted, take)
        return _granted(spec, ask, granted, take)

    def _count_request(self, ask: Ask, key: str, granted: int, take: NodeTake) -> None:
        rule = ask.path[-1]
        assert isinstance(rule.limit, NodeBucket)
        stats, parts = stats_key(ask.domain, ask.entries, ask.path)
        quota = rule.quota_mode or self.opts.quota_mode
        item = BucketItem(0, rule, rule.limit.spec, key, stats, parts, ask.copies, quota)
        self.count(item, granted > 0, take.wait_millis > 0)


def _granted(spec: BucketSpec, ask: Ask, granted: int, take: NodeTake) -> Granted:
    durations: dict[str, float] = {}
    if granted and take.wait_millis > 0:
        durations["wait"] = take.wait_millis / 1000
    # Hits beyond the size and the debt allowed never pass: no retry_after for them.
    if not granted and ask.min_copies <= spec.size + spec.max_debt_millis * spec.fill_rate / 1e3:
        durations["retry_after"] = take.next_token(spec)
    return Granted(granted, {"tokens_remaining": max(0, math.floor(take.stored))}, durations)
