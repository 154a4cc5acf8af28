"""Frozen values that describe a loaded descriptor configuration."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ferryman.algorithms.burst.model import BurstPolicy
from ferryman.algorithms.copies.model import CopyPolicy
from ferryman.algorithms.leases.model import ResourceTemplate
from ferryman.algorithms.token_bucket.model import BucketSpec
from ferryman.config.quota import QuotaConfig

__all__ = [
    "UNIT_SECONDS",
    "Config",
    "Domain",
    "LeasedLimit",
    "Level",
    "RateLimit",
    "Rule",
    "Unit",
]


class Unit(enum.IntEnum):
    """Time units; the numbers are those of the RLS proto's ``RateLimit.Unit``."""

    SECOND = 1
    MINUTE = 2
    HOUR = 3
    DAY = 4
    MONTH = 5
    YEAR = 6
    WEEK = 7

    @property
    def seconds(self) -> int:
        return UNIT_SECONDS[self]


UNIT_SECONDS: Mapping[Unit, int] = MappingProxyType(
    {
        Unit.SECOND: 1,
        Unit.MINUTE: 60,
        Unit.HOUR: 3600,
        Unit.DAY: 86400,
        Unit.WEEK: 604800,
        Unit.MONTH: 2592000,
        Unit.YEAR: 31536000,
    }
)


@dataclass(frozen=True)
class RateLimit:
    """A fixed-window limit (``rate_limit:`` in YAML, or an override sent by Envoy)."""

    requests_per_unit: int
    unit: Unit | None
    unlimited: bool = False
    name: str = ""
    replaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class LeasedLimit:
    """``leased_limit:``: a per-second limit whose size is this server's lease on
    ``resource`` from its parent (``--parent``); ``safe_capacity`` once the lease has
    lapsed (None: the parent's, else unlimited; -1 unlimited)."""

    resource: str
    safe_capacity: float | None = None


def wildcard_pattern(value: str) -> re.Pattern[str]:
    """Compile a descriptor value in which each ``*`` stands for any run of characters."""
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)


@dataclass(frozen=True, eq=False)
class Rule:
    """One node of a descriptor tree."""

    key: str
    value: str
    rate_limit: RateLimit | None = None
    burst: BurstPolicy | None = None
    copies: CopyPolicy | None = None
    token_bucket: BucketSpec | None = None  # config/smooth.py
    sliding_window: RateLimit | None = None  # config/smooth.py
    leased: LeasedLimit | None = None
    name: str = ""  # a burst node's name (a fixed window's lives in rate_limit)
    replaces: tuple[str, ...] = ()
    shadow_mode: bool = False
    quota_mode: bool = False
    detailed_metric: bool = False
    value_to_metric: bool = False
    share_threshold: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)
    stats_key: str = ""
    # stats_key in parts, (domain, level1, ...): labels for exporters, whatever the dots.
    stats_path: tuple[str, ...] = ()
    children: Level = field(default_factory=lambda: Level())
    source: str = ""

    @property
    def is_wildcard(self) -> bool:
        return "*" in self.value

    @property
    def pattern(self) -> re.Pattern[str]:
        return wildcard_pattern(self.value)


@dataclass(frozen=True, eq=False)
class Level:
    """The nodes of one tree level, indexed for matching."""

    exact: Mapping[tuple[str, str], Rule] = field(default_factory=dict)
    wildcards: Mapping[str, tuple[tuple[re.Pattern[str], Rule], ...]] = field(default_factory=dict)
    bare: Mapping[str, Rule] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()

    @classmethod
    def of(cls, rules: tuple[Rule, ...]) -> Level:
        exact: dict[tuple[str, str], Rule] = {}
        wildcards: dict[str, list[tuple[re.Pattern[str], Rule]]] = {}
        bare: dict[str, Rule] = {}
        for rule in rules:
            if not rule.value:
                bare[rule.key] = rule
            elif rule.is_wildcard:
                wildcards.setdefault(rule.key, []).append((rule.pattern, rule))
            else:
                exact[(rule.key, rule.value)] = rule
        return cls(
            exact=exact,
            wildcards={k: tuple(v) for k, v in wildcards.items()},
            bare=bare,
            rules=rules,
        )

    def match(self, key: str, value: str) -> Rule | None:
        """Exact value first, then wildcards in config order, then the bare key."""
        rule = self.exact.get((key, value))
        if rule is not None:
            return rule
        for pattern, candidate in self.wildcards.get(key, ()):
            if pattern.fullmatch(value):
                return candidate
        return self.bare.get(key)


@dataclass(frozen=True, eq=False)
class Domain:
    name: str
    root: Level
    files: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Config:
    """A whole configuration: every domain of every file, loaded all-or-nothing."""

    domains: Mapping[str, Domain]
    files: tuple[str, ...] = ()
    digest: str = ""
    notes: tuple[str, ...] = ()
    quota: QuotaConfig | None = None  # the token buckets of the quota file, if there is one
    # Capacity lease templates of every resources file, in file order.
    resources: tuple[ResourceTemplate, ...] = ()

    def iter_limits(self) -> list[tuple[str, Rule]]:
        """Every rule that carries a limit, as (domain, rule), in config order."""
        out: list[tuple[str, Rule]] = []

        def walk(domain: str, level: Level) -> None:
            for rule in level.rules:
                limited = (
                    rule.rate_limit,
                    rule.burst,
                    rule.copies,
                    rule.token_bucket,
                    rule.sliding_window,
                )
                if any(x is not None for x in limited):
                    out.append((domain, rule))
                walk(domain, rule.children)

        for name in sorted(self.domains):
            walk(name, self.domains[name].root)
        return out
