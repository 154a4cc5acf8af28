"""``copies`` on a descriptor node (Charon's held resources): tenant, group and global
limits, read and normalized (a limit above the global limit is lowered to it, noted)."""

from __future__ import annotations

from collections.abc import Mapping

from yaml.nodes import MappingNode, Node, SequenceNode

from ferryman.algorithms.copies.model import CopyGroup, CopyPolicy
from ferryman.core.nodes import Ctx, duration, join, kind, mapping, string, uint32

__all__ = ["read_copies"]

_KEYS = frozenset({"limit", "global_limit", "groups", "hold_ttl"})
_GROUP_KEYS = frozenset({"name", "limit", "members"})


def read_copies(ctx: Ctx, fields: Mapping[str, Node], path: str) -> CopyPolicy | None:
    """``copies: {limit, global_limit, groups, hold_ttl}``."""
    node = fields.get("copies")
    if node is None:
        return None
    path = join(path, "copies")
    own = mapping(ctx, node, path, _KEYS)
    if not isinstance(node, MappingNode):
        return None
    limit = uint32(ctx, own.get("limit"), join(path, "limit"))
    glob = uint32(ctx, own.get("global_limit"), join(path, "global_limit"))
    hold_ttl = duration(ctx, own.get("hold_ttl"), join(path, "hold_ttl"))
    if hold_ttl is not None and hold_ttl <= 0:
        ctx.error(own["hold_ttl"], join(path, "hold_ttl"), "hold_ttl must be positive")
    where = ctx.where(node, path)
    if limit is not None and glob is not None and limit > glob:
        ctx.notes.append(f"{where}: limit {limit} lowered to the global limit {glob}")
        limit = glob
    groups = _groups(ctx, own.get("groups"), join(path, "groups"), glob, where)
    return CopyPolicy(limit, glob, groups, 300.0 if hold_ttl is None else hold_ttl)


def _groups(
    ctx: Ctx, node: Node | None, gpath: str, glob: int | None, where: str
) -> tuple[CopyGroup, ...]:
    if node is None:
        return ()
    if not isinstance(node, SequenceNode):
        ctx.error(node, gpath, f"expected a list of groups, found {kind(node)}")
        return ()
    groups: list[CopyGroup] = []
    seen: set[str] = set()
    for i, item in enumerate(node.value):
        group = _group(ctx, item, f"{gpath}[{i}]", seen)
        if group is None:
            continue
        if glob is not None and group.limit > glob:
            ctx.notes.append(
                f"{where}: group {group.name!r} limit {group.limit} lowered to the global "
                f"limit {glob}"
            )
            group = CopyGroup(group.name, glob, group.members)
        groups.append(group)
    return tuple(groups)


def _group(ctx: Ctx, item: Node, ipath: str, seen: set[str]) -> CopyGroup | None:
    gfields = mapping(ctx, item, ipath, _GROUP_KEYS)
    if not isinstance(item, MappingNode):
        return None
    name = string(ctx, gfields.get("name"), join(ipath, "name"))
    glimit = uint32(ctx, gfields.get("limit"), join(ipath, "limit"))
    members = _members(ctx, gfields.get("members"), join(ipath, "members"))
    if not name:
        ctx.error(gfields.get("name", item), join(ipath, "name"), "a group needs a name")
        return None
    if name in seen:
        ctx.error(item, ipath, f"group {name!r} is defined twice")
        return None
    seen.add(name)
    if glimit is None:
        if "limit" not in gfields:
            ctx.error(item, ipath, "a group needs a 'limit'")
        return None
    return CopyGroup(name, glimit, members)


def _members(ctx: Ctx, node: Node | None, path: str) -> tuple[str, ...]:
    if node is None:
        return ()
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list of tenant values, found {kind(node)}")
        return ()
    out = []
    for i, item in enumerate(node.value):
        value = string(ctx, item, f"{path}[{i}]")
        if not value:
            ctx.error(item, f"{path}[{i}]", "a member must not be empty")
        else:
            out.append(value)
    return tuple(out)
