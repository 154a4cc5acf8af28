"""Reading YAML node trees so that every problem names its file, line, column and path.

Every configuration file kind (descriptor domains, capacity resources, quota buckets) is
composed into a node tree and read with these helpers. A reader reports problems into a
``Ctx`` and goes on, so that one pass lists every problem of a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.durations import parse_duration
from ferryman.errors import ConfigProblem

__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "Ctx",
    "boolean",
    "compose",
    "duration",
    "is_null",
    "join",
    "kind",
    "mapping",
    "number",
    "plain",
    "read_replaces",
    "string",
    "uint32",
    "whole",
]

STR = "tag:yaml.org,2002:str"
BOOL = "tag:yaml.org,2002:bool"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
NULL = "tag:yaml.org,2002:null"
_MERGE = "tag:yaml.org,2002:merge"
MAX_UINT32 = 2**32 - 1


@dataclass
class Ctx:
    """One file being read: its name, the problems found so far, notes on normalization."""

    file: str
    problems: list[ConfigProblem]
    active: set[int] = field(default_factory=set)  # node lists being read (alias loops)
    notes: list[str] = field(default_factory=list)  # what normalization changed

    def error(self, node: Node | None, path: str, message: str) -> None:
        line = col = None
        if node is not None:
            line, col = node.start_mark.line + 1, node.start_mark.column + 1
        self.problems.append(ConfigProblem(self.file, line, col, path, message))

    def where(self, node: Node, path: str) -> str:
        """``file:line: path``, for notes."""
        return f"{self.file}:{node.start_mark.line + 1}: {path}"


def join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


# Bounds on one file, so that a hostile file costs bounded time and memory (README, "Limits
# on configuration files"); the file's size is checked before it is read (loader.py).
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64  # nested maps and lists
MAX_ALIAS_NODES = 100_000  # nodes that YAML aliases may add to a file once expanded

# libyaml's parser when PyYAML has it: an order of magnitude faster for the checks below.
_FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _shape_problem(text: str) -> tuple[Any, str] | None:
    """(mark, reason) when ``text`` nests deeper than MAX_DEPTH, else None. Read as a stream
    of events, which takes no recursion and no memory per level; syntax errors are left to
    the composer, which reports them."""
    depth = 0
    starts = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
    ends = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
    try:
        for event in yaml.parse(text, Loader=_FAST):
            if isinstance(event, starts):
                depth += 1
                if depth > MAX_DEPTH:
                    return event.start_mark, f"nested deeper than {MAX_DEPTH} levels"
            elif isinstance(event, ends):
                depth -= 1
    except yaml.YAMLError as exc:
        # Newer libyaml stops far-too-deep flow collections itself, before we see them.
        if "nesting depth" in str(exc):
            return getattr(exc, "problem_mark", None), f"nested deeper than {MAX_DEPTH} levels"
        return None
    return None


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(root: Node) -> tuple[int, int]:
    """(nodes a reader walks once every alias is expanded, distinct nodes); a loop counts
    once (readers report it)."""
    sizes: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:  # post-order without recursion: children are sized before their parent
        node, done = stack.pop()
        if done:
            total = 1
            for child in _children(node):
                total += sizes.get(id(child), 1)  # not sized yet: a loop
            sizes[id(node)] = min(total, 1 << 62)
            continue
        if id(node) in entered:
            continue
        entered.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in entered)
    return sizes[id(root)], len(sizes)


def compose(ctx: Ctx, text: str) -> Node | None:
    """The node tree of ``text``; a syntax error is reported with its position, and so is a
    file past the bounds above."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        ctx.error(None, "", f"the file is larger than {MAX_FILE_BYTES} bytes ({size})")
        return None
    shape = _shape_problem(text)
    if shape is not None:
        mark, reason = shape
        ctx.problems.append(
            ConfigProblem(ctx.file, mark.line + 1, mark.column + 1, "", f"YAML {reason}")
        )
        return None
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
    except RecursionError:  # the depth check above is the rule; this is the backstop
        ctx.error(None, "", f"YAML nested deeper than {MAX_DEPTH} levels")
        return None
    if root is not None:
        expanded, distinct = _expanded_size(root)
        if expanded - distinct > MAX_ALIAS_NODES:
            ctx.error(
                root,
                "",
                f"YAML aliases expand the file by more than {MAX_ALIAS_NODES} nodes "
                "(an alias bomb?)",
            )
            return None
    return root


def is_null(node: Node | None) -> bool:
    return node is None or (isinstance(node, ScalarNode) and node.tag == NULL)


def kind(node: Node) -> str:
    """How a node reads in a message: 'a map', 'a list', 'the scalar ...', 'nothing'."""
    if isinstance(node, MappingNode):
        return "a map"
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, ScalarNode):
        if node.tag == NULL:
            return "nothing"
        return f"the scalar {node.value!r}"
    return "an unknown node"


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
                raise ValueError(f"'<<' needs a map or a list of maps, found {kind(source)}")
            if id(source) in active | {id(node)}:
                raise ValueError("'<<' merges a map into itself")
            inherited.extend(_flatten(source, active | {id(node)})[0])
    return inherited + own, len(inherited)


# Keys some kinds read, and what a map of another kind that has one is told.
_ONLY_SOME = {"sync": "synced counting is supported by rate_limit (fixed windows) only, not"}


def mapping(
    ctx: Ctx, node: Node, path: str, allowed: frozenset[str] | None = None
) -> dict[str, Node]:
    """The entries of a YAML mapping, with bad keys reported (any key when ``allowed`` is None)."""
    if not isinstance(node, MappingNode):
        ctx.error(node, path, f"expected a map, found {kind(node)}")
        return {}
    try:
        entries, n_inherited = _flatten(node)
    except ValueError as exc:
        ctx.error(node, path, str(exc))
        entries, n_inherited = [(k, v) for k, v in node.value if k.tag != _MERGE], 0
    out: dict[str, Node] = {}
    inherited: set[str] = set()
    for i, (key_node, value_node) in enumerate(entries):
        if not isinstance(key_node, ScalarNode) or key_node.tag != STR:
            shown = key_node.value if isinstance(key_node, ScalarNode) else kind(key_node)
            ctx.error(key_node, path, f"map key {shown!r} is not a string")
            continue
        key = key_node.value
        if key in out and key not in inherited:
            ctx.error(key_node, path, f"key {key!r} appears twice")
            continue
        if allowed is not None and key not in allowed:
            hint = ", ".join(sorted(allowed))
            why = _ONLY_SOME.get(key, "unknown key")
            ctx.error(key_node, join(path, key), f"{why} {key!r} (expected one of: {hint})")
            continue
        out[key] = value_node
        if i < n_inherited:
            inherited.add(key)
        else:
            inherited.discard(key)
    return out


def string(ctx: Ctx, node: Node | None, path: str) -> str:
    if node is None:
        return ""
    if not isinstance(node, ScalarNode):
        ctx.error(node, path, f"expected a string, found {kind(node)}")
        return ""
    if node.tag == NULL:
        return ""
    return str(node.value)


def boolean(ctx: Ctx, node: Node | None, path: str) -> bool:
    if node is None:
        return False
    if not isinstance(node, ScalarNode) or node.tag != BOOL:
        ctx.error(node, path, f"expected true or false, found {kind(node)}")
        return False
    return str(node.value).lower() in ("true", "yes", "on", "y")


def whole(
    ctx: Ctx, node: Node | None, path: str, minimum: int = 0, maximum: int = 2**63 - 1
) -> int | None:
    """A whole number in [minimum, maximum], or None (reported) when it is anything else."""
    if node is None:
        return None
    if not isinstance(node, ScalarNode) or node.tag != INT:
        ctx.error(node, path, f"expected a whole number, found {kind(node)}")
        return None
    value = int(yaml.safe_load(node.value))
    if not minimum <= value <= maximum:
        ctx.error(node, path, f"{value} is out of range ({minimum} to {maximum})")
        return None
    return value


def uint32(ctx: Ctx, node: Node | None, path: str) -> int | None:
    return whole(ctx, node, path, 0, MAX_UINT32)


def number(
    ctx: Ctx, node: Node | None, path: str, minimum: float = 0.0, maximum: float = math.inf
) -> float | None:
    """A finite number (whole or not) in [minimum, maximum], or None (reported)."""
    if node is None:
        return None
    if not isinstance(node, ScalarNode) or node.tag not in (INT, FLOAT):
        ctx.error(node, path, f"expected a number, found {kind(node)}")
        return None
    value = float(yaml.safe_load(node.value))
    if not math.isfinite(value) or not minimum <= value <= maximum:
        ctx.error(node, path, f"{node.value} is out of range ({minimum:g} to {maximum:g})")
        return None
    return value


def duration(ctx: Ctx, node: Node | None, path: str) -> float | None:
    """A duration: ``500ms``, ``1s``, ``5m``, ``1h``, ``1d`` or a number of seconds."""
    if node is None:
        return None
    if isinstance(node, ScalarNode) and node.tag in (STR, INT, FLOAT):
        try:
            return parse_duration(str(node.value))
        except ValueError:
            pass
    ctx.error(node, path, f"expected a duration like 500ms, 1s, 5m, 1h, 1d, found {kind(node)}")
    return None


def plain(node: Node) -> Any:
    """The Python value of a YAML subtree (for free-form maps such as ``metadata``)."""
    constructor = yaml.constructor.SafeConstructor()
    return constructor.construct_object(node, deep=True)


def read_replaces(ctx: Ctx, node: Node, path: str, own: str) -> tuple[str, ...]:
    """A ``replaces`` list of ``{name: ...}`` maps (``own``: the rule's own name, which it
    may not replace)."""
    names: list[str] = []
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list, found {kind(node)}")
        return ()
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
    return tuple(names)
