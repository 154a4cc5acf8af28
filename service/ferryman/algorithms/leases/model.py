"""Frozen values of capacity leases: resource templates, algorithms, leases and demands."""

from __future__ import annotations

import enum
import fnmatch
import re
from dataclasses import dataclass, field
from functools import cached_property

__all__ = [
    "AlgorithmSpec",
    "Demand",
    "Kind",
    "Lease",
    "ResourceTemplate",
    "find_template",
]


class Kind(enum.IntEnum):
    """How a resource's capacity is divided; the numbers are doorman.proto's."""

    NO_ALGORITHM = 0
    STATIC = 1
    PROPORTIONAL_SHARE = 2
    FAIR_SHARE = 3


@dataclass(frozen=True)
class AlgorithmSpec:
    """A template's ``algorithm``: seconds are whole, as on the wire."""

    kind: Kind = Kind.FAIR_SHARE
    lease_length: int = 60
    refresh_interval: int = 5
    # None: as long as a lease (what a new master cannot know); 0 or less: none.
    learning_mode_duration: int | None = None
    parameters: tuple[tuple[str, str], ...] = ()

    @property
    def learning_seconds(self) -> float:
        if self.learning_mode_duration is None:
            return float(self.lease_length)
        return float(max(0, self.learning_mode_duration))


@dataclass(frozen=True)
class ResourceTemplate:
    """One entry of a resources file: which resource ids it covers and how they divide."""

    identifier_glob: str
    capacity: float
    algorithm: AlgorithmSpec = field(default_factory=AlgorithmSpec)
    safe_capacity: float | None = None
    description: str = ""
    source: str = field(default="", compare=False)

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        return re.compile(fnmatch.translate(self.identifier_glob))

    def matches(self, resource_id: str) -> bool:
        return self._pattern.match(resource_id) is not None


def find_template(
    templates: tuple[ResourceTemplate, ...], resource_id: str
) -> ResourceTemplate | None:
    """An exact ``identifier_glob`` first, then the first glob that matches, in file order."""
    for template in templates:
        if template.identifier_glob == resource_id:
            return template
    for template in templates:
        if template.matches(resource_id):
            return template
    return None


@dataclass(frozen=True)
class Lease:
    """Capacity granted until ``expiry_time`` (epoch seconds); ask again every refresh."""

    expiry_time: float
    refresh_interval: float
    capacity: float


@dataclass(frozen=True)
class Demand:
    """What one client (or a server for ``weight`` clients) asks of a resource."""

    wants: float
    weight: int = 1
