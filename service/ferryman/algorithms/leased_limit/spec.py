"""``leased_limit`` on a descriptor node: hits per second as many as this server's lease on
``resource`` from its parent (``--parent``) allows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from yaml.nodes import MappingNode, Node

from ferryman.core.nodes import Ctx, join, mapping, number, string
from ferryman.core.rules import Unnamed

__all__ = ["KIND", "LeasedLimit", "read_leased_limit"]

KIND = "leased_limit"
_KEYS = frozenset({"resource", "safe_capacity"})


@dataclass(frozen=True)
class LeasedLimit(Unnamed):
    """A per-second limit sized by this server's lease on ``resource``; ``safe_capacity``
    once the lease has lapsed (None: the parent's, else unlimited; -1 unlimited)."""

    resource: str
    safe_capacity: float | None = None
    kind: ClassVar[str] = KIND


def read_leased_limit(ctx: Ctx, fields: Mapping[str, Node], path: str) -> LeasedLimit | None:
    """``leased_limit: {resource, safe_capacity}``."""
    node = fields.get(KIND)
    if node is None:
        return None
    path = join(path, KIND)
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    resource = string(ctx, own.get("resource"), join(path, "resource"))
    if not resource:
        ctx.error(own.get("resource", node), join(path, "resource"), "missing 'resource' (an id)")
    safe = None
    if "safe_capacity" in own:
        safe = number(ctx, own["safe_capacity"], join(path, "safe_capacity"), -1.0)
        if safe is not None and -1 < safe < 0:
            ctx.error(own["safe_capacity"], join(path, "safe_capacity"), "-1 or a number >= 0")
    if not resource:
        return None
    return LeasedLimit(resource, safe)
