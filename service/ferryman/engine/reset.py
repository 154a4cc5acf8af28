"""An operator's counter reset: the state one descriptor counts in, found as the request
path finds it, and cleared on the backend in force (never the copies held by sessions); or
the quota service bucket an ``Allow`` of (namespace, bucket) takes from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ferryman.algorithms.fixed_window.local_cache import OverLimitCache
from ferryman.algorithms.fixed_window.model import CounterOp
from ferryman.algorithms.token_bucket.model import BucketStore, quota_label
from ferryman.backends.base import Backend
from ferryman.config.model import Config
from ferryman.config.quota import NAME
from ferryman.engine.buckets import BucketLimiter
from ferryman.engine.bursts import BurstLimiter
from ferryman.engine.matcher import cache_key, walk
from ferryman.engine.model import EngineOptions
from ferryman.engine.policy import (
    BucketNode,
    BurstNode,
    CopiesNode,
    Plain,
    SlidingNode,
    Window,
    policies,
)
from ferryman.engine.sliding import SlidingLimiter
from ferryman.engine.validate import check_descriptor
from ferryman.engine.windows import WindowLimiter
from ferryman.errors import NotFoundError, RequestError

__all__ = ["ResetResult", "reset_counters", "reset_quota_bucket"]


@dataclass(frozen=True)
class ResetResult:
    """What was cleared: the rule's kind, its stats key, the state's key, and whether the
    backend held any state for it (a counter never touched holds none)."""

    kind: str
    stats_key: str
    key: str
    held: bool

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "rule": self.stats_key, "key": self.key, "held": self.held}


async def reset_counters(
    backend: Backend,
    config: Config | None,
    domain: str,
    entries: Sequence[tuple[str, str]],
    options: EngineOptions,
    now: float,
    local_cache: OverLimitCache | None = None,
) -> ResetResult:
    """Clear what ``entries`` of ``domain`` count in now: the current fixed window, the
    tenant's burst tiers, its token bucket or its sliding window. RequestError (or
    NotFoundError) when the descriptor reaches nothing that counts."""
    check_descriptor(domain, entries, "descriptor")
    if config is None:
        raise RequestError("domain", "no rate limit configuration is loaded")
    dom = config.domains.get(domain)
    if dom is None:
        raise NotFoundError("domain", f"unknown domain {domain!r}")
    path = walk(dom, entries)
    shown = ",".join(f"{k}={v}" for k, v in entries)
    if path is None:
        raise NotFoundError("descriptor", f"no node of domain {domain!r} matches ({shown})")
    rule = path[-1]
    policy = policies(config, options).get(rule)
    if isinstance(policy, Plain | Window):
        seconds = policy.limit.unit.seconds if policy.limit.unit is not None else 1
        base = cache_key(options.cache_key_prefix, domain, entries, path)
        key, start = WindowLimiter.key(base, seconds, now)
        op = CounterOp(key, 0, policy.limit.requests_per_unit, start + seconds, seconds)
        held = await backend.windows.reset([op])
        if local_cache is not None:
            local_cache.discard(key)
        return ResetResult("fixed_window", rule.stats_key, key, held > 0)
    if isinstance(policy, BurstNode):
        assert rule.burst is not None
        node, tenant = BurstLimiter.key(options.cache_key_prefix, rule, entries)
        held = await backend.bursts.reset(node, tenant, len(rule.burst.tiers))
        return ResetResult("burst_tiers", rule.stats_key, f"{node} {tenant}", held > 0)
    if isinstance(policy, BucketNode):
        key = BucketLimiter.key(policy, entries)
        held = await backend.buckets.reset(key)
        return ResetResult("token_bucket", rule.stats_key, key, held > 0)
    if isinstance(policy, SlidingNode):
        key = SlidingLimiter.key(policy, entries)
        held = await backend.sliding.reset(key)
        return ResetResult("sliding_window", rule.stats_key, key, held > 0)
    if isinstance(policy, CopiesNode):
        raise RequestError(
            "descriptor",
            f"({shown}) reaches copies, which live sessions hold; they are freed when the "
            "sessions release them or end, not reset",
        )
    raise RequestError("descriptor", f"({shown}) reaches {rule.stats_key}, which counts nothing")


async def reset_quota_bucket(
    store: BucketStore, config: Config | None, namespace: str, bucket: str
) -> ResetResult:
    """Fill again the bucket ``Allow(namespace, bucket)`` takes from (a named bucket, a
    dynamic one, or the default bucket it falls back to): its tokens and debt are
    forgotten. NotFoundError when no bucket matches."""
    for field, name in (("namespace", namespace), ("bucket", bucket)):
        if not NAME.fullmatch(name):
            raise RequestError(field, f"{name!r} is not a bucket name ([a-zA-Z0-9_]+)")
    quota = config.quota if config is not None else None
    found = quota.lookup(namespace, bucket) if quota is not None else None
    if found is None:
        raise NotFoundError("bucket", f"no quota bucket matches {namespace}/{bucket}")
    ref, _ = found
    held = await store.reset(ref)
    label = quota_label(ref)
    return ResetResult("quota_bucket", label, label, held > 0)
