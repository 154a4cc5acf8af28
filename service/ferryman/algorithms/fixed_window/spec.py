"""``rate_limit`` on a descriptor node: a count per window, as the reference reads it
(``unit``), or per window of any length (``window: 30s``) or calendar period (``calendar``);
``unlimited: true`` for a node that is never limited; ``sync: 100ms`` counts it in the
replica's own view, flushed to Redis every 100 ms (synced counting)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from yaml.nodes import MappingNode, Node

from ferryman.core.nodes import (
    Ctx,
    boolean,
    duration,
    join,
    mapping,
    read_replaces,
    string,
    uint32,
)
from ferryman.core.periods import Period, read_period
from ferryman.core.rules import Unit, UnitLimit

__all__ = ["KIND", "FixedWindow", "read_fixed_window", "read_window_fields"]

KIND = "fixed_window"
_KEYS = frozenset(
    {"unit", "window", "calendar", "requests_per_unit", "unlimited", "name", "replaces", "sync"}
)
# Longer than this and a replica's view would lag a minute window by most of it.
MAX_SYNC = 60.0


@dataclass(frozen=True)
class FixedWindow:
    """A fixed-window limit: ``rate`` is the count per unit as Envoy is told it (its name
    and replaces too), ``period`` the window it counts in (None: unlimited), ``sync`` the
    interval of synced counting (None: as REDIS_SYNC_INTERVAL says; 0: exact)."""

    rate: UnitLimit
    period: Period | None = None
    sync: float | None = None
    kind: ClassVar[str] = KIND

    @property
    def name(self) -> str:
        return self.rate.name

    @property
    def replaces(self) -> tuple[str, ...]:
        return self.rate.replaces


def read_fixed_window(ctx: Ctx, fields: Mapping[str, Node], path: str) -> FixedWindow | None:
    """``rate_limit: {unit | window | calendar, requests_per_unit, unlimited, name,
    replaces, sync}``."""
    node = fields.get("rate_limit")
    if node is None:
        return None
    return read_window_fields(ctx, node, join(path, "rate_limit"))


def read_window_fields(ctx: Ctx, node: Node, path: str) -> FixedWindow | None:
    """One fixed window's map at ``path``."""
    own = mapping(ctx, node, path, _KEYS, reference=True)
    if not isinstance(node, MappingNode):
        return None
    unlimited = boolean(ctx, own.get("unlimited"), join(path, "unlimited"))
    period: Period | None = None
    if unlimited:
        _unlimited_unit(ctx, own.get("unit"), join(path, "unit"))
        for form in ("window", "calendar"):
            if form in own:
                ctx.error(own[form], join(path, form), f"'unlimited: true' cannot have a {form}")
    else:
        period = read_period(ctx, node, own, path)
    rpu = uint32(ctx, own.get("requests_per_unit"), join(path, "requests_per_unit"))
    name = string(ctx, own.get("name"), join(path, "name"))
    replaces: tuple[str, ...] = ()
    if "replaces" in own:
        replaces = read_replaces(ctx, own["replaces"], join(path, "replaces"), name)
    unit = None if period is None else period.unit
    sync = read_sync(ctx, own.get("sync"), join(path, "sync"))
    return FixedWindow(UnitLimit(rpu or 0, unit, unlimited, name, replaces), period, sync)


def _unlimited_unit(ctx: Ctx, node: Node | None, path: str) -> None:
    """An unlimited node's ``unit``: a unit is refused (by the reference too); anything else
    it ignores, and so does ferryman, with a warning."""
    text = string(ctx, node, path)
    if not text:
        return
    if text.upper() in Unit.__members__:
        ctx.error(node, path, "'unlimited: true' cannot have a unit (the reference refuses it too)")
    else:
        ctx.warn(
            node,
            path,
            f"{text!r} is not a unit: ignored beside 'unlimited: true', "
            "as the reference ignores it",
        )


def read_sync(ctx: Ctx, node: Node | None, path: str) -> float | None:
    """``sync``: a duration from 0 (exact) to :data:`MAX_SYNC`."""
    value = duration(ctx, node, path)
    if value is not None and not 0 <= value <= MAX_SYNC:
        ctx.error(node, path, f"sync {value:g}s is out of range (0s to {MAX_SYNC:g}s)")
        return None
    return value
