"""A rule's policy: what kind of limit it is, worked out once per config and options.

Each rule of a loaded config gets one policy, a tagged union, built when the engine first
sees that config; requests then only look it up. A plain fixed window (one whose stats key
and counter key take nothing from the request but its entries) is fully precomputed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ferryman.config.model import Config, Level, RateLimit, Rule
from ferryman.engine.model import EngineOptions

__all__ = [
    "BucketNode",
    "BurstNode",
    "CopiesNode",
    "LeasedNode",
    "Plain",
    "Policy",
    "SlidingNode",
    "Unlimited",
    "Window",
    "policies",
]


@dataclass(frozen=True, slots=True)
class Plain:
    """A plain fixed-window rule: everything its descriptors share, worked out once."""

    rule: Rule
    limit: RateLimit
    seconds: int
    stats_key: str
    stats_path: tuple[str, ...]
    shadow: bool
    quota: bool
    metadata: Mapping[str, Any]
    head: str  # the counter key's start, <prefix><domain>_


@dataclass(frozen=True, slots=True)
class Window:
    """A fixed-window rule whose stats or counter key depends on the request's values
    (detailed_metric, value_to_metric or share_threshold on its path)."""

    rule: Rule
    limit: RateLimit
    path: tuple[Rule, ...]
    quota: bool


@dataclass(frozen=True, slots=True)
class Unlimited:
    """``unlimited: true``: always OK, nothing counted."""


@dataclass(frozen=True, slots=True)
class BurstNode:
    rule: Rule
    path: tuple[Rule, ...]
    quota: bool


@dataclass(frozen=True, slots=True)
class CopiesNode:
    rule: Rule
    path: tuple[Rule, ...]
    quota: bool


@dataclass(frozen=True, slots=True)
class BucketNode:
    """``token_bucket``: a smooth limit (engine/buckets.py)."""

    rule: Rule
    path: tuple[Rule, ...]
    quota: bool
    key: str  # the bucket key's start: <prefix>ferryman_bucket_{<stats key>


@dataclass(frozen=True, slots=True)
class SlidingNode:
    """``sliding_window``: the two-window counter (engine/sliding.py)."""

    rule: Rule
    limit: RateLimit
    path: tuple[Rule, ...]
    quota: bool
    key: str  # the counter key's start: <prefix>ferryman_sliding_{<stats key>


@dataclass(frozen=True, slots=True)
class LeasedNode:
    """``leased_limit``: hits per second as many as this server's lease allows."""

    rule: Rule
    quota: bool


Policy = Plain | Window | Unlimited | BurstNode | CopiesNode | BucketNode | SlidingNode | LeasedNode


def _policy(domain: str, path: Sequence[Rule], opts: EngineOptions) -> Policy | None:
    rule = path[-1]
    quota = rule.quota_mode or opts.quota_mode
    if rule.leased is not None:
        return LeasedNode(rule, quota)
    if rule.copies is not None:
        return CopiesNode(rule, tuple(path), quota)
    if rule.burst is not None:
        return BurstNode(rule, tuple(path), quota)
    if rule.token_bucket is not None:
        key = f"{opts.cache_key_prefix}ferryman_bucket_{{{rule.stats_key}"
        return BucketNode(rule, tuple(path), quota, key)
    if rule.sliding_window is not None:
        key = f"{opts.cache_key_prefix}ferryman_sliding_{{{rule.stats_key}"
        return SlidingNode(rule, rule.sliding_window, tuple(path), quota, key)
    limit = rule.rate_limit
    if limit is None:
        return None
    if limit.unlimited or limit.unit is None:
        return Unlimited()
    if rule.detailed_metric or any(r.value_to_metric or r.share_threshold for r in path):
        return Window(rule, limit, tuple(path), quota)
    return Plain(
        rule,
        limit,
        limit.unit.seconds,
        rule.stats_key,
        rule.stats_path,
        rule.shadow_mode,
        quota,
        rule.metadata,
        f"{opts.cache_key_prefix}{domain}_",
    )


def policies(config: Config, opts: EngineOptions) -> dict[Rule, Policy]:
    """The policy of every limited rule of ``config`` (rules without one are left out)."""
    out: dict[Rule, Policy] = {}

    def visit(domain: str, level: Level, parents: tuple[Rule, ...]) -> None:
        for rule in level.rules:
            path = (*parents, rule)
            policy = _policy(domain, path, opts)
            if policy is not None:
                out[rule] = policy
            visit(domain, rule.children, path)

    for name, domain in config.domains.items():
        visit(name, domain.root, ())
    return out
