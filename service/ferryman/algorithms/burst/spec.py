"""``burst_tiers`` on a descriptor node, with ``hard_limit``, ``global_limit`` and the
node-level ``name`` and ``replaces``: read, validated and normalized (a tier's window cut to
its active period, the active period trimmed to whole windows, each change noted)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.algorithms.burst.model import BurstPolicy, Tier
from ferryman.core.nodes import (
    Ctx,
    boolean,
    duration,
    join,
    kind,
    mapping,
    read_replaces,
    reference_shape,
    string,
    uint32,
)

__all__ = ["KEYS", "read_burst"]

#: The node keys burst tiers read; the first marks a burst-tier node.
KEYS = ("burst_tiers", "hard_limit", "global_limit", "name", "replaces")
_TIER_KEYS = frozenset({"limit", "window", "active", "cooldown", "skippable"})


def _seconds(value: float) -> str:
    return f"{value:g}s"


def read_burst(ctx: Ctx, fields: Mapping[str, Node], path: str) -> BurstPolicy | None:
    """The node's burst tiers, or None (with problems reported) when it has none."""
    tiers_node = fields.get("burst_tiers")
    hard = uint32(ctx, fields.get("hard_limit"), join(path, "hard_limit"))
    glob = uint32(ctx, fields.get("global_limit"), join(path, "global_limit"))
    if tiers_node is None:
        _alone(ctx, fields, path)
        return None
    name = string(ctx, fields.get("name"), join(path, "name"))
    replaces: tuple[str, ...] = ()
    if "replaces" in fields:
        replaces = read_replaces(ctx, fields["replaces"], join(path, "replaces"), name)
    tpath = join(path, "burst_tiers")
    if isinstance(tiers_node, ScalarNode) and tiers_node.tag.endswith(":null"):
        return BurstPolicy((), hard, glob, name, replaces)
    if not isinstance(tiers_node, SequenceNode):
        ctx.error(tiers_node, tpath, f"expected a list of tiers, found {kind(tiers_node)}")
        return None
    tiers = [_tier(ctx, item, f"{tpath}[{i}]") for i, item in enumerate(tiers_node.value)]
    return BurstPolicy(tuple(t for t in tiers if t is not None), hard, glob, name, replaces)


def _alone(ctx: Ctx, fields: Mapping[str, Node], path: str) -> None:
    """The node-level keys that need burst_tiers beside them."""
    for name in ("hard_limit", "global_limit"):
        if name in fields:
            ctx.error(fields[name], join(path, name), f"{name} needs burst_tiers on the node")
    for key in ("name", "replaces"):
        if key in fields:
            # The reference accepts these keys anywhere and reads them under rate_limit only.
            ctx.warn(
                fields[key],
                join(path, key),
                f"'{key}' at node level goes with burst_tiers (for a fixed window put it "
                "under rate_limit): ignored, as the reference ignores it",
            )
            reference_shape(ctx, fields[key], join(path, key))


def _tier(ctx: Ctx, item: Node, ipath: str) -> Tier | None:
    tier_fields = mapping(ctx, item, ipath, _TIER_KEYS)
    if not isinstance(item, MappingNode):
        return None
    missing = [k for k in ("limit", "window", "active") if k not in tier_fields]
    for name in missing:
        ctx.error(item, ipath, f"a tier needs '{name}'")
    limit = uint32(ctx, tier_fields.get("limit"), join(ipath, "limit"))
    window = duration(ctx, tier_fields.get("window"), join(ipath, "window"))
    active = duration(ctx, tier_fields.get("active"), join(ipath, "active"))
    cooldown = duration(ctx, tier_fields.get("cooldown"), join(ipath, "cooldown"))
    skippable = boolean(ctx, tier_fields.get("skippable"), join(ipath, "skippable"))
    if window is not None and window <= 0:
        ctx.error(tier_fields["window"], join(ipath, "window"), "window must be positive")
        return None
    if missing or limit is None or window is None or active is None:
        return None
    where = ctx.where(item, ipath)
    if active == 0:
        ctx.notes.append(f"{where}: dropped (active period 0)")
        return None
    if window > active:
        ctx.notes.append(
            f"{where}: window {_seconds(window)} cut to the active period {_seconds(active)}"
        )
        window = active
    whole = math.floor(active / window + 1e-9) * window
    if whole < active - 1e-9:
        ctx.notes.append(
            f"{where}: active period {_seconds(active)} trimmed to {_seconds(whole)}, "
            f"a whole number of {_seconds(window)} windows"
        )
        active = whole
    return Tier(limit, window, active, cooldown or 0.0, skippable)
