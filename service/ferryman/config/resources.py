"""Reading a resources file (capacity leases): Doorman's YAML shape, top-level ``resources:``.

Each entry is a template: ``identifier_glob``, ``capacity``, ``safe_capacity``,
``description`` and ``algorithm: {kind, lease_length, refresh_interval,
learning_mode_duration, parameters}``, seconds as whole numbers. Problems name the file,
line, column and path, as descriptor problems do.
"""

from __future__ import annotations

from yaml.nodes import MappingNode, Node, SequenceNode

from ferryman.algorithms.leases.model import (
    AlgorithmSpec,
    Kind,
    ResourceTemplate,
    with_parameters,
)
from ferryman.core.nodes import Ctx, is_null, join, kind, mapping, number, string, whole

__all__ = ["is_resources_file", "read_resources"]

_TEMPLATE_KEYS = frozenset(
    {"identifier_glob", "capacity", "safe_capacity", "description", "algorithm"}
)
_ALGORITHM_KEYS = frozenset(
    {"kind", "lease_length", "refresh_interval", "learning_mode_duration", "parameters"}
)
_KINDS = ", ".join(k.name for k in Kind)
_MAX_SECONDS = 10 * 365 * 86400


def is_resources_file(root: Node | None) -> bool:
    """A file whose root map has a ``resources`` key holds templates, not a domain."""
    return isinstance(root, MappingNode) and any(
        getattr(key, "value", None) == "resources" for key, _ in root.value
    )


def _parameters(ctx: Ctx, node: Node, path: str) -> tuple[tuple[str, str], ...]:
    if is_null(node):
        return ()
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list of {{name, value}} maps, found {kind(node)}")
        return ()
    out: list[tuple[str, str]] = []
    for i, item in enumerate(node.value):
        ipath = f"{path}[{i}]"
        fields = mapping(ctx, item, ipath, frozenset({"name", "value"}))
        name = string(ctx, fields.get("name"), join(ipath, "name"))
        if isinstance(item, MappingNode) and not name:
            ctx.error(item, join(ipath, "name"), "a parameter needs a name")
            continue
        out.append((name, string(ctx, fields.get("value"), join(ipath, "value"))))
    return tuple(out)


def _algorithm(ctx: Ctx, node: Node, path: str) -> AlgorithmSpec | None:
    fields = mapping(ctx, node, path, _ALGORITHM_KEYS)
    if not isinstance(node, MappingNode):
        return None
    ok = True
    name = string(ctx, fields.get("kind"), join(path, "kind"))
    try:
        algorithm_kind = Kind[name]
    except KeyError:
        where = fields.get("kind", node)
        ctx.error(where, join(path, "kind"), f"kind {name!r} is not one of {_KINDS}")
        algorithm_kind, ok = Kind.FAIR_SHARE, False
    seconds: dict[str, int] = {}
    for key in ("lease_length", "refresh_interval"):
        if key not in fields:
            ctx.error(node, join(path, key), f"missing '{key}' (whole seconds)")
            ok = False
            continue
        value = whole(ctx, fields[key], join(path, key), 1, _MAX_SECONDS)
        if value is None:
            ok = False
        else:
            seconds[key] = value
    learning = None
    if "learning_mode_duration" in fields:
        learning = whole(
            ctx,
            fields["learning_mode_duration"],
            join(path, "learning_mode_duration"),
            -_MAX_SECONDS,
            _MAX_SECONDS,
        )
        ok = ok and learning is not None
    parameters: tuple[tuple[str, str], ...] = ()
    if "parameters" in fields:
        parameters = _parameters(ctx, fields["parameters"], join(path, "parameters"))
    if not ok:
        return None
    if seconds["refresh_interval"] > seconds["lease_length"]:
        ctx.error(
            fields["refresh_interval"],
            join(path, "refresh_interval"),
            f"refresh_interval {seconds['refresh_interval']} is longer than lease_length "
            f"{seconds['lease_length']}: leases would lapse between refreshes",
        )
        return None
    spec = AlgorithmSpec(
        algorithm_kind, seconds["lease_length"], seconds["refresh_interval"], learning, parameters
    )
    try:
        return with_parameters(spec)
    except ValueError as exc:
        ctx.error(fields.get("parameters", node), join(path, "parameters"), str(exc))
        return None


def _template(ctx: Ctx, node: Node, path: str) -> ResourceTemplate | None:
    fields = mapping(ctx, node, path, _TEMPLATE_KEYS)
    if not isinstance(node, MappingNode):
        return None
    glob = string(ctx, fields.get("identifier_glob"), join(path, "identifier_glob"))
    if not glob:
        where = fields.get("identifier_glob", node)
        ctx.error(where, join(path, "identifier_glob"), "identifier_glob must not be empty")
    capacity = None
    if "capacity" not in fields:
        ctx.error(node, join(path, "capacity"), "missing 'capacity'")
    else:
        capacity = number(ctx, fields["capacity"], join(path, "capacity"))
    safe = None
    if "safe_capacity" in fields and not is_null(fields["safe_capacity"]):
        safe = number(ctx, fields["safe_capacity"], join(path, "safe_capacity"), minimum=-1)
        if safe is not None and -1 < safe < 0:
            ctx.error(
                fields["safe_capacity"],
                join(path, "safe_capacity"),
                "safe_capacity is -1 (unlimited) or at least 0",
            )
            safe = None
    description = string(ctx, fields.get("description"), join(path, "description"))
    algorithm = None
    if "algorithm" not in fields:
        ctx.error(node, join(path, "algorithm"), "missing 'algorithm'")
    else:
        algorithm = _algorithm(ctx, fields["algorithm"], join(path, "algorithm"))
    if not glob or capacity is None or algorithm is None:
        return None
    return ResourceTemplate(
        glob, capacity, algorithm, safe, description, f"{ctx.file}:{node.start_mark.line + 1}"
    )


def read_resources(
    ctx: Ctx, root: Node, seen: dict[str, str] | None = None
) -> list[ResourceTemplate]:
    """The templates of one resources file; ``seen`` (glob -> where) spans every file."""
    seen = {} if seen is None else seen
    fields = mapping(ctx, root, "", frozenset({"resources"}))
    node = fields.get("resources")
    if node is None or is_null(node):
        return []
    if not isinstance(node, SequenceNode):
        ctx.error(node, "resources", f"expected a list of resource templates, found {kind(node)}")
        return []
    out: list[ResourceTemplate] = []
    for i, item in enumerate(node.value):
        path = f"resources[{i}]"
        template = _template(ctx, item, path)
        if template is None:
            continue
        glob = template.identifier_glob
        if glob in seen:
            ctx.error(item, path, f"identifier_glob {glob!r} is already defined at {seen[glob]}")
            continue
        seen[glob] = f"{ctx.file}:{item.start_mark.line + 1}"
        out.append(template)
    return out
