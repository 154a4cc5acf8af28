"""What Envoy sends: the rate limit filters of a set of files, and for each ``rate_limits``
entry the descriptor its actions build (ordered keys, fixed or variable values, and when
Envoy sends none)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ferryman.envoy.read import Piece, message_class, quiet

__all__ = ["Entry", "Filter", "Inventory", "Part", "collect", "parts_of", "route_label"]

RATELIMIT_FILTER = "envoy.filters.http.ratelimit"
_RATELIMIT_TYPE = "envoy.extensions.filters.http.ratelimit.v3.RateLimit"
_PER_ROUTE_TYPE = "envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute"
_HCM_TYPE = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
# Always present on an HTTP request, so reading them never drops a descriptor
# (x-request-id: the connection manager sets one on every request unless told not to).
_PSEUDO = frozenset({":path", ":method", ":authority", ":scheme", "host", "x-request-id"})


@dataclass(frozen=True)
class Part:
    """One descriptor entry an action adds: ``value`` None when it comes from the request.

    ``optional``: the entry is left out (the rest still sent) when its source is absent;
    ``drops``: when Envoy sends no descriptor at all because of this action.
    """

    key: str
    value: str | None
    source: str
    optional: bool = False
    drops: str = ""
    problem: str = ""


@dataclass(frozen=True)
class Filter:
    file: str
    where: str
    domain: str
    stage: int
    failure_mode_deny: bool
    timeout: str
    cluster: str
    # The filter's timeout in seconds (Envoy's default: 20 ms).
    timeout_seconds: float = 0.02

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "where": self.where,
            "domain": self.domain,
            "stage": self.stage,
            "failure_mode_deny": self.failure_mode_deny,
            "timeout": self.timeout,
            "cluster": self.cluster,
        }


@dataclass(frozen=True)
class Entry:
    """One ``rate_limits`` entry, as one route uses it: ``domain`` is a per-route override,
    or empty for the filter's; ``filters`` the filters of its own listener, if it has one."""

    file: str
    where: str
    stage: int
    parts: tuple[Part, ...]
    domain: str = ""
    hits_addend: str = ""
    apply_on_stream_done: bool = False
    filters: tuple[Filter, ...] | None = None
    vhost: str = ""  # the virtual host's name
    routes: tuple[str, ...] = ()  # the routes Envoy sends it for (see route_label)
    required: frozenset[str] = frozenset()  # headers its route matches only when present

    def shown(self) -> str:
        return ", ".join(
            f"({p.key}, {p.value if p.value is not None else '<' + p.source + '>'})"
            for p in self.parts
        )


@dataclass
class Inventory:
    filters: list[Filter] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    # The buckets of rate limit quota filters (ferryman.envoy.quota_check.QuotaBucket).
    quota: list[Any] = field(default_factory=list)


def _header_part(key: str, header: str, skip: bool, kind: str) -> Part:
    source = f"{kind} {header}"
    problem = "" if key else f"{kind} action for {header!r} has no descriptor_key"
    if skip:
        return Part(key, None, source, optional=True, problem=problem)
    drops = "" if header.lower() in _PSEUDO else f"{kind} {header} missing"
    return Part(key, None, source, drops=drops, problem=problem)


def _matched(kind: str) -> str:
    return f"the {kind} do not match"


def parts_of(actions: Sequence[Any]) -> tuple[Part, ...]:
    """The entries the actions of one ``rate_limits`` entry add, in order."""
    return tuple(_read_part(action) or _other_part(action) for action in actions)


def _read_part(action: Any) -> Part | None:
    """The entry of an action that reads a cluster, header, query parameter or address."""
    if action.source_cluster is not None:
        return Part("source_cluster", None, "source cluster")
    if action.destination_cluster is not None:
        return Part("destination_cluster", None, "destination cluster")
    if action.request_headers is not None:
        a = action.request_headers
        return _header_part(a.descriptor_key, a.header_name, a.skip_if_absent, "header")
    if action.query_parameters is not None:
        a = action.query_parameters
        return _header_part(
            a.descriptor_key, a.query_parameter_name, a.skip_if_absent, "query parameter"
        )
    if action.remote_address is not None:
        return Part("remote_address", None, "client address")
    if action.masked_remote_address is not None:
        return Part("masked_remote_address", None, "masked client address")
    return None


def _other_part(action: Any) -> Part:
    """The entry of any other action: a fixed value, metadata, or one not modelled here."""
    if action.generic_key is not None:
        a = action.generic_key
        problem = "" if a.descriptor_value else "generic_key has no descriptor_value"
        return Part(a.descriptor_key or "generic_key", a.descriptor_value, "", problem=problem)
    if action.header_value_match is not None:
        a = action.header_value_match
        return Part(
            a.descriptor_key or "header_match", a.descriptor_value, "", drops=_matched("headers")
        )
    if action.query_parameter_value_match is not None:
        a = action.query_parameter_value_match
        return Part(
            a.descriptor_key or "query_match",
            a.descriptor_value,
            "",
            drops=_matched("query parameters"),
        )
    if action.metadata is not None or action.dynamic_metadata is not None:
        a = action.metadata or action.dynamic_metadata
        drops = "" if a.default_value else "the metadata is missing"
        return Part(
            a.descriptor_key,
            None,
            "metadata",
            drops=drops,
            optional=bool(getattr(a, "skip_if_absent", False)),
        )
    return Part("?", None, "an action this check does not model")


def route_label(route: Any, index: int) -> str:
    """A route as ``explain --route`` names it: its name, else its match (``/api/``)."""
    if route.name:
        return str(route.name)
    match = route.match
    if match is not None:
        for found in (match.prefix, match.path, match.path_separated_prefix):
            if found:
                return str(found)
        if match.safe_regex is not None and match.safe_regex.regex:
            return str(match.safe_regex.regex)
    return f"routes[{index}]"


def _entries(
    file: str,
    where: str,
    limits: Sequence[Any],
    domain: str,
    filters: tuple[Filter, ...] | None,
    vhost: str = "",
    routes: tuple[str, ...] = (),
    required: frozenset[str] = frozenset(),
) -> Iterator[Entry]:
    for i, limit in enumerate(limits):
        addend = ""
        if limit.hits_addend is not None:
            h = limit.hits_addend
            addend = f"{'-' if h.is_negative_hits else ''}{h.number or h.format}"
        yield Entry(
            file,
            f"{where}.rate_limits[{i}]",
            int(limit.stage or 0),
            parts_of(limit.actions),
            domain,
            addend,
            bool(limit.apply_on_stream_done),
            filters,
            vhost,
            routes,
            required,
        )


def _required(route: Any) -> frozenset[str]:
    """The headers a route matches only when they are present (lower-cased)."""
    match = route.match
    if match is None:
        return frozenset()
    return frozenset(
        str(h.name).lower()
        for h in match.headers or ()
        if not h.invert_match
        and h.present_match is not False
        and not h.treat_missing_header_as_empty
    )


def _per_route(route: Any) -> Any:
    config = (route.typed_per_filter_config or {}).get(RATELIMIT_FILTER)
    if config is None:
        return None
    return config.unpack()


def _virtual_host(
    file: str, where: str, vh: Any, filters: tuple[Filter, ...] | None
) -> Iterator[Entry]:
    vh_per = _per_route(vh)
    vh_domain = vh_per.domain if vh_per is not None else ""
    name = str(vh.name or "")
    labels = tuple(route_label(route, r) for r, route in enumerate(vh.routes))
    if vh_per is not None and vh_per.rate_limits:
        yield from _entries(
            file,
            f"{where}.typed_per_filter_config",
            vh_per.rate_limits,
            vh_domain,
            filters,
            name,
            labels,
        )
    vh_limits = list(vh.rate_limits)
    used_alone = not vh.routes
    alone: list[str] = []  # the routes the virtual host's own entries are sent for
    for r, route in enumerate(vh.routes):
        at = f"{where}.routes[{r}]"
        per = _per_route(route)
        domain = (per.domain if per is not None else "") or vh_domain
        label = (labels[r],)
        need = _required(route)
        if per is not None and per.rate_limits:
            where_per = f"{at}.typed_per_filter_config"
            yield from _entries(
                file, where_per, per.rate_limits, domain, filters, name, label, need
            )
            continue
        own = list(route.route.rate_limits) if route.route is not None else []
        yield from _entries(file, f"{at}.route", own, domain, filters, name, label, need)
        mode = int(per.vh_rate_limits) if per is not None else 0  # OVERRIDE, INCLUDE, IGNORE
        include = route.route is not None and route.route.include_vh_rate_limits
        if mode == 1 or include or (mode == 0 and not own):
            if domain and vh_limits:
                yield from _entries(file, where, vh_limits, domain, filters, name, label)
            else:
                used_alone = True
                alone.append(labels[r])
    if used_alone:
        yield from _entries(file, where, vh_limits, vh_domain, filters, name, tuple(alone))


def _filter(file: str, where: str, http_filter: Any) -> Filter | None:
    if http_filter.typed_config is None:
        return None
    if not http_filter.typed_config.type_url.endswith(_RATELIMIT_TYPE):
        return None
    rl = http_filter.typed_config.unpack()
    seconds = rl.timeout.total_seconds() if rl.timeout is not None else 0.02
    timeout = f"{seconds:g}s" if rl.timeout is not None else "default 20ms"
    cluster = ""
    service = rl.rate_limit_service
    if service is not None and service.grpc_service is not None:
        grpc = service.grpc_service
        if grpc.envoy_grpc is not None:
            cluster = grpc.envoy_grpc.cluster_name
        elif grpc.google_grpc is not None:
            cluster = grpc.google_grpc.target_uri
    deny = bool(rl.failure_mode_deny)
    return Filter(file, where, rl.domain, int(rl.stage or 0), deny, timeout, cluster, seconds)


def _route_config(
    inv: Inventory, file: str, where: str, rc: Any, filters: tuple[Filter, ...] | None
) -> None:
    for v, vh in enumerate(rc.virtual_hosts):
        inv.entries.extend(_virtual_host(file, f"{where}.virtual_hosts[{v}]", vh, filters))


def _network(inv: Inventory, file: str, at: str, network: Any) -> None:
    config = network.typed_config
    if config is None or not config.type_url.endswith(_HCM_TYPE):
        return
    from ferryman.envoy.quota_check import quota_buckets

    hcm = config.unpack()
    own: list[Filter] = []
    for h, http_filter in enumerate(hcm.http_filters):
        where = f"{at}.typed_config.http_filters[{h}]"
        inv.quota.extend(quota_buckets(file, where, http_filter))
        found = _filter(file, where, http_filter)
        if found is not None:
            own.append(found)
    inv.filters.extend(own)
    if hcm.route_config is not None:
        where = f"{at}.typed_config.route_config"
        _route_config(inv, file, where, hcm.route_config, tuple(own))


def _chain(inv: Inventory, file: str, where: str, chain: Any) -> None:
    for f, network in enumerate(chain.filters):
        _network(inv, file, f"{where}.filters[{f}]", network)


def _listener(inv: Inventory, file: str, where: str, listener: Any) -> None:
    for c, chain in enumerate(listener.filter_chains):
        _chain(inv, file, f"{where}.filter_chains[{c}]", chain)


def collect(pieces: Sequence[Piece]) -> Inventory:
    """Every rate limit filter and ``rate_limits`` entry of ``pieces``."""
    with quiet():
        return _collect(pieces)


def _collect(pieces: Sequence[Piece]) -> Inventory:
    inv = Inventory()
    for piece in pieces:
        m = piece.message
        if piece.kind == "Bootstrap":
            resources = m.static_resources
            if resources is not None:
                for i, listener in enumerate(resources.listeners):
                    _listener(inv, piece.file, f"static_resources.listeners[{i}]", listener)
        elif piece.kind == "Listener":
            _listener(inv, piece.file, piece.where or "listener", m)
        elif piece.kind == "FilterChain":
            _chain(inv, piece.file, piece.where, m)
        elif piece.kind == "Filter":
            _network(inv, piece.file, piece.where, m)
        elif piece.kind == "HttpFilter":
            from ferryman.envoy.quota_check import quota_buckets

            inv.quota.extend(quota_buckets(piece.file, piece.where, m))
            found = _filter(piece.file, piece.where, m)
            if found is not None:
                inv.filters.append(found)
        elif piece.kind == "RouteConfiguration":
            _route_config(inv, piece.file, piece.where or "route_config", m, None)
        elif piece.kind == "VirtualHost":
            inv.entries.extend(_virtual_host(piece.file, piece.where, m, None))
        elif piece.kind == "Route":
            holder = message_class("envoy.config.route.v3", "VirtualHost")(routes=[m])
            inv.entries.extend(_virtual_host(piece.file, piece.where, holder, None))
    return inv
