"""An operator's counter reset: the state one descriptor counts in, found as the request
path finds it and cleared through its rule kind on the backend in force (never the copies
held by sessions); or the quota service bucket an ``Allow`` of (namespace, bucket) takes
from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms import algorithm_of
from ferryman.algorithms.token_bucket.model import BucketStore, quota_label
from ferryman.config.model import Config
from ferryman.config.quota import NAME
from ferryman.core.answers import EngineOptions
from ferryman.core.keys import walk
from ferryman.engine.validate import check_descriptor
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
    store_of: Callable[[str], Any],
    config: Config | None,
    domain: str,
    entries: Sequence[tuple[str, str]],
    options: EngineOptions,
    now: float,
    local_cache: Any = None,
) -> ResetResult:
    """Clear what ``entries`` of ``domain`` count in now (the current fixed window, the
    tenant's burst tiers, its token bucket...), through its rule kind, on the backend's store
    of that kind (``store_of(name)``). RequestError (or NotFoundError) when the descriptor
    reaches nothing that counts."""
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
    algorithm = algorithm_of(rule.limit.kind) if rule.limit is not None else None
    target = None
    if algorithm is not None:
        target = algorithm.target(options, domain, path, entries, now)
    if algorithm is None or target is None:
        if algorithm is not None and algorithm.held:
            raise RequestError(
                "descriptor",
                f"({shown}) reaches {algorithm.name}, which live sessions hold; they are freed "
                "when the sessions release them or end, not reset",
            )
        raise RequestError(
            "descriptor", f"({shown}) reaches {rule.stats_key}, which counts nothing"
        )
    held = await algorithm.reset(store_of(algorithm.name), target)
    if local_cache is not None:
        local_cache.discard(target.key)
    return ResetResult(algorithm.name, rule.stats_key, target.key, held)


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
