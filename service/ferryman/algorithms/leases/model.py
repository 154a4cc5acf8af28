"""Frozen values of capacity leases: resource templates, algorithms, leases and demands."""

from __future__ import annotations

import enum
import fnmatch
import math
import re
from dataclasses import dataclass, field, replace
from functools import cached_property

__all__ = [
    "DEFAULT_DECAY",
    "AlgorithmSpec",
    "Band",
    "Demand",
    "Kind",
    "Lease",
    "ResourceTemplate",
    "find_template",
    "with_parameters",
]

#: How much shorter a lease's refresh interval gets at each level down a tree (Doorman).
DEFAULT_DECAY = 0.5


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

    @property
    def decay_factor(self) -> float:
        """The ``decay_factor`` parameter (checked by ``with_parameters``), else 0.5."""
        value = dict(self.parameters).get("decay_factor")
        return DEFAULT_DECAY if value is None else float(value)

    def refresh_below(self, interval: float) -> int:
        """The refresh interval a server hands its own clients when its parent's lease says
        ``interval``: shorter by the decay factor, in whole seconds, at least one."""
        return max(1, math.floor(interval * self.decay_factor))


def with_parameters(spec: AlgorithmSpec) -> AlgorithmSpec:
    """``spec`` with Doorman's common named parameters applied: ``lease_duration_secs`` and
    ``refresh_interval`` (whole seconds >= 1) replace the fields of the same meaning, and
    ``decay_factor`` (in (0, 1]) is checked; ValueError names a bad one. Other names are
    kept for the algorithm and otherwise unused."""
    given = dict(spec.parameters)

    def seconds(name: str, default: int) -> int:
        if name not in given:
            return default
        text = given[name].strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{name}: expected whole seconds >= 1, got {given[name]!r}")
        return int(text)

    lease = seconds("lease_duration_secs", spec.lease_length)
    refresh = seconds("refresh_interval", spec.refresh_interval)
    if "decay_factor" in given:
        try:
            decay = float(given["decay_factor"])
        except ValueError:
            decay = math.nan
        if not 0 < decay <= 1:
            wrong = given["decay_factor"]
            raise ValueError(f"decay_factor: expected a number in (0, 1], got {wrong!r}")
    resolved = replace(spec, lease_length=lease, refresh_interval=refresh)
    if resolved.refresh_interval > resolved.lease_length:
        raise ValueError(
            f"refresh_interval {resolved.refresh_interval} is longer than the lease "
            f"({resolved.lease_length} s): leases would lapse between refreshes"
        )
    return resolved


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
class Band:
    """A priority band of a server's demand: ``clients`` clients wanting ``wants`` in all."""

    priority: int
    clients: int
    wants: float


@dataclass(frozen=True)
class Demand:
    """What one client (or a server for ``weight`` clients, in ``bands``) asks of a resource."""

    wants: float
    weight: int = 1
    priority: int = 0
    bands: tuple[Band, ...] = ()
