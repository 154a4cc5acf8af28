"""What a config API token may reach: the domains and namespaces its documents define.

A token file line may end with scopes (``token user role scope...``): globs of the domains
and quota namespaces the token may read (role read) or change (role write). Without scopes
a token reaches everything, as before. A document's scopes are read from its YAML node tree
the way the loader chooses its kind (a quota file, capacity resources, the access policy,
else a descriptor domain): the namespaces of a quota file, ``@resources`` or ``@access``
for a capacity or access policy file, which only an unscoped token reaches (so does
anything spanning every document: the history, diffs, a rollback), else its domain.

A document written through the config API is read strictly first (:func:`read_scopes`):
every map key a string, every value one its YAML tag can hold, and only YAML's own tags;
otherwise a ConfigError names its file and line, before anything else reads it.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.core.nodes import STR, Ctx, compose, join, kind, mapping, string
from ferryman.errors import ConfigError, PermissionDeniedError

__all__ = ["ALL", "document_scopes", "reaches", "read_scopes", "require_scopes"]

#: The scope of what spans every document (only an unscoped token, ``*``, reaches it).
ALL = "@all"
_UNREADABLE = "@unreadable"
#: The root keys that make a file a quota file (``config/quota.QUOTA_KEYS``).
_QUOTA_KEYS = ("namespaces", "global_default_bucket")
_CORE = "tag:yaml.org,2002:"
_TAGS = frozenset(
    _CORE + name
    for name in (
        *("null", "bool", "int", "float", "str", "binary", "timestamp"),
        *("seq", "map", "set", "omap", "pairs", "merge"),
    )
)
# Scalars whose value the loader (or a free-form map) turns into something else than text.
_VALUES = frozenset(_CORE + n for n in ("null", "bool", "int", "float", "binary", "timestamp"))
# Enough to fix a document by; the loader lists every problem of a readable one.
MAX_PROBLEMS = 50


def _check(ctx: Ctx, root: Node) -> None:
    """Report non-string map keys, tags YAML's safe reader does not know, and scalars their
    tag cannot hold (``!!int abc``, ``!!bool access``, a 5,000-digit number)."""
    constructor = yaml.constructor.SafeConstructor()
    seen: set[int] = set()
    stack: list[tuple[Node, str]] = [(root, "")]
    while stack and len(ctx.problems) < MAX_PROBLEMS:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag not in _TAGS:
            ctx.error(node, path, f"the YAML tag {node.tag[:60]!r} is not supported")
        elif isinstance(node, ScalarNode) and node.tag in _VALUES:
            try:
                constructor.construct_object(node)
            except Exception as exc:  # PyYAML's constructors raise whatever their parsing does
                why = (str(exc).splitlines() or [""])[0][:80]
                tag = node.tag.removeprefix(_CORE)
                ctx.error(node, path, f"{node.value[:40]!r} cannot be read as !!{tag} ({why})")
        elif isinstance(node, MappingNode):
            for key, value in reversed(node.value):
                if key.tag == _CORE + "merge":
                    stack.append((value, path))
                elif not isinstance(key, ScalarNode) or key.tag != STR:
                    shown = key.value[:40] if isinstance(key, ScalarNode) else kind(key)
                    ctx.error(key, path, f"map key {shown!r} is not a string")
                else:
                    stack.append((value, join(path, key.value)))
        elif isinstance(node, SequenceNode):
            stack.extend(
                (item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node.value)))
            )


def _scopes(ctx: Ctx, root: Node | None) -> set[str]:
    if not isinstance(root, MappingNode):
        return {_UNREADABLE}
    keys = {k.value for k, _ in root.value if isinstance(k, ScalarNode)}
    if keys.intersection(_QUOTA_KEYS):  # in the loader's order: quota, resources, access
        fields = mapping(ctx, root, "")
        found = {"@global_default_bucket"} if "global_default_bucket" in fields else set()
        namespaces = fields.get("namespaces")
        if isinstance(namespaces, MappingNode):
            found |= set(mapping(ctx, namespaces, "namespaces"))
        return found or {_UNREADABLE}
    if "resources" in keys:
        return {"@resources"}
    if "access" in keys:
        return {"@access"}
    domain = string(ctx, mapping(ctx, root, "").get("domain"), "domain")
    return {domain} if domain else {_UNREADABLE}


def read_scopes(name: str, text: str) -> set[str]:
    """The scopes of a document about to be written; ConfigError with the file and line of
    each problem when it is not strictly readable (see the module's docstring)."""
    ctx = Ctx(name, [])
    root = compose(ctx, text)
    if root is not None:
        _check(ctx, root)
    if ctx.problems:
        raise ConfigError(ctx.problems)
    return _scopes(Ctx(name, []), root)


def document_scopes(text: str | None, name: str = "document") -> set[str]:
    """The domains and namespaces one document's text defines (none for no document); one
    that cannot be read strictly reaches ``@unreadable``, which only ``*`` reaches."""
    if text is None:
        return set()
    try:
        return read_scopes(name, text)
    except ConfigError:
        return {_UNREADABLE}


def reaches(scopes: tuple[str, ...], wanted: Iterable[str]) -> bool:
    """Whether ``scopes`` reach every one of ``wanted``."""
    return all(any(fnmatchcase(w, s) for s in scopes) for w in wanted)


def require_scopes(user: str, role: str, scopes: tuple[str, ...], wanted: Iterable[str]) -> None:
    """PermissionDeniedError naming the first of ``wanted`` that ``scopes`` do not reach."""
    for scope in sorted(set(wanted)):
        if not reaches(scopes, (scope,)):
            shown = "every document" if scope == ALL else repr(scope)
            raise PermissionDeniedError(f"{user}'s token may not {role} {shown} (its scopes)")
