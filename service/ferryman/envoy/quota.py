"""The rate limit quota filter (``envoy.filters.http.rate_limit_quota``) for a domain: one
bucket matcher per rule path, whose predicate matches what the path's descriptor would and
whose bucket id builder sends the path's entries, so that ferryman walks the id to the rule.

Every bucket gets the settings Envoy 1.40 survives: ALLOW_ALL before the first assignment
and once one has expired (a token bucket there crashes Envoy 1.40), and a 429 when denied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ferryman.core.rules import Rule
from ferryman.errors import SettingsError

__all__ = [
    "BUCKET_SETTINGS",
    "ENVOY_HEADER",
    "QUOTA_FILTER",
    "SOURCE_IP",
    "bucket_matchers",
    "quota_filter",
]

_TYPE = "type.googleapis.com/"
QUOTA_FILTER = "envoy.filters.http.rate_limit_quota"
_CONFIG = _TYPE + "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
BUCKET_SETTINGS = (
    _TYPE + "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"
)
_HEADER_INPUT = _TYPE + "envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
SOURCE_IP = _TYPE + "envoy.extensions.matching.common_inputs.network.v3.SourceIPInput"
#: The stream's initial metadata that names the Envoy on ferryman's pages (the service reads
#: it as ``apis.rlqs.ENVOY_HEADER``; the Envoy tools import nothing of the service's APIs).
ENVOY_HEADER = "ferryman-envoy"
# Envoy 1.40 reports every 5 s whatever this says (``apis.rlqs_shares.REPORT_SECONDS``).
_REPORTING = "5s"


def _input(key: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """Where the value of descriptor key ``key`` is read from."""
    if key == "remote_address" and key not in headers:
        return {"name": "source_ip", "typed_config": {"@type": SOURCE_IP}}
    header = headers.get(key, key.lower())
    return {
        "name": f"header:{header}",
        "typed_config": {"@type": _HEADER_INPUT, "header_name": header},
    }


def _predicate(rule: Rule, headers: Mapping[str, str]) -> dict[str, Any] | None:
    """The predicate on one level (None: ``generic_key``, a constant, always there)."""
    if rule.key == "generic_key" and rule.key not in headers:
        return None
    if not rule.value:
        match: dict[str, Any] = {"safe_regex": {"google_re2": {}, "regex": ".*"}}
    elif rule.is_wildcard:
        match = {"safe_regex": {"google_re2": {}, "regex": rule.pattern.pattern}}
    else:
        match = {"exact": rule.value}
    return {"single_predicate": {"input": _input(rule.key, headers), "value_match": match}}


def _value(rule: Rule, headers: Mapping[str, str]) -> dict[str, Any]:
    if rule.key == "generic_key" and rule.key not in headers:
        return {"string_value": rule.value.replace("*", "") or "generic_key"}
    if rule.value and not rule.is_wildcard:
        return {"string_value": rule.value}
    return {"custom_value": _input(rule.key, headers)}


def _settings(path: Sequence[Rule], headers: Mapping[str, str]) -> dict[str, Any]:
    return {
        "@type": BUCKET_SETTINGS,
        "bucket_id_builder": {
            "bucket_id_builder": {rule.key: _value(rule, headers) for rule in path}
        },
        "reporting_interval": _REPORTING,
        "deny_response_settings": {"http_status": {"code": 429}},
        "no_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": "ALLOW_ALL"}},
        "expired_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": "ALLOW_ALL"}},
    }


def _specificity(path: Sequence[Rule]) -> tuple[tuple[int, ...], int]:
    # As ShouldRateLimit at each level: exact, then wildcard, then the bare key; the longer
    # of two paths that agree so far first (it is the more specific).
    levels = tuple(0 if r.value and not r.is_wildcard else 1 if r.value else 2 for r in path)
    return levels, -len(path)


def bucket_matchers(
    paths: Sequence[tuple[Rule, ...]], headers: Mapping[str, str]
) -> dict[str, Any]:
    """The filter's ``bucket_matchers``: the first path a request matches is its bucket (a
    path of constants only, which every request matches, is the one taken when none does)."""
    matchers: list[dict[str, Any]] = []
    otherwise: dict[str, Any] | None = None
    for path in sorted(paths, key=_specificity):
        keys = [r.key for r in path]
        if len(set(keys)) != len(keys):
            raise SettingsError(
                f"{path[-1].source}: the path repeats a key ({', '.join(keys)}): "
                "a bucket id holds each key once"
            )
        action = {"name": path[-1].stats_key, "typed_config": _settings(path, headers)}
        predicates = [p for rule in path if (p := _predicate(rule, headers)) is not None]
        if not predicates:
            otherwise = otherwise or {"action": action}
            continue
        predicate = (
            predicates[0] if len(predicates) == 1 else {"and_matcher": {"predicate": predicates}}
        )
        matchers.append({"predicate": predicate, "on_match": {"action": action}})
    out: dict[str, Any] = {"matcher_list": {"matchers": matchers}} if matchers else {}
    if otherwise is not None:
        out["on_no_match"] = otherwise
    return out


def quota_filter(
    domain: str,
    paths: Sequence[tuple[Rule, ...]],
    headers: Mapping[str, str],
    envoy: str | None,
    *,
    cluster: str = "ferryman",
    authority: str | None = None,
) -> dict[str, Any]:
    """The http filter: ferryman as the quota server over ``cluster``, the Envoy named
    ``envoy`` on ferryman's pages (None: no name is sent, and the pages show the Envoy's
    address; Envoy sends ``initial_metadata`` as written, with no substitution)."""
    grpc: dict[str, Any] = {"cluster_name": cluster}
    if authority is not None:
        grpc["authority"] = authority
    server: dict[str, Any] = {"envoy_grpc": grpc}
    if envoy is not None:
        server["initial_metadata"] = [{"key": ENVOY_HEADER, "value": envoy}]
    return {
        "name": QUOTA_FILTER,
        "typed_config": {
            "@type": _CONFIG,
            "domain": domain,
            "rlqs_server": server,
            "bucket_matchers": bucket_matchers(paths, headers),
        },
    }
