"""The descriptor tree's values: units, the limit Envoy is told, a rule and its tagged limit,
the levels a request walks down."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

__all__ = [
    "REFERENCE_KEYS",
    "UNIT_SECONDS",
    "Domain",
    "Level",
    "Limit",
    "Rule",
    "Unit",
    "UnitLimit",
    "Unnamed",
]


#: The key names the reference service's descriptor files may hold. It checks every map key
#: of a file against this one list, wherever the key is, and reads each key only where it
#: belongs (``name`` beside ``domain`` is accepted and never read); ``metadata``'s own keys
#: are free.
REFERENCE_KEYS = frozenset(
    {
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    }
)


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
class UnitLimit:
    """A count per unit: what Envoy is told a descriptor's limit is (``current_limit``), and
    what Envoy may send in place of the configured one."""

    requests_per_unit: int
    unit: Unit | None
    unlimited: bool = False
    name: str = ""
    replaces: tuple[str, ...] = ()


class Limit(Protocol):
    """A rule's limit: one algorithm's spec, tagged with the algorithm's name (the registry in
    ``ferryman.algorithms`` finds the algorithm by it)."""

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str:
        """The name other rules' ``replaces`` refer to ("" for none)."""
        ...

    @property
    def replaces(self) -> tuple[str, ...]:
        """The names of the rules this one replaces in a request that reaches both."""
        ...


class Unnamed:
    """A limit of a kind that has no name and replaces nothing (only fixed windows and burst
    tiers take part in ``replaces``)."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return ""

    @property
    def replaces(self) -> tuple[str, ...]:
        return ()


def wildcard_pattern(value: str) -> re.Pattern[str]:
    """Compile a descriptor value in which each ``*`` stands for any run of characters."""
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)


@dataclass(frozen=True, eq=False)
class Rule:
    """One node of a descriptor tree."""

    key: str
    value: str
    limit: Limit | None = None
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
    # Seconds a ShouldRateLimit may be held until its hits fit (``max_wait``; 0: answered
    # at once), on a kind that can tell when they will.
    max_wait: float = 0.0

    @property
    def name(self) -> str:
        return self.limit.name if self.limit is not None else ""

    @property
    def replaces(self) -> tuple[str, ...]:
        return self.limit.replaces if self.limit is not None else ()

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
    # What Envoy's callers may send (the domain's allow_overrides, allow_negative_hits).
    allow_overrides: bool = True
    allow_negative_hits: bool = True
    # Charon's domain switches: descriptors that match no rule are recorded (they are
    # answered OK either way); every rule is in shadow mode (counted, never refused).
    allow_unconfigured: bool = False
    ignore_limits: bool = False
