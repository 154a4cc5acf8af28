"""The rate limit quota filters of a set of files, for ``ferryman envoy check``: each bucket
matcher's bucket id builder becomes one entry whose parts are the id's entries, in the
order ferryman walks a bucket id down the filter domain's tree, so that the check reports
the rule each builder reaches like a ``rate_limits`` entry's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ferryman.core.rules import Level
from ferryman.envoy.actions import Entry, Filter, Part

__all__ = ["QUOTA_TYPE", "QuotaBucket", "ordered", "quota_buckets", "quota_entry"]

QUOTA_TYPE = "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
_SETTINGS_TYPE = "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"


@dataclass(frozen=True)
class QuotaBucket:
    """One bucket matcher of a quota filter: its id's entries (a fixed value, or None for
    one read from the request, ``source`` saying where)."""

    file: str
    where: str
    domain: str
    parts: tuple[Part, ...]


def _part(key: str, builder: Any) -> Part:
    custom = builder.custom_value
    if custom is None:
        return Part(key, builder.string_value, "string_value")
    typed = custom.typed_config
    source = typed.type_url.rsplit(".", 1)[-1] if typed is not None else custom.name
    if typed is not None and typed.type_url.endswith("HttpRequestHeaderMatchInput"):
        source = f"request header {typed.unpack().header_name}"
    # Envoy leaves a bucket id without the entry when the request lacks it.
    return Part(key, None, source)


def _actions(matcher: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Every action of a matcher, matchers nested under a match included."""
    if matcher is None:
        return
    listed = matcher.matcher_list
    for i, field_matcher in enumerate(listed.matchers if listed is not None else ()):
        yield from _on_match(field_matcher.on_match, f"{where}.matcher_list.matchers[{i}]")
    yield from _on_match(matcher.on_no_match, f"{where}.on_no_match")


def _on_match(on_match: Any, where: str) -> Iterator[tuple[str, Any]]:
    if on_match is None:
        return
    if on_match.action is not None:
        yield f"{where}.action", on_match.action
    elif on_match.matcher is not None:
        yield from _actions(on_match.matcher, f"{where}.matcher")


def quota_buckets(file: str, where: str, http_filter: Any) -> list[QuotaBucket]:
    """The buckets of one http filter ([] unless it is a rate limit quota filter)."""
    config = http_filter.typed_config
    if config is None or not config.type_url.endswith(QUOTA_TYPE):
        return []
    quota = config.unpack()
    out = []
    base = f"{where}.typed_config.bucket_matchers"
    for at, action in _actions(quota.bucket_matchers, base):
        typed = action.typed_config
        if typed is None or not typed.type_url.endswith(_SETTINGS_TYPE):
            continue
        builders: Mapping[str, Any] = typed.unpack().bucket_id_builder.bucket_id_builder
        parts = tuple(_part(key, builder) for key, builder in builders.items())
        out.append(QuotaBucket(file, at, quota.domain, parts))
    return out


def ordered(root: Level, parts: tuple[Part, ...]) -> tuple[Part, ...]:
    """``parts`` in the order ferryman walks a bucket id: at each level the first node (in
    config order) whose key the id has; a value read from the request follows the first
    node of its key. What no level takes stays at the end, in the id's order."""
    left = {p.key: p for p in parts}
    out: list[Part] = []
    level = root
    while left:
        for rule in level.rules:
            part = left.get(rule.key)
            if part is None:
                continue
            if part.value is None or level.match(part.key, part.value) is rule:
                out.append(left.pop(rule.key))
                level = rule.children
                break
        else:
            break
    return (*out, *left.values())


def quota_entry(bucket: QuotaBucket, root: Level | None) -> Entry:
    """The bucket as an entry of the check, sent to its filter's domain."""
    parts = bucket.parts if root is None else ordered(root, bucket.parts)
    own = Filter(bucket.file, bucket.where, bucket.domain, 0, False, "quota", "")
    return Entry(bucket.file, bucket.where, 0, parts, domain=bucket.domain, filters=(own,))
