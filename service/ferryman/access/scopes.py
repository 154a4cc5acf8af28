"""What a config API token may reach: the domains and namespaces its documents define.

A token file line may end with scopes (``token user role scope...``): globs of the domains
and quota namespaces the token may read (role read) or change (role write). Without scopes
a token reaches everything, as before. A document's scopes are read from its YAML: the
domain of a descriptor file, the namespaces of a quota file, and ``@resources`` or
``@access`` for a capacity or access policy file, which only an unscoped token reaches (so
does anything spanning every document: the history, diffs, a rollback).
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

import yaml

from ferryman.errors import PermissionDeniedError

__all__ = ["ALL", "document_scopes", "require_scopes"]

#: The scope of what spans every document (only an unscoped token, ``*``, reaches it).
ALL = "@all"
_UNREADABLE = "@unreadable"


def document_scopes(text: str | None) -> set[str]:
    """The domains and namespaces one document's text defines (none for no document)."""
    if text is None:
        return set()
    try:
        root = yaml.safe_load(text)
    except yaml.YAMLError:
        return {_UNREADABLE}
    if not isinstance(root, dict):
        return {_UNREADABLE}
    if "access" in root:
        return {"@access"}
    if "resources" in root:
        return {"@resources"}
    if "namespaces" in root or "global_default_bucket" in root:
        namespaces = root.get("namespaces") or {}
        names = {str(n) for n in namespaces} if isinstance(namespaces, dict) else set()
        return names | ({"@global_default_bucket"} if "global_default_bucket" in root else set())
    domain = root.get("domain")
    return {str(domain)} if isinstance(domain, str) and domain else {_UNREADABLE}


def require_scopes(user: str, role: str, scopes: tuple[str, ...], wanted: Iterable[str]) -> None:
    """PermissionDeniedError naming the first of ``wanted`` that ``scopes`` do not reach."""
    for scope in sorted(set(wanted)):
        if not any(fnmatchcase(scope, s) for s in scopes):
            shown = "every document" if scope == ALL else repr(scope)
            raise PermissionDeniedError(f"{user}'s token may not {role} {shown} (its scopes)")
