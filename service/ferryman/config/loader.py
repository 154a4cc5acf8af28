"""Load and validate descriptor YAML: every problem names its file, line, column and path."""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.config.model import Config, Domain, Level, RateLimit, Rule, Unit
from ferryman.errors import ConfigError, ConfigProblem
from ferryman.limits.burst import BurstPolicy, Tier
from ferryman.limits.copies import CopyGroup, CopyPolicy

__all__ = ["digest_sources", "load_directory", "load_sources", "read_directory"]

_STR = "tag:yaml.org,2002:str"
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"

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
    }
)
_COPIES_KEYS = frozenset({"limit", "global_limit", "groups", "hold_ttl"})
_GROUP_KEYS = frozenset({"name", "limit", "members"})
_RATE_LIMIT_KEYS = frozenset({"unit", "requests_per_unit", "unlimited", "name", "replaces"})
_MAX_UINT32 = 2**32 - 1


@dataclass
class _Ctx:
    file: str
    problems: list[ConfigProblem]
    active: set[int] = field(default_factory=set)  # descriptor lists being read (alias loops)
    notes: list[str] = field(default_factory=list)  # what normalization changed

    def error(self, node: Node | None, path: str, message: str) -> None:
        line = col = None
        if node is not None:
            line, col = node.start_mark.line + 1, node.start_mark.column + 1
        self.problems.append(ConfigProblem(self.file, line, col, path, message))


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def _flatten(node: MappingNode, active: frozenset[int] = frozenset()) -> tuple[list[Any], int]:
    """The entries of ``node`` with YAML merge keys (``<<``) expanded, as yaml.v2 does.

    Returns (entries, n): the first n entries are inherited (own keys override them; of
    several merged maps the first wins), the rest are the node's own entries.
    Raises ValueError when a ``<<`` value is not a map or a list of maps, or loops.
    """
    inherited: list[Any] = []
    own: list[Any] = []
    for key_node, value_node in node.value:
        if key_node.tag != _MERGE:
            own.append((key_node, value_node))
            continue
        sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
        for source in reversed(sources):
            if not isinstance(source, MappingNode):
                raise ValueError(f"'<<' needs a map or a list of maps, found {_kind(source)}")
            if id(source) in active | {id(node)}:
                raise ValueError("'<<' merges a map into itself")
            inherited.extend(_flatten(source, active | {id(node)})[0])
    return inherited + own, len(inherited)


def _mapping(ctx: _Ctx, node: Node, path: str, allowed: frozenset[str]) -> dict[str, Node]:
    """The entries of a YAML mapping, with bad keys reported."""
    if not isinstance(node, MappingNode):
        ctx.error(node, path, f"expected a map, found {_kind(node)}")
        return {}
    try:
        entries, n_inherited = _flatten(node)
    except ValueError as exc:
        ctx.error(node, path, str(exc))
        entries, n_inherited = [(k, v) for k, v in node.value if k.tag != _MERGE], 0
    out: dict[str, Node] = {}
    inherited: set[str] = set()
    for i, (key_node, value_node) in enumerate(entries):
        if not isinstance(key_node, ScalarNode) or key_node.tag != _STR:
            shown = key_node.value if isinstance(key_node, ScalarNode) else _kind(key_node)
            ctx.error(key_node, path, f"map key {shown!r} is not a string")
            continue
        key = key_node.value
        if key in out and key not in inherited:
            ctx.error(key_node, path, f"key {key!r} appears twice")
            continue
        if key not in allowed:
            hint = ", ".join(sorted(allowed))
            ctx.error(key_node, _join(path, key), f"unknown key {key!r} (expected one of: {hint})")
            continue
        out[key] = value_node
        if i < n_inherited:
            inherited.add(key)
        else:
            inherited.discard(key)
    return out


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a map"
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, ScalarNode):
        if node.tag == "tag:yaml.org,2002:null":
            return "nothing"
        return f"the scalar {node.value!r}"
    return "an unknown node"


def _string(ctx: _Ctx, node: Node | None, path: str) -> str:
    if node is None:
        return ""
    if not isinstance(node, ScalarNode):
        ctx.error(node, path, f"expected a string, found {_kind(node)}")
        return ""
    if node.tag == "tag:yaml.org,2002:null":
        return ""
    return str(node.value)


def _bool(ctx: _Ctx, node: Node | None, path: str) -> bool:
    if node is None:
        return False
    if not isinstance(node, ScalarNode) or node.tag != _BOOL:
        ctx.error(node, path, f"expected true or false, found {_kind(node)}")
        return False
    return str(node.value).lower() in ("true", "yes", "on", "y")


def _uint32(ctx: _Ctx, node: Node | None, path: str) -> int | None:
    if node is None:
        return None
    if not isinstance(node, ScalarNode) or node.tag != _INT:
        ctx.error(node, path, f"expected a whole number, found {_kind(node)}")
        return None
    value = int(yaml.safe_load(node.value))
    if not 0 <= value <= _MAX_UINT32:
        ctx.error(node, path, f"{value} is out of range (0 to {_MAX_UINT32})")
        return None
    return value


def _plain(node: Node) -> Any:
    """The Python value of a YAML subtree (for free-form ``metadata``)."""
    constructor = yaml.constructor.SafeConstructor()
    return constructor.construct_object(node, deep=True)


def _rate_limit(ctx: _Ctx, node: Node, path: str) -> RateLimit | None:
    fields = _mapping(ctx, node, path, _RATE_LIMIT_KEYS)
    if not isinstance(node, MappingNode):
        return None
    unlimited = _bool(ctx, fields.get("unlimited"), _join(path, "unlimited"))
    unit_node = fields.get("unit")
    unit_text = _string(ctx, unit_node, _join(path, "unit"))
    unit: Unit | None = None
    if unlimited:
        if unit_text:
            ctx.error(unit_node, _join(path, "unit"), "'unlimited: true' cannot have a unit")
    elif not unit_text:
        ctx.error(node, path, "missing 'unit' (second, minute, hour, day, week, month or year)")
    else:
        try:
            unit = Unit[unit_text.upper()]
        except KeyError:
            ctx.error(
                unit_node,
                _join(path, "unit"),
                f"invalid unit {unit_text!r} (second, minute, hour, day, week, month or year)",
            )
    rpu = _uint32(ctx, fields.get("requests_per_unit"), _join(path, "requests_per_unit"))
    name = _string(ctx, fields.get("name"), _join(path, "name"))
    replaces: list[str] = []
    if "replaces" in fields:
        replaces = _replaces(ctx, fields["replaces"], _join(path, "replaces"), name)
    return RateLimit(
        requests_per_unit=rpu or 0,
        unit=unit,
        unlimited=unlimited,
        name=name,
        replaces=tuple(replaces),
    )


_TIER_KEYS = frozenset({"limit", "window", "active", "cooldown", "skippable"})
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)?")
_DURATION_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def _duration(ctx: _Ctx, node: Node | None, path: str) -> float | None:
    """A duration: ``500ms``, ``1s``, ``5m``, ``1h``, ``1d`` or a number of seconds."""
    if node is None:
        return None
    text = node.value if isinstance(node, ScalarNode) else None
    match = _DURATION.fullmatch(str(text).strip()) if text is not None else None
    if match is None or node.tag not in (_STR, _INT, _FLOAT):
        ctx.error(
            node, path, f"expected a duration like 500ms, 1s, 5m, 1h, 1d, found {_kind(node)}"
        )
        return None
    return float(match.group(1)) * _DURATION_SCALE[match.group(2)]


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _replaces(ctx: _Ctx, node: Node, path: str, own: str) -> list[str]:
    """A ``replaces`` list of ``{name: ...}`` maps."""
    names: list[str] = []
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list, found {_kind(node)}")
        return names
    for i, item in enumerate(node.value):
        ipath = f"{path}[{i}]"
        item_fields = _mapping(ctx, item, ipath, frozenset({"name"}))
        if not isinstance(item, MappingNode):
            continue
        rname = _string(ctx, item_fields.get("name"), _join(ipath, "name"))
        if not rname:
            ctx.error(item, ipath, "a 'replaces' entry needs a non-empty name")
        elif own and rname == own:
            ctx.error(item, ipath, f"the rule {own!r} replaces itself")
        else:
            names.append(rname)
    return names


def _burst_names(
    ctx: _Ctx, fields: dict[str, Node], path: str, has_burst: bool
) -> tuple[str, tuple[str, ...]]:
    """Node-level ``name``/``replaces``: what rate_limit carries for fixed windows."""
    if not has_burst:
        for key in ("name", "replaces"):
            if key in fields:
                ctx.error(
                    fields[key],
                    _join(path, key),
                    f"'{key}' at node level goes with burst_tiers "
                    "(for a fixed window put it under rate_limit)",
                )
        return "", ()
    name = _string(ctx, fields.get("name"), _join(path, "name"))
    replaces: list[str] = []
    if "replaces" in fields:
        replaces = _replaces(ctx, fields["replaces"], _join(path, "replaces"), name)
    return name, tuple(replaces)


def _copies(ctx: _Ctx, node: Node | None, path: str) -> CopyPolicy | None:
    """``copies``: a held-resource node (tenant, group and global limits), normalized."""
    if node is None:
        return None
    fields = _mapping(ctx, node, path, _COPIES_KEYS)
    if not isinstance(node, MappingNode):
        return None
    limit = _uint32(ctx, fields.get("limit"), _join(path, "limit"))
    glob = _uint32(ctx, fields.get("global_limit"), _join(path, "global_limit"))
    hold_ttl = _duration(ctx, fields.get("hold_ttl"), _join(path, "hold_ttl"))
    if hold_ttl is not None and hold_ttl <= 0:
        ctx.error(fields["hold_ttl"], _join(path, "hold_ttl"), "hold_ttl must be positive")
    where = f"{ctx.file}:{node.start_mark.line + 1}: {path}"
    if limit is not None and glob is not None and limit > glob:
        ctx.notes.append(f"{where}: limit {limit} lowered to the global limit {glob}")
        limit = glob
    groups: list[CopyGroup] = []
    groups_node = fields.get("groups")
    if groups_node is not None:
        gpath = _join(path, "groups")
        if not isinstance(groups_node, SequenceNode):
            ctx.error(groups_node, gpath, f"expected a list of groups, found {_kind(groups_node)}")
        else:
            seen: set[str] = set()
            for i, item in enumerate(groups_node.value):
                ipath = f"{gpath}[{i}]"
                gfields = _mapping(ctx, item, ipath, _GROUP_KEYS)
                if not isinstance(item, MappingNode):
                    continue
                name = _string(ctx, gfields.get("name"), _join(ipath, "name"))
                glimit = _uint32(ctx, gfields.get("limit"), _join(ipath, "limit"))
                members = _members(ctx, gfields.get("members"), _join(ipath, "members"))
                if not name:
                    ctx.error(
                        gfields.get("name", item), _join(ipath, "name"), "a group needs a name"
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


def _members(ctx: _Ctx, node: Node | None, path: str) -> tuple[str, ...]:
    if node is None:
        return ()
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list of tenant values, found {_kind(node)}")
        return ()
    out = []
    for i, item in enumerate(node.value):
        value = _string(ctx, item, f"{path}[{i}]")
        if not value:
            ctx.error(item, f"{path}[{i}]", "a member must not be empty")
        else:
            out.append(value)
    return tuple(out)


def _burst(ctx: _Ctx, fields: dict[str, Node], path: str) -> BurstPolicy | None:
    """``burst_tiers`` with ``hard_limit``/``global_limit``, validated and normalized."""
    tiers_node = fields.get("burst_tiers")
    hard = _uint32(ctx, fields.get("hard_limit"), _join(path, "hard_limit"))
    glob = _uint32(ctx, fields.get("global_limit"), _join(path, "global_limit"))
    if tiers_node is None:
        for name in ("hard_limit", "global_limit"):
            if name in fields:
                ctx.error(fields[name], _join(path, name), f"{name} needs burst_tiers on the node")
        return None
    tpath = _join(path, "burst_tiers")
    if isinstance(tiers_node, ScalarNode) and tiers_node.tag.endswith(":null"):
        return BurstPolicy((), hard, glob)
    if not isinstance(tiers_node, SequenceNode):
        ctx.error(tiers_node, tpath, f"expected a list of tiers, found {_kind(tiers_node)}")
        return None
    tiers: list[Tier] = []
    for i, item in enumerate(tiers_node.value):
        ipath = f"{tpath}[{i}]"
        tier_fields = _mapping(ctx, item, ipath, _TIER_KEYS)
        if not isinstance(item, MappingNode):
            continue
        missing = [k for k in ("limit", "window", "active") if k not in tier_fields]
        for name in missing:
            ctx.error(item, ipath, f"a tier needs '{name}'")
        limit = _uint32(ctx, tier_fields.get("limit"), _join(ipath, "limit"))
        window = _duration(ctx, tier_fields.get("window"), _join(ipath, "window"))
        active = _duration(ctx, tier_fields.get("active"), _join(ipath, "active"))
        cooldown = _duration(ctx, tier_fields.get("cooldown"), _join(ipath, "cooldown"))
        skippable = _bool(ctx, tier_fields.get("skippable"), _join(ipath, "skippable"))
        if window is not None and window <= 0:
            ctx.error(tier_fields["window"], _join(ipath, "window"), "window must be positive")
            continue
        if missing or limit is None or window is None or active is None:
            continue
        where = f"{ctx.file}:{item.start_mark.line + 1}: {ipath}"
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
    ctx: _Ctx,
    node: Node | None,
    path: str,
    stats_path: tuple[str, ...],
    seen: dict[tuple[str, str], tuple[str, str]] | None = None,
) -> Level:
    """One level of descriptors; ``seen``: (key, value) -> (file, path), shared by merged files."""
    if node is None or (isinstance(node, ScalarNode) and node.tag.endswith(":null")):
        return Level()
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list of descriptors, found {_kind(node)}")
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
    ctx: _Ctx,
    node: SequenceNode,
    path: str,
    stats_path: tuple[str, ...],
    seen: dict[tuple[str, str], tuple[str, str]],
) -> Level:
    rules: list[Rule] = []
    for i, item in enumerate(node.value):
        ipath = f"{path}[{i}]"
        if not isinstance(item, MappingNode):
            ctx.error(item, ipath, f"a descriptor must be a map, found {_kind(item)}")
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


def _rule(ctx: _Ctx, node: MappingNode, path: str, stats_parent: tuple[str, ...]) -> Rule | None:
    fields = _mapping(ctx, node, path, _DESCRIPTOR_KEYS)
    key = _string(ctx, fields.get("key"), _join(path, "key"))
    if not key:
        # Keep validating the rest of this descriptor so that every problem is reported.
        ctx.error(fields.get("key", node), _join(path, "key"), "descriptor key must not be empty")
    value = _string(ctx, fields.get("value"), _join(path, "value"))
    segment = f"{key}_{value}" if value else key
    stats_path = (*stats_parent, segment)
    rate_limit = None
    if "rate_limit" in fields:
        rate_limit = _rate_limit(ctx, fields["rate_limit"], _join(path, "rate_limit"))
    burst = _burst(ctx, fields, path)
    if burst is not None and "rate_limit" in fields:
        ctx.error(
            fields["burst_tiers"],
            _join(path, "burst_tiers"),
            "a node has either rate_limit (fixed window) or burst_tiers, not both",
        )
    name, replaces = _burst_names(ctx, fields, path, burst is not None)
    copies = _copies(ctx, fields.get("copies"), _join(path, "copies"))
    if copies is not None and ("rate_limit" in fields or burst is not None):
        ctx.error(
            fields["copies"],
            _join(path, "copies"),
            "a node has one of rate_limit, burst_tiers or copies",
        )
    share = _bool(ctx, fields.get("share_threshold"), _join(path, "share_threshold"))
    if share and "*" not in value:
        ctx.error(
            fields["share_threshold"],
            _join(path, "share_threshold"),
            "share_threshold needs a wildcard value (one containing '*')",
        )
    metadata: dict[str, Any] = {}
    meta_node = fields.get("metadata")
    if meta_node is not None:
        if not isinstance(meta_node, MappingNode):
            ctx.error(
                meta_node, _join(path, "metadata"), f"expected a map, found {_kind(meta_node)}"
            )
        else:
            try:
                metadata = dict(_plain(meta_node))
            except yaml.YAMLError as exc:
                ctx.error(meta_node, _join(path, "metadata"), str(exc))
    children = _level(ctx, fields.get("descriptors"), _join(path, "descriptors"), stats_path)
    flags = {
        name: _bool(ctx, fields.get(name), _join(path, name))
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


def _parse_file(ctx: _Ctx, text: str) -> _FileResult | None:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        if context and getattr(exc, "problem", None):
            problem = f"{context}: {problem}"
        ctx.problems.append(ConfigProblem(ctx.file, line, col, "", f"YAML syntax error: {problem}"))
        return None
    if root is None:
        ctx.error(None, "domain", "the file is empty: a domain is required")
        return None
    fields = _mapping(ctx, root, "", _DOMAIN_KEYS)
    if not isinstance(root, MappingNode):
        return None
    domain = _string(ctx, fields.get("domain"), "domain")
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
    parsed: dict[str, list[tuple[_Ctx, _FileResult]]] = {}
    for name, text in sources:
        ctx = _Ctx(name, problems)
        result = _parse_file(ctx, text)
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
    notes: list[str] = []
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
            out.append((str(path), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(ConfigProblem(str(path), None, None, "", f"cannot read file: {exc}"))
    if problems:
        raise ConfigError(problems)
    return out


def load_directory(
    directory: Path, *, ignore_dotfiles: bool = True, merge_domains: bool = False
) -> Config:
    """Read and validate a whole configuration directory (all-or-nothing)."""
    return load_sources(
        read_directory(directory, ignore_dotfiles=ignore_dotfiles), merge_domains=merge_domains
    )
