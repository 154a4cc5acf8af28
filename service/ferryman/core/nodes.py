"""Reading YAML node trees so that every problem names its file, line, column and path.

Every configuration file kind (descriptor domains, capacity resources, quota buckets) is
composed into a node tree and read with these helpers. A reader reports problems into a
``Ctx`` and goes on, so that one pass lists every problem of a file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.core.rules import REFERENCE_KEYS
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
    "go_int",
    "is_null",
    "join",
    "kind",
    "mapping",
    "number",
    "plain",
    "read_replaces",
    "reference_shape",
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
    """One file being read: its name, the problems found so far, notes on normalization,
    and warnings: what the reference service accepts and ferryman reads no differently
    but would rather not see (refused under STRICT_CONFIG)."""

    file: str
    problems: list[ConfigProblem]
    active: set[int] = field(default_factory=set)  # node lists being read (alias loops)
    notes: list[str] = field(default_factory=list)  # what normalization changed
    warnings: list[ConfigProblem] = field(default_factory=list)

    def error(self, node: Node | None, path: str, message: str) -> None:
        self.problems.append(self._problem(node, path, message))

    def warn(self, node: Node | None, path: str, message: str) -> None:
        self.warnings.append(self._problem(node, path, message))

    def _problem(self, node: Node | None, path: str, message: str) -> ConfigProblem:
        line = col = None
        if node is not None:
            line, col = node.start_mark.line + 1, node.start_mark.column + 1
        return ConfigProblem(self.file, line, col, path, message)

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
        root = _first_document(ctx, text)
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


def _first_document(ctx: Ctx, text: str) -> Node | None:
    """The file's first YAML document. The reference reads a file as its first document
    and never looks at the others, so each one after it is a warning, not read."""
    documents = yaml.compose_all(text, Loader=yaml.SafeLoader)
    root = next(documents, None)
    for i, extra in enumerate(documents, start=2):
        if extra is not None:
            ctx.warn(
                extra,
                "",
                f"YAML document {i} is not read: a file is read as its first document, "
                "as the reference reads it (put each domain in a file of its own)",
            )
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


def _entries(ctx: Ctx, node: MappingNode, path: str) -> tuple[list[Any], int]:
    try:
        return _flatten(node)
    except ValueError as exc:
        ctx.error(node, path, str(exc))
        return [(k, v) for k, v in node.value if k.tag != _MERGE], 0


def mapping(
    ctx: Ctx,
    node: Node,
    path: str,
    allowed: frozenset[str] | None = None,
    *,
    reference: bool = False,
) -> dict[str, Node]:
    """The entries of a YAML mapping, with bad keys reported (any key when ``allowed`` is None).

    ``reference``: a map the reference service reads (a domain, a descriptor, its
    ``rate_limit``, a ``replaces`` entry), read by its rules: one of its keys where it is
    not read is ignored with a warning, a null is no value, a repeated key is read from its
    last place (with a warning), a number it does not take is refused."""
    if not isinstance(node, MappingNode):
        ctx.error(node, path, f"expected a map, found {kind(node)}")
        return {}
    entries, n_inherited = _entries(ctx, node, path)
    out: dict[str, Node] = {}
    first: dict[str, Node] = {}  # own keys read so far, at their first place
    for i, (key_node, value_node) in enumerate(entries):
        if not isinstance(key_node, ScalarNode) or key_node.tag != STR:
            shown = key_node.value if isinstance(key_node, ScalarNode) else kind(key_node)
            ctx.error(key_node, path, f"map key {shown!r} is not a string")
            continue
        key = key_node.value
        kpath = join(path, key)
        ours = reference and key in REFERENCE_KEYS
        if allowed is not None and key not in allowed:
            if ours:
                ctx.warn(key_node, kpath, f"{key!r} is not read here: ignored, {_IGNORED}")
                reference_shape(ctx, value_node, kpath)
                continue
            hint = ", ".join(sorted(allowed))
            why = _ONLY_SOME.get(key, "unknown key")
            ctx.error(key_node, kpath, f"{why} {key!r} (expected one of: {hint})")
            continue
        if i >= n_inherited and key in first:
            if not reference:
                ctx.error(key_node, path, f"key {key!r} appears twice")
                continue
            line = first[key].start_mark.line + 1
            ctx.warn(key_node, kpath, f"{key!r} appears twice (first on line {line}): {_REPEAT}")
            value_node = _repeated(key, out.get(key), value_node)
        if i >= n_inherited:
            first.setdefault(key, key_node)
        if ours and key != "metadata":
            refused = _refused_scalar(value_node)
            if refused is not None:
                ctx.error(value_node, kpath, refused)
                continue
        if ours and is_null(value_node):
            out.pop(key, None)  # the reference reads a null as the field's zero value
            continue
        out[key] = value_node
    return out


_IGNORED = "as the reference ignores it (it accepts each of its keys anywhere)"
_REPEAT = "the last one is read, as the reference reads it"


def _repeated(key: str, before: Node | None, after: Node) -> Node:
    """What a repeated key stands for: its last value, except that the reference reads a
    repeated ``rate_limit`` map into the one it read before (keys the later map lacks keep
    the earlier map's values)."""
    if key == "rate_limit" and isinstance(before, MappingNode) and isinstance(after, MappingNode):
        later = {k.value for k, _ in after.value if isinstance(k, ScalarNode)}
        kept = [(k, v) for k, v in before.value if getattr(k, "value", None) not in later]
        return MappingNode(after.tag, kept + list(after.value), after.start_mark, after.end_mark)
    return after


# How the reference's YAML reader resolves a plain scalar to a number: a float, or an
# integer beyond 64 bits, is a value it refuses anywhere but under ``metadata``.
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_SPECIAL = frozenset(
    f"{sign}.{word}"
    for sign, words in (("", ("nan", "NaN", "NAN")), *((s, ("inf", "Inf", "INF")) for s in "+-"))
    for word in words
) | {".inf", ".Inf", ".INF"}
_DIGITS = "0123456789abcdef"


def go_int(text: str) -> int | None:
    """``text`` as the reference's YAML reader reads an integer (Go's base prefixes 0x,
    0o, 0b and a leading 0 for octal, underscores ignored), or None when it is not one."""
    body = text.replace("_", "")
    sign = -1 if body[:1] == "-" else 1
    body = body[1:] if body[:1] in "+-" else body
    base, digits = 10, body
    prefix = body[:2].lower()
    if prefix in ("0x", "0o", "0b"):
        base, digits = {"0x": 16, "0o": 8, "0b": 2}[prefix], body[2:]
    elif len(body) > 1 and body[0] == "0":
        base, digits = 8, body[1:]
    if not digits or any(c not in _DIGITS[:base] for c in digits.lower()):
        return None
    return sign * int(digits, base)


def _refused_scalar(node: Node) -> str | None:
    """Why the reference refuses this value wherever it is (None when it does not)."""
    if not isinstance(node, ScalarNode) or node.style is not None:
        return None
    text = node.value
    number = go_int(text) if text[:1] in "0123456789+-" else None
    if number is not None:
        if number >= 2**63:
            return f"{text} is past 64 bits: the reference refuses the file (quote it for text)"
        return None
    plain = text.replace("_", "")
    if text in _GO_SPECIAL or (text[:1] in "0123456789+-." and _GO_FLOAT.fullmatch(plain)):
        return (
            f"{text} is a number with a fraction: the reference refuses the file with it here "
            "(quote it for text, write a whole number for a count)"
        )
    return None


def reference_shape(ctx: Ctx, node: Node, path: str, within: frozenset[int] = frozenset()) -> None:
    """Check a value that is not read as the reference checks every value: each map key one
    of its keys, each list item a map, no number it refuses (``metadata`` is free)."""
    if id(node) in within:
        return
    within = within | {id(node)}
    if isinstance(node, MappingNode):
        for key_node, value in _entries(ctx, node, path)[0]:
            key = key_node.value if isinstance(key_node, ScalarNode) else None
            if key_node.tag != STR or key not in REFERENCE_KEYS:
                ctx.error(key_node, path, f"unknown key {key!r}: the reference refuses the file")
            elif key != "metadata":
                reference_shape(ctx, value, join(path, key), within)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            if not isinstance(item, MappingNode):
                message = (
                    f"a list item that is not a map ({kind(item)}): the reference refuses the file"
                )
                ctx.error(item, f"{path}[{i}]", message)
            else:
                reference_shape(ctx, item, f"{path}[{i}]", within)
    else:
        refused = _refused_scalar(node)
        if refused is not None:
            ctx.error(node, path, refused)


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
    if isinstance(node, ScalarNode) and node.style is None and node.value in _SHORT_BOOLS:
        return node.value in "yY"  # YAML 1.1's y and n, which the reference reads as booleans
    if not isinstance(node, ScalarNode) or node.tag != BOOL:
        ctx.error(node, path, f"expected true or false, found {kind(node)}")
        return False
    return str(node.value).lower() in ("true", "yes", "on", "y")


_SHORT_BOOLS = frozenset({"y", "Y", "n", "N"})


def whole(
    ctx: Ctx, node: Node | None, path: str, minimum: int = 0, maximum: int = 2**63 - 1
) -> int | None:
    """A whole number in [minimum, maximum], or None (reported) when it is anything else."""
    if node is None:
        return None
    # Whole numbers as the reference reads them: 0o17 is one, a base-60 1:30 is not.
    value = go_int(node.value) if isinstance(node, ScalarNode) and node.style is None else None
    if value is None or node.tag not in (INT, STR):
        ctx.error(node, path, f"expected a whole number, found {kind(node)}")
        return None
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
        item_fields = mapping(ctx, item, ipath, frozenset({"name"}), reference=True)
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
