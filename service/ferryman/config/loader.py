"""Load and validate descriptor YAML: every problem names its file, line, column and path.

A file whose root map has a ``resources`` key holds capacity lease templates
(``config/resources.py``), one with an ``access`` key the access policy
(``ferryman.access.policy``); every other file is a descriptor domain.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.access.policy import Policy, is_access_file, read_access
from ferryman.algorithms import ALGORITHMS, algorithm_of
from ferryman.algorithms.leases.model import ResourceTemplate
from ferryman.config.model import Config
from ferryman.config.quota import QuotaConfig, is_quota_file, read_quota
from ferryman.config.reference import reference_verdict
from ferryman.config.resources import is_resources_file, read_resources
from ferryman.core.nodes import (
    MAX_FILE_BYTES,
    Ctx,
    boolean,
    compose,
    duration,
    join,
    kind,
    mapping,
    plain,
    string,
)
from ferryman.core.rules import Domain, Level, Limit, Rule
from ferryman.errors import ConfigError, ConfigProblem

__all__ = ["digest_sources", "load_directory", "load_sources", "read_directory"]

#: Charon's per-domain switches (booleans beside ``domain``).
_SWITCHES = ("allow_unconfigured", "ignore_limits")
#: ``name``: the name of the RateLimitConfig resource the file was written from (control
#: planes such as Envoy Gateway write it); accepted and not read, as the reference does.
_DOMAIN_KEYS = frozenset(
    {"domain", "name", "descriptors", "allow_overrides", "allow_negative_hits", *_SWITCHES}
)
_NODE_KEYS = frozenset(
    {
        "key",
        "value",
        "shadow_mode",
        "quota_mode",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
        "descriptors",
        "max_wait",
    }
)
#: Every key a descriptor node may have: its own, and those its kinds read.
_DESCRIPTOR_KEYS = _NODE_KEYS.union(*(a.keys for a in ALGORITHMS))
#: The key that marks a node of each kind, in registry order.
_MARKS = tuple(a.keys[0] for a in ALGORITHMS)


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


def _limit(ctx: Ctx, fields: dict[str, Node], path: str) -> Limit | None:
    """The node's one limit, read by the kind whose keys it has; a node with the marks of
    two kinds is refused at the second one's."""
    found: Limit | None = None
    first = ""
    for algorithm in ALGORITHMS:
        if not any(k in fields for k in algorithm.keys):
            continue
        limit = algorithm.parse(ctx, fields, path)
        mark = algorithm.keys[0]
        if mark not in fields:
            continue
        if first:
            ctx.error(
                fields[mark],
                join(path, mark),
                f"a node has one of {', '.join(_MARKS[:-1])} or {_MARKS[-1]}, "
                f"not both {first} and {mark}",
            )
            continue
        first, found = mark, limit
    return found


def _metadata(ctx: Ctx, node: Node | None, path: str) -> dict[str, Any]:
    if node is None:
        return {}
    if not isinstance(node, MappingNode):
        ctx.error(node, path, f"expected a map, found {kind(node)}")
        return {}
    try:
        return dict(plain(node))
    except yaml.YAMLError as exc:
        ctx.error(node, path, str(exc))
        return {}


def _rule(ctx: Ctx, node: MappingNode, path: str, stats_parent: tuple[str, ...]) -> Rule | None:
    fields = mapping(ctx, node, path, _DESCRIPTOR_KEYS, reference=True)
    key = string(ctx, fields.get("key"), join(path, "key"))
    if not key:
        # Keep validating the rest of this descriptor so that every problem is reported.
        ctx.error(fields.get("key", node), join(path, "key"), "descriptor key must not be empty")
    value = string(ctx, fields.get("value"), join(path, "value"))
    segment = f"{key}_{value}" if value else key
    stats_path = (*stats_parent, segment)
    limit = _limit(ctx, fields, path)
    share = boolean(ctx, fields.get("share_threshold"), join(path, "share_threshold"))
    if share and "*" not in value:
        ctx.error(
            fields["share_threshold"],
            join(path, "share_threshold"),
            "share_threshold needs a wildcard value (one containing '*')",
        )
    metadata = _metadata(ctx, fields.get("metadata"), join(path, "metadata"))
    children = _level(ctx, fields.get("descriptors"), join(path, "descriptors"), stats_path)
    flags = {
        name: boolean(ctx, fields.get(name), join(path, name))
        for name in ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric")
    }
    max_wait = _max_wait(ctx, fields, path, limit)
    if not key:
        return None
    return Rule(
        key=key,
        value=value,
        limit=limit,
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
        max_wait=max_wait,
    )


def _max_wait(ctx: Ctx, fields: dict[str, Node], path: str, limit: Limit | None) -> float:
    """``max_wait`` beside the node's limit: a positive duration, on a kind that can hold a
    request until its hits fit."""
    node = fields.get("max_wait")
    seconds = duration(ctx, node, join(path, "max_wait"))
    if node is None or seconds is None:
        return 0.0
    wanted = " or ".join(a.keys[0] for a in ALGORITHMS if a.shapes)
    if seconds <= 0:
        ctx.error(node, join(path, "max_wait"), "max_wait must be positive")
    elif limit is None:
        if not any(mark in fields for mark in _MARKS):  # else its limit's problems are told
            ctx.error(node, join(path, "max_wait"), f"max_wait needs a limit beside it ({wanted})")
    else:
        algorithm = algorithm_of(limit.kind)
        why = algorithm.cannot_hold(limit)
        if why:
            hint = "" if algorithm.shapes else f" ({wanted} can)"
            ctx.error(node, join(path, "max_wait"), f"max_wait is refused: {why}{hint}")
    return seconds


@dataclass
class _FileResult:
    domain: str
    domain_node: Node | None
    descriptors: Node | None
    allow_overrides: bool = True
    allow_negative_hits: bool = True
    switches: frozenset[str] = frozenset()


def _parse_file(ctx: Ctx, root: Node | None) -> _FileResult | None:
    if root is None:
        ctx.error(None, "domain", "the file is empty: a domain is required")
        return None
    fields = mapping(ctx, root, "", _DOMAIN_KEYS, reference=True)
    if not isinstance(root, MappingNode):
        return None
    string(ctx, fields.get("name"), "name")
    domain = string(ctx, fields.get("domain"), "domain")
    if not domain:
        ctx.error(fields.get("domain", root), "domain", "domain must not be empty")
        return None
    allowed = {
        key: boolean(ctx, fields[key], key) if key in fields else True
        for key in ("allow_overrides", "allow_negative_hits")
    }
    # A domain's switch is on when any of its files turns it on (merged domains).
    on = frozenset(name for name in _SWITCHES if boolean(ctx, fields.get(name), name))
    return _FileResult(
        domain, fields.get("domain"), fields.get("descriptors"), **allowed, switches=on
    )


def _access(ctx: Ctx, root: Node | None, before: Policy | None) -> Policy | None:
    """The policy of an access file (one per directory: a second is a problem)."""
    assert root is not None
    if before is not None:
        ctx.error(root, "access", f"the access policy is already defined in {before.file}")
        return before
    return read_access(ctx, root)


def _domain(name: str, files: list[tuple[Ctx, _FileResult]], notes: list[str]) -> Domain:
    """One domain from its file (or its merged files), with its switches."""
    rules: list[Rule] = []
    # Shared by the files of a merged domain, so a repeat names the file it repeats.
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for ctx, result in files:
        rules.extend(_level(ctx, result.descriptors, "descriptors", (name,), seen).rules)
        notes.extend(ctx.notes)
    switches = frozenset().union(*(result.switches for _, result in files))
    level = Level.of(tuple(rules))
    return Domain(
        name,
        _shadowed(level) if "ignore_limits" in switches else level,
        tuple(c.file for c, _ in files),
        # A merged domain allows what every one of its files allows.
        allow_overrides=all(r.allow_overrides for _, r in files),
        allow_negative_hits=all(r.allow_negative_hits for _, r in files),
        allow_unconfigured="allow_unconfigured" in switches,
        ignore_limits="ignore_limits" in switches,
    )


def _shadowed(level: Level) -> Level:
    """``level`` with every rule in shadow mode (``ignore_limits``): each kind already
    counts and lets through an over-limit hit of a rule in shadow mode."""
    return Level.of(
        tuple(
            replace(rule, shadow_mode=True, children=_shadowed(rule.children))
            for rule in level.rules
        )
    )


def digest_sources(sources: Iterable[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for name, text in sources:
        h.update(name.encode())
        h.update(b"\0")
        h.update(text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def load_sources(
    sources: list[tuple[str, str]], *, merge_domains: bool = False, strict: bool = False
) -> Config:
    """Build a Config from (file name, YAML text) pairs; raise ConfigError listing every problem
    (and under ``strict`` every warning), each with what the reference does with its file."""
    problems: list[ConfigProblem] = []
    ctxs: list[Ctx] = []
    roots: dict[str, Node | None] = {}  # each descriptor file's document
    parsed: dict[str, list[tuple[Ctx, _FileResult]]] = {}
    quota: QuotaConfig | None = None
    resources: list[ResourceTemplate] = []
    globs: dict[str, str] = {}
    notes: list[str] = []
    access: Policy | None = None
    for name, text in sources:
        ctxs.append(ctx := Ctx(name, problems))
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
        if is_access_file(root):
            access = _access(ctx, root, access)
            continue
        roots[name] = root
        result = _parse_file(ctx, root)
        if result is None:
            continue
        owners = parsed.setdefault(result.domain, [])
        if owners and not merge_domains:
            ctx.error(
                result.domain_node,
                "domain",
                f"domain {result.domain!r} is already defined in {owners[0][0].file} "
                "(set MERGE_DOMAIN_CONFIG=true to merge files of one domain; the reference "
                "refuses it too)",
            )
            continue
        owners.append((ctx, result))
    domains = {name: _domain(name, files, notes) for name, files in parsed.items()}
    warnings = _settle(problems, ctxs, roots, strict)
    return Config(
        domains=domains,
        files=tuple(n for n, _ in sources),
        digest=digest_sources(sources),
        notes=tuple(notes),
        warnings=tuple(warnings),
        quota=quota,
        resources=tuple(resources),
        access=access,
    )


_STRICT = "(refused: STRICT_CONFIG is on)"


def _settle(
    problems: list[ConfigProblem], ctxs: list[Ctx], roots: dict[str, Node | None], strict: bool
) -> list[ConfigProblem]:
    """The warnings of every file; raises ConfigError when there are problems (or, under
    ``strict``, warnings)."""
    warnings = [w for ctx in ctxs for w in ctx.warnings]
    if strict:
        problems.extend(replace(w, message=f"{w.message} {_STRICT}") for w in warnings)
    if problems:
        raise ConfigError(_with_reference(problems, roots))
    return warnings


def _with_reference(
    problems: list[ConfigProblem], roots: dict[str, Node | None]
) -> list[ConfigProblem]:
    """Each problem with what the reference service does with its file, unless it says so."""
    verdicts: dict[str, str] = {}
    out: list[ConfigProblem] = []
    for problem in problems:
        if "the reference" in problem.message or problem.file not in roots:
            out.append(problem)
            continue
        if problem.file not in verdicts:
            refused = reference_verdict(roots[problem.file])
            verdicts[problem.file] = (
                "the reference loads this file"
                if refused is None
                else f"the reference refuses this file too: {refused}"
            )
        out.append(replace(problem, message=f"{problem.message} ({verdicts[problem.file]})"))
    return out


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
