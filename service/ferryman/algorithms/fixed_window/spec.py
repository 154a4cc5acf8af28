"""``rate_limit`` on a descriptor node: a count per epoch-aligned window, as the reference
reads it (``unlimited: true`` for a node that is never limited)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from yaml.nodes import MappingNode, Node

from ferryman.core.nodes import Ctx, boolean, join, mapping, read_replaces, string, uint32
from ferryman.core.rules import Unit, UnitLimit

__all__ = ["KIND", "FixedWindow", "read_fixed_window"]

KIND = "fixed_window"
_KEYS = frozenset({"unit", "requests_per_unit", "unlimited", "name", "replaces"})
_UNITS = "second, minute, hour, day, week, month or year"


@dataclass(frozen=True)
class FixedWindow:
    """A fixed-window limit: ``rate`` is the count per unit (its name and replaces too)."""

    rate: UnitLimit
    kind: ClassVar[str] = KIND

    @property
    def name(self) -> str:
        return self.rate.name

    @property
    def replaces(self) -> tuple[str, ...]:
        return self.rate.replaces


def read_fixed_window(ctx: Ctx, fields: Mapping[str, Node], path: str) -> FixedWindow | None:
    """``rate_limit: {unit, requests_per_unit, unlimited, name, replaces}``."""
    node = fields.get("rate_limit")
    if node is None:
        return None
    path = join(path, "rate_limit")
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    unlimited = boolean(ctx, own.get("unlimited"), join(path, "unlimited"))
    unit = _unit(ctx, node, own, path, unlimited)
    rpu = uint32(ctx, own.get("requests_per_unit"), join(path, "requests_per_unit"))
    name = string(ctx, own.get("name"), join(path, "name"))
    replaces: tuple[str, ...] = ()
    if "replaces" in own:
        replaces = read_replaces(ctx, own["replaces"], join(path, "replaces"), name)
    return FixedWindow(UnitLimit(rpu or 0, unit, unlimited, name, replaces))


def _unit(ctx: Ctx, node: Node, own: Mapping[str, Node], path: str, unlimited: bool) -> Unit | None:
    unit_node = own.get("unit")
    text = string(ctx, unit_node, join(path, "unit"))
    if unlimited:
        if text:
            ctx.error(unit_node, join(path, "unit"), "'unlimited: true' cannot have a unit")
        return None
    if not text:
        ctx.error(node, path, f"missing 'unit' ({_UNITS})")
        return None
    try:
        return Unit[text.upper()]
    except KeyError:
        ctx.error(unit_node, join(path, "unit"), f"invalid unit {text!r} ({_UNITS})")
        return None
