"""The Envoy pieces that make a domain's rules reachable: the rate limit filter, the ferryman
cluster, and per rule path a route whose ``rate_limits`` actions send that path's descriptor.

Well-known keys become their own actions (``remote_address``, ``destination_cluster``,
``source_cluster``, ``generic_key``); any other key is read from the request header of the
same name, or the one ``--header KEY=HEADER`` names.

A rule settled at stream end (a cost budget: its limit reads a settle key and ``settle``
after its own entries) gets two entries: the estimate at request time (``hits_addend``
from the ``estimate`` header) and the settlement when the stream ends (from the ``cost``
response header), paired by the settle key's header (``x-request-id`` unless mapped).
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from ferryman.algorithms import algorithm_of
from ferryman.config.model import Config
from ferryman.core.answers import EngineOptions
from ferryman.core.rules import Level, Limit, Rule
from ferryman.envoy.actions import RATELIMIT_FILTER
from ferryman.errors import NotFoundError, SettingsError
from ferryman.settings import split_address

__all__ = ["generate", "parse_headers", "rule_paths"]

_TYPE = "type.googleapis.com/"
_RL = _TYPE + "envoy.extensions.filters.http.ratelimit.v3.RateLimit"
_RL_ROUTE = _TYPE + "envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute"
_HCM = _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = _TYPE + "envoy.extensions.filters.http.router.v3.Router"
_H2 = _TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_CLUSTER = "ferryman"
_HEADER = re.compile(r"^:?[0-9a-zA-Z!#$%&'*+\-.^_|~`]+$")
# The headers a settled rule's entries read unless --header maps them: the request's
# estimate, the response's actual cost, and the id pairing the two calls.
SETTLED_HEADERS = {"estimate": "x-estimate-cost", "cost": "x-cost", "": "x-request-id"}


def parse_headers(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=HEADER`` flags as a mapping; SettingsError on a malformed one."""
    out = {}
    for pair in pairs:
        key, sep, header = pair.partition("=")
        if not sep or not key or not _HEADER.match(header):
            raise SettingsError(f"--header {pair!r}: expected KEY=HEADER (a header name)")
        out[key] = header.lower()
    return out


def rule_paths(config: Config, options: EngineOptions, domain: str) -> list[tuple[Rule, ...]]:
    """Every path from the root to a rule with a limit, in config order."""
    dom = config.domains.get(domain)
    if dom is None:
        known = ", ".join(sorted(config.domains)) or "none"
        raise NotFoundError("--domain", f"{domain!r} is not configured (known: {known})")
    out: list[tuple[Rule, ...]] = []

    def visit(level: Level, parents: tuple[Rule, ...]) -> None:
        for rule in level.rules:
            path = (*parents, rule)
            if rule.limit is not None:
                out.append(path)
            visit(rule.children, path)

    visit(dom.root, ())
    return out


def _fixed(rule: Rule) -> str:
    # A wildcard's stars stand for any run, the empty one included.
    return rule.value.replace("*", "") if rule.value else "any"


def _action(rule: Rule, headers: Mapping[str, str]) -> dict[str, Any]:
    if rule.key in headers:
        return {"request_headers": {"header_name": headers[rule.key], "descriptor_key": rule.key}}
    if rule.key == "remote_address":
        return {"remote_address": {}}
    if rule.key in ("destination_cluster", "source_cluster"):
        return {rule.key: {}}
    if rule.key == "generic_key":
        return {"generic_key": {"descriptor_value": _fixed(rule)}}
    if not _HEADER.match(rule.key):
        raise SettingsError(
            f"descriptor key {rule.key!r} ({rule.source}) is no header name: "
            f"map it with --header {rule.key}=HEADER"
        )
    return {"request_headers": {"header_name": rule.key.lower(), "descriptor_key": rule.key}}


def _held(limit: Limit | None) -> bool:
    return limit is not None and algorithm_of(limit.kind).held


def _settled(
    actions: list[dict[str, Any]], trailing: tuple[str, ...], headers: Mapping[str, str]
) -> list[dict[str, Any]]:
    """A settled rule's estimate and settlement entries (``trailing``: its settle key and
    the settlement's mark). Envoy reads ``hits_addend`` here only from a RateLimitPerRoute
    or the filter's own entries, never from a route's ``rate_limits``."""
    key, mark = trailing
    header = headers.get(key, SETTLED_HEADERS[""])
    pair = {"request_headers": {"header_name": header, "descriptor_key": key}}
    estimate = headers.get("estimate", SETTLED_HEADERS["estimate"])
    cost = headers.get("cost", SETTLED_HEADERS["cost"])
    settle = {"generic_key": {"descriptor_key": mark, "descriptor_value": "1"}}
    return [
        {"actions": [*actions, pair], "hits_addend": {"format": f"%REQ({estimate})%"}},
        {
            # Copies, so that the YAML repeats the actions rather than aliasing them.
            "actions": copy.deepcopy([*actions, pair, settle]),
            "apply_on_stream_done": True,
            "hits_addend": {"format": f"%RESP({cost})%"},
        },
    ]


def _limits(
    path: tuple[Rule, ...], limit: Limit | None, headers: Mapping[str, str]
) -> list[dict[str, Any]]:
    actions = [_action(rule, headers) for rule in path]
    trailing: tuple[str, ...] = getattr(limit, "trailing", ())
    if len(trailing) == 2:
        return _settled(actions, trailing, headers)
    limits: list[dict[str, Any]] = [{"actions": actions}]
    if _held(limit):
        # A held copy is given back when the request's stream ends.
        limits.append(
            {
                "actions": actions,
                "apply_on_stream_done": True,
                "hits_addend": {"number": 1, "is_negative_hits": True},
            }
        )
    return limits


def _slug(path: tuple[Rule, ...]) -> str:
    parts = [f"{r.key}_{r.value}" if r.value else r.key for r in path]
    return "/" + "/".join(re.sub(r"[^A-Za-z0-9._~-]+", "-", p) for p in parts) + "/"


def _address(text: str) -> tuple[str, int]:
    try:
        host, port = split_address(text)
    except (ValueError, SettingsError):
        raise SettingsError(f"{text!r} is not HOST:PORT") from None
    return host, port


def _cluster(name: str, target: str, http2: bool) -> dict[str, Any]:
    host, port = _address(target)
    try:
        ipaddress.ip_address(host)
        kind = "STATIC"
    except ValueError:
        kind = "STRICT_DNS"
    cluster: dict[str, Any] = {"name": name, "type": kind, "connect_timeout": "1s"}
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _H2,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    cluster["load_assignment"] = {
        "cluster_name": name,
        "endpoints": [
            {
                "lb_endpoints": [
                    {
                        "endpoint": {
                            "address": {"socket_address": {"address": host, "port_value": port}}
                        }
                    }
                ]
            }
        ],
    }
    return cluster


def _filter(domain: str) -> dict[str, Any]:
    return {
        "name": RATELIMIT_FILTER,
        "typed_config": {
            "@type": _RL,
            "domain": domain,
            "timeout": "0.5s",
            "failure_mode_deny": False,
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": _CLUSTER}},
            },
        },
    }


def _route(
    path: tuple[Rule, ...], limit: Limit | None, headers: Mapping[str, str]
) -> dict[str, Any]:
    limits = _limits(path, limit, headers)
    route: dict[str, Any] = {
        "name": path[-1].stats_key,
        "match": {"prefix": _slug(path)},
        "route": {"cluster": "upstream"},
    }
    if len(limits) == 1 and "hits_addend" not in limits[0]:
        route["route"]["rate_limits"] = limits
    else:
        # hits_addend and apply_on_stream_done are read from the filter's own rate_limits.
        route["typed_per_filter_config"] = {
            RATELIMIT_FILTER: {"@type": _RL_ROUTE, "rate_limits": limits}
        }
    return route


def _bootstrap(
    domain: str,
    routes: list[dict[str, Any]],
    ferryman: str,
    upstream: str,
    listen: int,
    http_filter: dict[str, Any] | None = None,
) -> dict[str, Any]:
    hcm = {
        "@type": _HCM,
        "stat_prefix": "ingress",
        "use_remote_address": True,
        "http_filters": [
            _filter(domain) if http_filter is None else http_filter,
            {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER}},
        ],
        "route_config": {
            "name": domain,
            "virtual_hosts": [
                {
                    "name": domain,
                    "domains": ["*"],
                    "routes": [
                        *routes,
                        {"match": {"prefix": "/"}, "route": {"cluster": "upstream"}},
                    ],
                }
            ],
        },
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9901}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "ingress",
                    "address": {"socket_address": {"address": "0.0.0.0", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                _cluster("upstream", upstream, http2=False),
                _cluster(_CLUSTER, ferryman, http2=True),
            ],
        },
    }


def _istio(domain: str, limits: list[dict[str, Any]], ferryman: str) -> list[dict[str, Any]]:
    host, _ = _address(ferryman)
    meta = {"namespace": "istio-system"}
    selector = {"labels": {"istio": "ingressgateway"}}
    hcm_match = {
        "context": "GATEWAY",
        "listener": {
            "filterChain": {
                "filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": "envoy.filters.http.router"},
                }
            }
        },
    }
    filt = _filter(domain)
    filt["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["authority"] = host
    patches = [
        {
            "applyTo": "CLUSTER",
            "match": {"context": "GATEWAY"},
            "patch": {"operation": "ADD", "value": _cluster(_CLUSTER, ferryman, http2=True)},
        },
        {
            "applyTo": "HTTP_FILTER",
            "match": hcm_match,
            "patch": {"operation": "INSERT_BEFORE", "value": filt},
        },
        {
            "applyTo": "VIRTUAL_HOST",
            "match": {
                "context": "GATEWAY",
                "routeConfiguration": {"vhost": {"name": "", "route": {"action": "ANY"}}},
            },
            "patch": {"operation": "MERGE", "value": {"rate_limits": limits}},
        },
    ]
    return [
        {
            "apiVersion": "networking.istio.io/v1alpha3",
            "kind": "EnvoyFilter",
            "metadata": {"name": f"ferryman-{domain}", **meta},
            "spec": {"workloadSelector": selector, "configPatches": patches},
        }
    ]


def _has_rate(limit: Limit | None) -> bool:
    """Whether a quota bucket can share the limit (a rate, or ``unlimited``)."""
    if limit is None:
        return False
    algorithm = algorithm_of(limit.kind)
    reported = algorithm.reported(limit)
    return algorithm.rate(limit) is not None or (reported is not None and reported.unlimited)


def _shared(paths: list[tuple[Rule, ...]]) -> tuple[list[tuple[Rule, ...]], str]:
    """The paths a quota bucket can share, and a comment naming the ones left out."""
    shared = [p for p in paths if _has_rate(p[-1].limit)]
    left = [p[-1].stats_key for p in paths if not _has_rate(p[-1].limit)]
    if not left:
        return shared, ""
    return (
        shared,
        f"# {', '.join(left)}: no rate to share (left out; ShouldRateLimit serves them).\n",
    )


def _quota(
    domain: str,
    paths: list[tuple[Rule, ...]],
    headers: Mapping[str, str],
    ferryman: str,
    upstream: str,
    listen: int,
    envoy: str,
) -> str:
    from ferryman.envoy.quota import quota_filter

    shared, left = _shared(paths)
    head = (
        f"# Generated by ferryman envoy generate --quota --domain {domain}: one quota bucket "
        "matcher per rule; Envoy enforces the shares ferryman assigns.\n"
    )
    http_filter = quota_filter(domain, shared, headers, envoy)
    tree = _bootstrap(domain, [], ferryman, upstream, listen, http_filter)
    return head + left + yaml.safe_dump(tree, sort_keys=False)


def _object_name(text: str, most: int = 200) -> str:
    """``text`` as a Kubernetes name or label value (lower case letters, digits, dashes)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower())[:most].strip("-") or "domain"


#: The pod label that puts a domain's quota filter on a pod's sidecar: sidecars opt in, so
#: that no request is counted twice unawares (at the gateway, then at its sidecar).
QUOTA_LABEL = "ferryman/quota"
_QUOTA_CLUSTER = "ferryman_quota"


def _envoyfilter(
    name: str,
    meta: dict[str, str],
    labels: dict[str, str],
    contexts: tuple[str, str],
    cluster: dict[str, Any],
    http_filter: dict[str, Any],
) -> dict[str, Any]:
    """An EnvoyFilter adding ``cluster`` (in ``contexts[0]``) and ``http_filter`` before the
    router of every HTTP connection manager (in ``contexts[1]``) of the selected proxies."""
    manager = {
        "name": "envoy.filters.network.http_connection_manager",
        "subFilter": {"name": "envoy.filters.http.router"},
    }
    patches = [
        {
            "applyTo": "CLUSTER",
            "match": {"context": contexts[0]},
            "patch": {"operation": "ADD", "value": copy.deepcopy(cluster)},
        },
        {
            "applyTo": "HTTP_FILTER",
            "match": {"context": contexts[1], "listener": {"filterChain": {"filter": manager}}},
            "patch": {"operation": "INSERT_BEFORE", "value": copy.deepcopy(http_filter)},
        },
    ]
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": name, **meta},
        "spec": {"workloadSelector": {"labels": labels}, "configPatches": patches},
    }


def _quota_istio(
    domain: str,
    paths: list[tuple[Rule, ...]],
    headers: Mapping[str, str],
    ferryman: str,
    envoy: str | None,
) -> str:
    """The gateway's EnvoyFilter (in istio-system) and the sidecars' (in the namespace it is
    applied in, on pods labelled ``ferryman/quota: DOMAIN``). A sidecar reads inserted
    clusters in its inbound and its outbound contexts: the outbound one adds it once."""
    from ferryman.envoy.quota import quota_filter

    shared, left = _shared(paths)
    host, _ = _address(ferryman)
    http_filter = quota_filter(
        domain, shared, headers, envoy, cluster=_QUOTA_CLUSTER, authority=host
    )
    cluster = _cluster(_QUOTA_CLUSTER, ferryman, http2=True)
    name = f"ferryman-quota-{_object_name(domain)}"
    label = _object_name(domain, 63)
    docs = [
        _envoyfilter(
            f"{name}-gateway",
            {"namespace": "istio-system"},
            {"istio": "ingressgateway"},
            ("GATEWAY", "GATEWAY"),
            cluster,
            http_filter,
        ),
        _envoyfilter(
            f"{name}-sidecar",
            {},
            {QUOTA_LABEL: label},
            ("SIDECAR_OUTBOUND", "SIDECAR_INBOUND"),
            cluster,
            http_filter,
        ),
    ]
    head = (
        f"# Generated by ferryman envoy generate --quota --format istio --domain {domain}: the "
        "rate limit quota filter, one bucket matcher per rule,\n# on the ingress gateway "
        "(istio-system) and on the sidecars (inbound) of the pods labelled "
        f"{QUOTA_LABEL}: {label} in the namespace the second EnvoyFilter is applied in.\n"
        "# A request through the gateway and a labelled pod is counted by both.\n"
    )
    return head + left + yaml.safe_dump_all(docs, sort_keys=False)


def generate(
    config: Config,
    options: EngineOptions,
    domain: str,
    *,
    fmt: str = "envoy",
    headers: Mapping[str, str] | None = None,
    ferryman: str = "127.0.0.1:8081",
    upstream: str = "127.0.0.1:8000",
    listen: int = 10000,
    quota: str | None = None,
) -> str:
    """The YAML text: a bootstrap (``envoy``) or EnvoyFilter manifests (``istio``); with
    ``quota`` (the Envoy's name, or "" for none), the filter is the rate limit quota filter
    (a bootstrap's Envoy unnamed is ``envoy``; in Istio, unnamed Envoys show as their
    addresses, a name is every Envoy's)."""
    headers = headers or {}
    paths = rule_paths(config, options, domain)
    if quota is not None and fmt == "istio":
        return _quota_istio(domain, paths, headers, ferryman, quota or None)
    if quota is not None:
        return _quota(domain, paths, headers, ferryman, upstream, listen, quota or "envoy")
    head = f"# Generated by ferryman envoy generate --domain {domain}: one route per rule.\n"
    if fmt == "istio":
        limits = [
            limit
            for path in paths
            for limit in _limits(path, None, headers)  # no stream-done release on a vhost
        ]
        docs = _istio(domain, limits, ferryman)
        held = [
            p[-1].stats_key for p in paths if _held(p[-1].limit) or hasattr(p[-1].limit, "trailing")
        ]
        if held:
            # A virtual host's entries cannot give a copy back when the stream ends.
            head += (
                f"# {', '.join(held)} hold copies or are settled at stream end: add, per "
                "route, RateLimitPerRoute entries with apply_on_stream_done and hits_addend "
                "(a virtual host's entries lose hits_addend).\n"
            )
        return head + yaml.safe_dump_all(docs, sort_keys=False)
    routes = [_route(path, path[-1].limit, headers) for path in paths]
    tree = _bootstrap(domain, routes, ferryman, upstream, listen)
    return head + yaml.safe_dump(tree, sort_keys=False)
