"""Load and validate descriptor YAML: every problem names its file, line, column and path.

A file whose root map has a ``resources`` key holds capacity lease templates
(``config/resources.py``); every other file is a descriptor domain.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.algorithms.burst.model import BurstPolicy, Tier
from ferryman.algorithms.copies.model import CopyGroup, CopyPolicy
from ferryman.algorithms.leases.model import ResourceTemplate
from ferryman.config.model import Config, Domain, LeasedLimit, Level, RateLimit, Rule, Unit
from ferryman.config.nodes import (
    MAX_FILE_BYTES,
    Ctx,
    boolean,
    compose,
    duration,
    join,
    kind,
    mapping,
    number,
    plain,
    string,
    uint32,
)
from ferryman.config.quota import QuotaConfig, is_quota_file, read_quota
from ferryman.config.resources import is_resources_file, read_resources
from ferryman.config.smooth import read_node_bucket, read_sliding_window
from ferryman.errors import ConfigError, ConfigProblem

__all__ = ["digest_sources", "load_directory", "load_sources", "read_directory"]

_DOMAIN_KEYS = frozenset({"domain", "descriptors"})
_DESCRIPTOR_KEYS = frozenset(
    {
        "key",
        "value",
        "rate_limit",
        "shadow_mode",
        "quota_mode",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
        "descriptors",
        "burst_tiers",
        "hard_limit",
        "global_limit",
        "name",
        "replaces",
        "copies",
        "token_bucket",
        "sliding_window",
        "leased_limit",
    }
)
_LEASED_KEYS = frozenset({"resource", "safe_capacity"})
_COPIES_KEYS = frozenset({"limit", "global_limit", "groups", "hold_ttl"})
_GROUP_KEYS = frozenset({"name", "limit", "members"})
_RATE_LIMIT_KEYS = frozenset({"unit", "requests_per_unit", "unlimited", "name", "replaces"})


def _rate_limit(ctx: Ctx, node: Node, path: str) -> RateLimit | None:
    fields = mapping(ctx, node, path, _RATE_LIMIT_KEYS)
    if not isinstance(node, MappingNode):
        return None
    unlimited = boolean(ctx, fields.get("unlimited"), join(path, "unlimited"))
    unit_node = fields.get("unit")
    unit_text = string(ctx, unit_node, join(path, "unit"))
    unit: Unit | None = None
    if unlimited:
        if unit_text:
            ctx.error(unit_node, join(path, "unit"), "'unlimited: true' cannot have a unit")
    elif not unit_text:
        ctx.error(node, path, "missing 'unit' (second, minute, hour, day, week, month or year)")
    else:
        try:
            unit = Unit[unit_text.upper()]
        except KeyError:
            ctx.error(
                unit_node,
                join(path, "unit"),
                f"invalid unit {unit_text!r} (second, minute, hour, day, week, month or year)",
            )
    rpu = uint32(ctx, fields.get("requests_per_unit"), join(path, "requests_per_unit"))
    name = string(ctx, fields.get("name"), join(path, "name"))
    replaces: list[str] = []
    if "replaces" in fields:
        replaces = _replaces(ctx, fields["replaces"], join(path, "replaces"), name)
    return RateLimit(
        requests_per_unit=rpu or 0,
        unit=unit,
        unlimited=unlimited,
        name=name,
        replaces=tuple(replaces),
    )


_TIER_KEYS = frozenset({"limit", "window", "active", "cooldown", "skippable"})


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _replaces(ctx: Ctx, node: Node, path: str, own: str) -> list[str]:
    """A ``replaces`` list of ``{name: ...}`` maps."""
    names: list[str] = []
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list, found {kind(node)}")
        return names
    for i, item in enumerate(node.value):
        ipath = f"{path}[{i}]"
        item_fields = mapping(ctx, item, ipath, frozenset({"name"}))
        if not isinstance(item, MappingNode):
            continue
        rname = string(ctx, item_fields.get("name"), join(ipath, "name"))
        if not rname:
            ctx.error(item, ipath, "a 'replaces' entry needs a non-empty name")
        elif own and rname == own:
            ctx.error(item, ipath, f"the rule {own!r} replaces itself")
        else:
            names.append(rname)
    return names


def _burst_names(
    ctx: Ctx, fields: dict[str, Node], path: str, has_burst: bool
) -> tuple[str, tuple[str, ...]]:
    """Node-level ``name``/``replaces``: what rate_limit carries for fixed windows."""
    if not has_burst:
        for key in ("name", "replaces"):
            if key in fields:
                ctx.error(
                    fields[key],
                    join(path, key),
                    f"'{key}' at node level goes with burst_tiers "
                    "(for a fixed window put it under rate_limit)",
                )
        return "", ()
    name = string(ctx, fields.get("name"), join(path, "name"))
    replaces: list[str] = []
    if "replaces" in fields:
        replaces = _replaces(ctx, fields["replaces"], join(path, "replaces"), name)
    return name, tuple(replaces)


def _copies(ctx: Ctx, node: Node | None, path: str) -> CopyPolicy | None:
    """``copies``: a held-resource node (tenant, group and global limits), normalized."""
    if node is None:
        return None
    fields = mapping(ctx, node, path, _COPIES_KEYS)
    if not isinstance(node, MappingNode):
        return None
    limit = uint32(ctx, fields.get("limit"), join(path, "limit"))
    glob = uint32(ctx, fields.get("global_limit"), join(path, "global_limit"))
    hold_ttl = duration(ctx, fields.get("hold_ttl"), join(path, "hold_ttl"))
    if hold_ttl is not None and hold_ttl <= 0:
        ctx.error(fields["hold_ttl"], join(path, "hold_ttl"), "hold_ttl must be positive")
    where = ctx.where(node, path)
    if limit is not None and glob is not None and limit > glob:
        ctx.notes.append(f"{where}: limit {limit} lowered to the global limit {glob}")
        limit = glob
    groups: list[CopyGroup] = []
    groups_node = fields.get("groups")
    if groups_node is not None:
        gpath = join(path, "groups")
        if not isinstance(groups_node, SequenceNode):
            ctx.error(groups_node, gpath, f"expected a list of groups, found {kind(groups_node)}")
        else:
            seen: set[str] = set()
            for i, item in enumerate(groups_node.value):
                ipath = f"{gpath}[{i}]"
                gfields = mapping(ctx, item, ipath, _GROUP_KEYS)
                if not isinstance(item, MappingNode):
                    continue
                name = string(ctx, gfields.get("name"), join(ipath, "name"))
                glimit = uint32(ctx, gfields.get("limit"), join(ipath, "limit"))
                members = _members(ctx, gfields.get("members"), join(ipath, "members"))
                if not name:
                    ctx.error(
                        gfields.get("name", item), join(ipath, "name"), "a group needs a name"
                    )
                    continue
                if name in seen:
                    ctx.error(item, ipath, f"group {name!r} is defined twice")
                    continue
                seen.add(name)
                if glimit is None:
                    if "limit" not in gfields:
                        ctx.error(item, ipath, "a group needs a 'limit'")
                    continue
                if glob is not None and glimit > glob:
                    ctx.notes.append(
                        f"{where}: group {name!r} limit {glimit} lowered to the global limit {glob}"
                    )
                    glimit = glob
                groups.append(CopyGroup(name, glimit, members))
    return CopyPolicy(limit, glob, tuple(groups), 300.0 if hold_ttl is None else hold_ttl)


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


def _burst(ctx: Ctx, fields: dict[str, Node], path: str) -> BurstPolicy | None:
    """``burst_tiers`` with ``hard_limit``/``global_limit``, validated and normalized."""
    tiers_node = fields.get("burst_tiers")
    hard = uint32(ctx, fields.get("hard_limit"), join(path, "hard_limit"))
    glob = uint32(ctx, fields.get("global_limit"), join(path, "global_limit"))
    if tiers_node is None:
        for name in ("hard_limit", "global_limit"):
            if name in fields:
                ctx.error(fields[name], join(path, name), f"{name} needs burst_tiers on the node")
        return None
    tpath = join(path, "burst_tiers")
    if isinstance(tiers_node, ScalarNode) and tiers_node.tag.endswith(":null"):
        return BurstPolicy((), hard, glob)
    if not isinstance(tiers_node, SequenceNode):
        ctx.error(tiers_node, tpath, f"expected a list of tiers, found {kind(tiers_node)}")
        return None
    tiers: list[Tier] = []
    for i, item in enumerate(tiers_node.value):
        ipath = f"{tpath}[{i}]"
        tier_fields = mapping(ctx, item, ipath, _TIER_KEYS)
        if not isinstance(item, MappingNode):
            continue
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
            continue
        if missing or limit is None or window is None or active is None:
            continue
        where = ctx.where(item, ipath)
        if active == 0:
            ctx.notes.append(f"{where}: dropped (active period 0)")
            continue
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
        tiers.append(Tier(limit, window, active, cooldown or 0.0, skippable))
    return BurstPolicy(tuple(tiers), hard, glob)


def _level(
    ctx: Ctx,
    node: Node | None,
    path: str,
    stats_path: tuple[str, ...],
    seen: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> Level:
    """One level of descriptors; ``seen``: (key, value) -> (file, path), shared by merged files."""
    if node is None or (isinstance(node, ScalarNode) and node.tag.endswith(":null")):
        return Level()
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list of descriptors, found {kind(node)}")
        return Level()
    if id(node) in ctx.active:
        ctx.error(node, path, "a YAML alias makes this descriptor list contain itself")
        return Level()
    ctx.active.add(id(node))
    try:
        return _level_items(ctx, node, path, stats_path, {} if seen is None else seen)
    finally:
        ctx.active.discard(id(node))


def _level_items(
    ctx: Ctx,
    node: SequenceNode,
    path: str,
    stats_path: tuple[str, ...],
    seen: dict[tuple[str, str], tuple[str, str]],
) -> Level:
    rules: list[Rule] = []
    for i, item in enumerate(node.value):
        ipath = f"{path}[{i}]"
        if not isinstance(item, MappingNode):
            ctx.error(item, ipath, f"a descriptor must be a map, found {kind(item)}")
            continue
        rule = _rule(ctx, item, ipath, stats_path)
        if rule is None:
            continue
        ident = (rule.key, rule.value)
        if ident in seen:
            composite = f"{rule.key}_{rule.value}" if rule.value else rule.key
            file, where = seen[ident]
            if file != ctx.file:
                where = f"{where} in {file}"
            ctx.error(
                item, ipath, f"duplicate descriptor {composite!r} (already defined at {where})"
            )
            continue
        seen[ident] = (ctx.file, ipath)
        rules.append(rule)
    return Level.of(tuple(rules))


def _leased(ctx: Ctx, fields: dict[str, Node], path: str) -> LeasedLimit | None:
    """``leased_limit: {resource, safe_capacity}``, alone on its node."""
    node = fields.get("leased_limit")
    if node is None:
        return None
    path = join(path, "leased_limit")
    own = mapping(ctx, node, path, _LEASED_KEYS)
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
    kinds = ("rate_limit", "burst_tiers", "copies", "token_bucket", "sliding_window")
    others = [k for k in kinds if k in fields]
    if others:
        ctx.error(node, path, f"a node has either leased_limit or {others[0]}, not both")
    if not resource:
        return None
    return LeasedLimit(resource, safe)


def _rule(ctx: Ctx, node: MappingNode, path: str, stats_parent: tuple[str, ...]) -> Rule | None:
    fields = mapping(ctx, node, path, _DESCRIPTOR_KEYS)
    key = string(ctx, fields.get("key"), join(path, "key"))
    if not key:
        # Keep validating the rest of this descriptor so that every problem is reported.
        ctx.error(fields.get("key", node), join(path, "key"), "descriptor key must not be empty")
    value = string(ctx, fields.get("value"), join(path, "value"))
    segment = f"{key}_{value}" if value else key
    stats_path = (*stats_parent, segment)
    rate_limit = None
    if "rate_limit" in fields:
        rate_limit = _rate_limit(ctx, fields["rate_limit"], join(path, "rate_limit"))
    burst = _burst(ctx, fields, path)
    if burst is not None and "rate_limit" in fields:
        ctx.error(
            fields["burst_tiers"],
            join(path, "burst_tiers"),
            "a node has either rate_limit (fixed window) or burst_tiers, not both",
        )
    name, replaces = _burst_names(ctx, fields, path, burst is not None)
    copies = _copies(ctx, fields.get("copies"), join(path, "copies"))
    leased = _leased(ctx, fields, path)
    if copies is not None and ("rate_limit" in fields or burst is not None):
        ctx.error(
            fields["copies"],
            join(path, "copies"),
            "a node has one of rate_limit, burst_tiers or copies",
        )
    bucket = read_node_bucket(ctx, fields.get("token_bucket"), join(path, "token_bucket"))
    if "token_bucket" in fields and (
        "rate_limit" in fields or "burst_tiers" in fields or "copies" in fields
    ):
        ctx.error(
            fields["token_bucket"],
            join(path, "token_bucket"),
            "a node has one of rate_limit, burst_tiers, copies or token_bucket",
        )
    sliding = read_sliding_window(ctx, fields.get("sliding_window"), join(path, "sliding_window"))
    if "sliding_window" in fields and any(
        k in fields for k in ("rate_limit", "burst_tiers", "copies", "token_bucket")
    ):
        ctx.error(
            fields["sliding_window"],
            join(path, "sliding_window"),
            "a node has one of rate_limit, burst_tiers, copies, token_bucket or sliding_window",
        )
    share = boolean(ctx, fields.get("share_threshold"), join(path, "share_threshold"))
    if share and "*" not in value:
        ctx.error(
            fields["share_threshold"],
            join(path, "share_threshold"),
            "share_threshold needs a wildcard value (one containing '*')",
        )
    metadata: dict[str, Any] = {}
    meta_node = fields.get("metadata")
    if meta_node is not None:
        if not isinstance(meta_node, MappingNode):
            ctx.error(meta_node, join(path, "metadata"), f"expected a map, found {kind(meta_node)}")
        else:
            try:
                metadata = dict(plain(meta_node))
            except yaml.YAMLError as exc:
                ctx.error(meta_node, join(path, "metadata"), str(exc))
    children = _level(ctx, fields.get("descriptors"), join(path, "descriptors"), stats_path)
    flags = {
        name: boolean(ctx, fields.get(name), join(path, name))
        for name in ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric")
    }
    if not key:
        return None
    return Rule(
        key=key,
        value=value,
        rate_limit=rate_limit,
        burst=burst,
        copies=copies,
        token_bucket=bucket,
        sliding_window=sliding,
        leased=leased,
        name=name,
        replaces=replaces,
        shadow_mode=flags["shadow_mode"],
        quota_mode=flags["quota_mode"],
        detailed_metric=flags["detailed_metric"],
        value_to_metric=flags["value_to_metric"],
        share_threshold=share,
        metadata=metadata,
        stats_key=".".join(stats_path),
        stats_path=stats_path,
        children=children,
        source=f"{ctx.file}:{node.start_mark.line + 1}",
    )


@dataclass
class _FileResult:
    domain: str
    domain_node: Node | None
    descriptors: Node | None


def _parse_file(ctx: Ctx, root: Node | None) -> _FileResult | None:
    if root is None:
        ctx.error(None, "domain", "the file is empty: a domain is required")
        return None
    fields = mapping(ctx, root, "", _DOMAIN_KEYS)
    if not isinstance(root, MappingNode):
        return None
    domain = string(ctx, fields.get("domain"), "domain")
    if not domain:
        ctx.error(fields.get("domain", root), "domain", "domain must not be empty")
        return None
    return _FileResult(domain, fields.get("domain"), fields.get("descriptors"))


def digest_sources(sources: Iterable[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for name, text in sources:
        h.update(name.encode())
        h.update(b"\0")
        h.update(text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def load_sources(sources: list[tuple[str, str]], *, merge_domains: bool = False) -> Config:
    """Build a Config from (file name, YAML text) pairs; raise ConfigError listing every problem."""
    problems: list[ConfigProblem] = []
    parsed: dict[str, list[tuple[Ctx, _FileResult]]] = {}
    quota: QuotaConfig | None = None
    resources: list[ResourceTemplate] = []
    globs: dict[str, str] = {}
    notes: list[str] = []
    for name, text in sources:
        ctx = Ctx(name, problems)
        if is_quota_file(text):
            if quota is not None:
                ctx.error(None, "", f"quota buckets are already defined in {quota.file}")
            quota = read_quota(ctx, text) or quota
            continue
        before = len(problems)
        root = compose(ctx, text)
        if len(problems) > before:
            continue
        if is_resources_file(root):
            assert root is not None
            resources.extend(read_resources(ctx, root, globs))
            notes.extend(ctx.notes)
            continue
        result = _parse_file(ctx, root)
        if result is None:
            continue
        owners = parsed.setdefault(result.domain, [])
        if owners and not merge_domains:
            ctx.error(
                result.domain_node,
                "domain",
                f"domain {result.domain!r} is already defined in {owners[0][0].file} "
                "(set MERGE_DOMAIN_CONFIG=true to merge files of one domain)",
            )
            continue
        owners.append((ctx, result))
    domains: dict[str, Domain] = {}
    for domain, files in parsed.items():
        rules: list[Rule] = []
        # Shared by the files of a merged domain, so a repeat names the file it repeats.
        seen: dict[tuple[str, str], tuple[str, str]] = {}
        for ctx, result in files:
            rules.extend(_level(ctx, result.descriptors, "descriptors", (domain,), seen).rules)
            notes.extend(ctx.notes)
        domains[domain] = Domain(domain, Level.of(tuple(rules)), tuple(c.file for c, _ in files))
    if problems:
        raise ConfigError(problems)
    return Config(
        domains=domains,
        files=tuple(n for n, _ in sources),
        digest=digest_sources(sources),
        notes=tuple(notes),
        quota=quota,
        resources=tuple(resources),
    )


def _walk(directory: Path, ignore_dotfiles: bool) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory, followlinks=False):
        if ignore_dotfiles:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
        dirs.sort()
        for name in sorted(files):
            if ignore_dotfiles and name.startswith("."):
                continue
            if name.endswith((".yaml", ".yml")):
                yield Path(root) / name


def read_directory(directory: Path, *, ignore_dotfiles: bool = True) -> list[tuple[str, str]]:
    """Every ``*.yaml``/``*.yml`` file below ``directory`` as (path, text), in a stable order."""
    if not directory.is_dir():
        raise ConfigError(
            [
                ConfigProblem(
                    str(directory), None, None, "", "not a directory (or it does not exist)"
                )
            ]
        )
    out: list[tuple[str, str]] = []
    problems: list[ConfigProblem] = []
    for path in _walk(directory, ignore_dotfiles):
        try:
            out.append((str(path), _read_file(path)))
        except (OSError, _Unreadable) as exc:
            problems.append(ConfigProblem(str(path), None, None, "", f"cannot read file: {exc}"))
    if problems:
        raise ConfigError(problems)
    return out


class _Unreadable(Exception):
    """A file that is not read at all, and why."""


def _read_file(path: Path) -> str:
    """The text of one file, read only if it is a regular file of at most MAX_FILE_BYTES
    (a FIFO would block the reader forever, a huge file would cost time and memory)."""
    # Non-blocking, then checked on the descriptor: no race between the check and the read.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Unreadable("not a regular file (a FIFO, device or socket is never read)")
        if st.st_size > MAX_FILE_BYTES:
            raise _Unreadable(
                f"the file is larger than {MAX_FILE_BYTES} bytes ({st.st_size}): "
                "split it, or check that it is the file you meant"
            )
        data = f.read(MAX_FILE_BYTES + 1)  # it may have grown since
    if len(data) > MAX_FILE_BYTES:
        raise _Unreadable(f"the file is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unreadable(
            f"not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); "
            "a binary file?"
        ) from None


def load_directory(
    directory: Path, *, ignore_dotfiles: bool = True, merge_domains: bool = False
) -> Config:
    """Read and validate a whole configuration directory (all-or-nothing)."""
    return load_sources(
        read_directory(directory, ignore_dotfiles=ignore_dotfiles), merge_domains=merge_domains
    )
