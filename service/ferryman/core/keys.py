"""Finding a descriptor's rule: the walk down a domain's tree, and the names (stats keys,
counter keys) a matched path gives a request."""

from __future__ import annotations

from collections.abc import Sequence

from ferryman.core.rules import Domain, Rule
from ferryman.stats import ValuePath

__all__ = ["cache_key", "ends_at", "segment", "stats_key", "tenant_key", "walk"]


def tenant_key(prefix: str, tag: str, rule: Rule, entries: Sequence[tuple[str, str]]) -> str:
    """The state of one tenant (the request's values) of a node, for kinds that keep one
    key per tenant: ``<prefix>ferryman_<tag>_{<stats key>|<values>}``, the braces its own
    Cluster hash tag."""
    return f"{prefix}ferryman_{tag}_{{{rule.stats_key}|{'_'.join(v for _, v in entries)}}}"


def segment(key: str, value: str) -> str:
    return f"{key}_{value}" if value else key


def ends_at(rule: Rule, rest: Sequence[tuple[str, str]]) -> bool:
    """Whether the entries after ``rule``'s (``rest``) are ones its limit reads itself
    (its ``trailing`` keys, in order: a cost budget's settle key and ``settle``) rather
    than levels of the tree; they never become part of a counter or stats key."""
    trailing: tuple[str, ...] = getattr(rule.limit, "trailing", ())
    return (
        bool(rest)
        and len(rest) <= len(trailing)
        and all(k == t for (k, _), t in zip(rest, trailing, strict=False))
    )


def walk(domain: Domain, entries: Sequence[tuple[str, str]]) -> list[Rule] | None:
    """The rules along the path of ``entries``, or None when the tree has no such path.

    At each level: the exact value first, then wildcards in config order, then the bare key.
    The walk stops early at a rule whose limit reads the entries left (``ends_at``).
    """
    level = domain.root
    path: list[Rule] = []
    last = len(entries) - 1
    for i, (key, value) in enumerate(entries):
        rule = level.match(key, value)
        if rule is None:
            return None
        path.append(rule)
        if i < last and rule.limit is not None and ends_at(rule, entries[i + 1 :]):
            return path
        level = rule.children
    return path


def stats_key(
    domain: str, entries: Sequence[tuple[str, str]], path: Sequence[Rule]
) -> tuple[str, tuple[str, ...]]:
    """The rule's stats key and its parts (domain, level1, ...), request values included
    where ``detailed_metric`` or ``value_to_metric`` ask for them."""
    last = path[-1]
    if last.detailed_metric:
        parts = [
            segment(k, rule.value if rule.share_threshold else v)
            for (k, v), rule in zip(entries, path, strict=True)
        ]
        return domain + "." + ".".join(parts), ValuePath((domain, *parts), last.stats_path)
    for rule in path:
        if rule.value_to_metric:
            break
    else:
        return last.stats_key, last.stats_path
    parts = []
    for (k, v), rule in zip(entries, path, strict=True):
        if rule.value_to_metric:
            parts.append(segment(k, rule.value if rule.share_threshold else v))
        else:
            parts.append(segment(rule.key, rule.value))
    return domain + "." + ".".join(parts), ValuePath((domain, *parts), last.stats_path)


def cache_key(
    prefix: str, domain: str, entries: Sequence[tuple[str, str]], path: Sequence[Rule] | None
) -> str:
    """The reference's counter key without its window: ``<prefix><domain>_<k>_<v>_...``
    (a ``share_threshold`` level counts under its pattern, not the request's value)."""
    parts = [prefix, domain, "_"]
    for i, (k, v) in enumerate(entries):
        if path is not None and path[i].share_threshold:
            v = path[i].value
        parts.append(f"{k}_{v}_")
    return "".join(parts)
