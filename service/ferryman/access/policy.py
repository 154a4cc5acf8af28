"""The access policy file: which identities may do what, read with file and line.

A file whose root map has an ``access`` key is the policy (at most one per directory)::

    access:
      - identities: ["spiffe://mesh/ns/edge/sa/*"]   # exact names or globs
        allow:
          rls: ["checkout", "search"]                # domains
          negative_hits: [checkout]
      - identities: [anonymous]                      # callers without a client certificate
        allow: {rls: ["*"]}
      - identities: ["spiffe://mesh/ns/batch/sa/*"]
        allow: {holds: [jobs]}
        max_priority: 5                              # the highest a waiter may claim


Each permission takes a list of scopes (domains, namespaces or resources, each exact or a
glob); ``true`` is every scope. A caller holds the union of the grants whose identities
match any of its certificate's names. ``max_priority`` (0 unless a grant says more) caps the
priority a caller may claim for its place in a queue: the highest of the grants naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from types import MappingProxyType

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ferryman.core.nodes import BOOL, Ctx, join, kind, mapping, string, whole

__all__ = [
    "ACCESS_KEY",
    "ANONYMOUS",
    "MAX_PRIORITY",
    "PERMISSIONS",
    "Grant",
    "Policy",
    "is_access_file",
    "read_access",
]

ACCESS_KEY = "access"
#: The identity of a caller that shows no client certificate.
ANONYMOUS = "anonymous"

#: Every permission a grant may name, and what it scopes.
PERMISSIONS: Mapping[str, str] = MappingProxyType(
    {
        "rls": "domains asked through Envoy's ShouldRateLimit (and POST /json)",
        "negative_hits": "domains a caller may send negative hits to",
        "overrides": "domains a caller may send its own limit (descriptor.limit) to",
        "settle_for": (
            "domains whose cost-budget reservations a caller may settle for the identity "
            "that made them (never below their estimate)"
        ),
        "rlqs": "domains asked through Envoy's rate limit quota service",
        "request": "domains asked through ferryman.v1 Request",
        "holds": "domains whose copies a caller may reserve, release, transfer and seize",
        "lease": "resources a caller may lease as a client (GetCapacity, ReleaseCapacity)",
        "lease_server": "resources a caller may lease as a server (GetServerCapacity)",
        "quota": "namespaces asked through the quota service's Allow",
        "quota_watch": "namespaces whose bucket events a caller may watch",
        "debug": "the debug port's pages (scope: the page's path)",
    }
)

_GRANT_KEYS = frozenset({"identities", "allow", "max_priority"})
#: The highest priority a waiter may ask for (ReserveRequest.priority); higher is first.
MAX_PRIORITY = 1000
_EVERY = ("*",)


@dataclass(frozen=True)
class Grant:
    """One entry: the identities (exact or globs) and their permissions -> scopes."""

    identities: tuple[str, ...]
    permissions: Mapping[str, tuple[str, ...]]
    line: int
    max_priority: int = 0

    def names(self, names: tuple[str, ...]) -> bool:
        return any(fnmatchcase(name, p) for p in self.identities for name in names)


@dataclass(frozen=True)
class Policy:
    """Every grant of the policy file."""

    file: str
    grants: tuple[Grant, ...]

    def allows(self, names: tuple[str, ...], permission: str, scope: str) -> bool:
        """Whether a caller known by ``names`` may use ``permission`` on ``scope``."""
        for grant in self.grants:
            scopes = grant.permissions.get(permission)
            if scopes and grant.names(names) and any(fnmatchcase(scope, s) for s in scopes):
                return True
        return False

    def max_priority(self, names: tuple[str, ...]) -> int:
        """The highest priority a caller known by ``names`` may claim (0 by default)."""
        return max((g.max_priority for g in self.grants if g.names(names)), default=0)


def is_access_file(root: Node | None) -> bool:
    return isinstance(root, MappingNode) and any(
        isinstance(k, ScalarNode) and k.value == ACCESS_KEY for k, _ in root.value
    )


def read_access(ctx: Ctx, root: Node) -> Policy:
    """The policy of one file; problems go to ``ctx`` (with file, line and path)."""
    fields = mapping(ctx, root, "", frozenset({ACCESS_KEY}))
    node = fields.get(ACCESS_KEY)
    grants: list[Grant] = []
    if not isinstance(node, SequenceNode):
        ctx.error(node or root, ACCESS_KEY, "expected a list of grants")
        return Policy(ctx.file, ())
    for i, item in enumerate(node.value):
        grant = _grant(ctx, item, f"{ACCESS_KEY}[{i}]")
        if grant is not None:
            grants.append(grant)
    return Policy(ctx.file, tuple(grants))


def _grant(ctx: Ctx, node: Node, path: str) -> Grant | None:
    if not isinstance(node, MappingNode):
        ctx.error(node, path, f"a grant must be a map, found {kind(node)}")
        return None
    fields = mapping(ctx, node, path, _GRANT_KEYS)
    identities = _strings(ctx, fields.get("identities"), join(path, "identities"))
    if not identities:
        ctx.error(fields.get("identities", node), join(path, "identities"), "name one or more")
    allow = fields.get("allow")
    permissions: dict[str, tuple[str, ...]] = {}
    if allow is None:
        ctx.error(node, join(path, "allow"), "a grant must allow something")
    else:
        where = join(path, "allow")
        for name, value in mapping(ctx, allow, where, frozenset(PERMISSIONS)).items():
            permissions[name] = _scopes(ctx, value, join(where, name))
    top = whole(ctx, fields.get("max_priority"), join(path, "max_priority"), 0, MAX_PRIORITY)
    line = node.start_mark.line + 1
    return Grant(tuple(identities), MappingProxyType(permissions), line, top or 0)


def _scopes(ctx: Ctx, node: Node, path: str) -> tuple[str, ...]:
    if isinstance(node, ScalarNode) and node.tag == BOOL:
        return _EVERY if node.value.lower() == "true" else ()
    return tuple(_strings(ctx, node, path))


def _strings(ctx: Ctx, node: Node | None, path: str) -> list[str]:
    if node is None:
        return []
    if isinstance(node, ScalarNode):
        value = string(ctx, node, path)
        return [value] if value else []
    if not isinstance(node, SequenceNode):
        ctx.error(node, path, f"expected a list of names, found {kind(node)}")
        return []
    out = []
    for i, item in enumerate(node.value):
        value = string(ctx, item, f"{path}[{i}]")
        if value:
            out.append(value)
    return out
