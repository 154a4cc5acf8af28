"""Who may do what: the caller's identity and the access policy, checked in one place.

The caller's identity is its verified client certificate (the SPIFFE id or another URI SAN,
else a DNS SAN); a caller without one is ``anonymous``, told apart by its address where
that matters (caps on what it opens). ``access.yaml`` in the config directory
(``ferryman.access.policy``) maps identities to permissions; it is loaded, checked and
reloaded with the rest of the configuration.

Every API asks with one call, ``parts.access.require(context, "rls", domain)``: it returns
the ``Caller``, or raises ``AccessDeniedError`` (PERMISSION_DENIED, naming the permission),
counted per identity and logged with the peer's address. Without a policy every call is
allowed, as before: the port is trusted. ``CallerCaps`` bounds what one caller may open
(``CapExceededError``: RESOURCE_EXHAUSTED), so that no caller can lock others out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ferryman.access.buckets import MAX_BUCKET_NAME, BucketCaps
from ferryman.access.leases import LeaseLimits, Owners, cap_wants, check_ids
from ferryman.access.policy import ANONYMOUS, PERMISSIONS, Policy
from ferryman.algorithms.leases.model import ResourceTemplate
from ferryman.core.answers import ASKER
from ferryman.core.rules import Domain
from ferryman.core.wire import negative_hits
from ferryman.errors import AccessDeniedError, CapExceededError
from ferryman.logs import ThrottledLog
from ferryman.stats import Stats

__all__ = [
    "ANONYMOUS",
    "DENIED",
    "MAX_BUCKET_NAME",
    "MAX_WATCHERS_PER_NAMESPACE",
    "PERMISSIONS",
    "Access",
    "Caller",
    "CallerCaps",
    "Configured",
    "LeaseLimits",
    "Policy",
    "caller_of",
    "http_caller",
]

log = logging.getLogger("ferryman.access")

#: Counted per refusal: ``<DENIED>.<permission>`` and ``<DENIED>.by.<identity>``.
DENIED = "ferryman.access.denied"
#: Counted per call past a cap: ``<CAPPED>.<what>``.
CAPPED = "ferryman.access.capped"
#: Counted per descriptor whose limit was dropped (its domain has allow_overrides: false).
OVERRIDES_IGNORED = "ferryman.access.overrides_ignored"
#: Open QuotaEvents/Watch streams per namespace ("" for every namespace): a quarter of the
#: server's 64, so that no namespace's watchers leave none for the others.
MAX_WATCHERS_PER_NAMESPACE = 16
# Distinct identities counted by name; others are counted together as _other_, so that a
# caller cannot grow the metrics by minting names.
_MAX_NAMED = 1000


@dataclass(frozen=True)
class Caller:
    """Who is calling: its identity, every name of its certificate, and its address."""

    identity: str
    names: tuple[str, ...]
    peer: str

    @property
    def anonymous(self) -> bool:
        return self.identity == ANONYMOUS

    @property
    def key(self) -> str:
        """What caps count by: the identity, or the address of a caller without one."""
        return f"{ANONYMOUS}@{_host(self.peer)}" if self.anonymous else self.identity


def _host(peer: str) -> str:
    # "ipv4:127.0.0.1:5000" / "ipv6:[::1]:5000": the address without the port.
    address = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return address.rsplit(":", 1)[0] if ":" in address else address


def _decoded(values: Any) -> tuple[str, ...]:
    return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values)


def caller_of(context: Any) -> Caller:
    """The caller of a gRPC call, from its connection's verified certificate."""
    auth = context.auth_context()
    uris = _decoded(auth.get("peer_spiffe_id", ())) + _decoded(auth.get("peer_uri", ()))
    dns = _decoded(auth.get("peer_dns", ()))
    names = tuple(dict.fromkeys(uris + dns))
    peer = str(context.peer() or "")
    return Caller(names[0] if names else ANONYMOUS, names or (ANONYMOUS,), peer)


def http_caller(peercert: Any, peer: str) -> Caller:
    """The caller of an HTTP request, from the TLS connection's verified certificate."""
    sans = (peercert or {}).get("subjectAltName", ())
    uris = tuple(str(v) for k, v in sans if k == "URI")
    dns = tuple(str(v) for k, v in sans if k == "DNS")
    names = tuple(dict.fromkeys(uris + dns))
    return Caller(names[0] if names else ANONYMOUS, names or (ANONYMOUS,), peer)


def _who(context: Any) -> Caller:
    """The caller of a gRPC call's ``context``, or ``context`` itself when it is one."""
    return context if isinstance(context, Caller) else caller_of(context)


class _Asking:
    """The asker of an Envoy request (``core.answers.Asker``): its caller is worked out
    when a kind first asks for it, so that requests no kind asks about pay nothing."""

    __slots__ = ("_access", "_caller", "_context")

    def __init__(self, access: Access, context: Any) -> None:
        self._access = access
        self._context = context
        self._caller: Caller | None = context if isinstance(context, Caller) else None

    @property
    def caller(self) -> Caller:
        if self._caller is None:
            self._caller = caller_of(self._context)
        return self._caller

    @property
    def key(self) -> str:
        return self.caller.key

    def settles_for(self, domain: str) -> bool:
        # Only a policy's grant: without a policy a reservation is settled by its maker.
        policy = self._access.policy
        return policy is not None and policy.allows(self.caller.names, "settle_for", domain)


class Configured(Protocol):
    """What the access checks read of the configuration in force."""

    @property
    def access(self) -> Policy | None: ...
    @property
    def domains(self) -> Mapping[str, Domain]: ...
    @property
    def resources(self) -> tuple[ResourceTemplate, ...]: ...


class Access:
    """The check every API makes; ``config`` reads the configuration in force, whose
    ``access`` is the policy (None: no policy, every caller may)."""

    def __init__(
        self,
        config: Callable[[], Configured | None],
        stats: Stats,
        leases: LeaseLimits | None = None,
        *,
        sessions: int = 0,
        streams: int = 0,
        buckets: int = 0,
    ) -> None:
        self._config = config
        self._stats = stats
        #: Open Session streams, and open watch streams, per caller.
        self.sessions = CallerCaps("sessions", sessions, stats)
        self.streams = CallerCaps("streams", streams, stats)
        self.watchers = CallerCaps("watchers", MAX_WATCHERS_PER_NAMESPACE, stats)
        #: Dynamic token buckets made per caller.
        self.buckets = BucketCaps(stats, buckets)
        self._leases = leases or LeaseLimits()
        self._clients = Owners()
        self._servers = Owners()
        self._named: set[str] = set()
        self.refusals = ThrottledLog(log, 10.0)

    @classmethod
    def unrestricted(cls) -> Access:
        """Checks against no configuration: everything is allowed (for servicers built
        outside a service)."""
        return cls(lambda: None, Stats())

    @property
    def policy(self) -> Policy | None:
        config = self._config()
        return config.access if config is not None else None

    def require(self, context: Any, permission: str, scope: str = "*") -> Caller | None:
        """The caller, when ``permission`` on ``scope`` is allowed (None without a
        policy: every call is); raises AccessDeniedError otherwise. ``context`` is a gRPC
        call's, or the ``Caller`` of an HTTP request (``http_caller``): one check for both
        doors of a method."""
        policy = self.policy
        if policy is None:
            return None
        caller = _who(context)
        self.check(caller, policy, permission, scope)
        return caller

    def open_stream(self, context: Any, caps: CallerCaps) -> Callable[[], None]:
        """Count one more stream of ``caps`` for the caller of ``context`` (its identity, or
        its address without one); the function that ends it. CapExceededError past the cap."""
        return caps.take(caller_of(context).key)

    def open_watch(self, context: Any, namespace: str) -> Callable[[], None]:
        """One more watch stream of ``namespace``, counted for its caller and for the
        namespace; the function that ends it. CapExceededError past either cap."""
        end_stream = self.open_stream(context, self.streams)
        try:
            end_watch = self.watchers.take(namespace)
        except CapExceededError:
            end_stream()
            raise

        def end() -> None:
            end_watch()
            end_stream()

        return end

    def bucket_maker(self, context: Any) -> str:
        """Who a dynamic bucket made by this call counts for ("" without a cap on them, so
        that an Allow reads no certificate then)."""
        return _who(context).key if self.buckets.most else ""

    def owner(self, context: Any) -> str:
        """What a session is bound to: the caller's identity and its connection."""
        return f"{caller_of(context).identity} {context.peer()}"

    def require_each(self, context: Any, permission: str, scopes: Iterable[str]) -> None:
        """``require`` for each of ``scopes`` (the resources of one lease call, say)."""
        policy = self.policy
        if policy is None:
            return
        caller = caller_of(context)
        for scope in scopes:
            self.check(caller, policy, permission, scope)

    # -- capacity leases ------------------------------------------------------------------

    def _lease_caller(self, context: Any, permission: str, ids: list[str]) -> Caller:
        caller = caller_of(context)
        policy = self.policy
        for resource_id in ids:
            self.check(caller, policy, permission, resource_id)
        return caller

    def _claim(self, owners: Owners, caller: Caller, field: str, value: str) -> None:
        # A caller without a certificate has nothing to bind to: an address changes.
        if not caller.anonymous:
            owners.claim(value, caller.identity, lambda: self.deny(caller, f"use {field}", value))

    def _templates(self) -> tuple[ResourceTemplate, ...]:
        config = self._config()
        return config.resources if config is not None else ()

    def client_lease(self, context: Any, request: Any) -> None:
        """GetCapacity: bounded ids, the resources leasable, the client id its caller's;
        each ``wants`` cut to the resource's capacity (the request is changed in place)."""
        ids = [r.resource_id for r in request.resource]
        check_ids(request.client_id, "client_id", ids, "resource")
        caller = self._lease_caller(context, "lease", ids)
        self._claim(self._clients, caller, "client_id", request.client_id)
        templates = self._templates()
        for r in request.resource:
            r.wants = cap_wants(r.wants, r.resource_id, templates, self._leases)

    def server_lease(self, context: Any, request: Any) -> None:
        """GetServerCapacity: as ``client_lease``, for a caller allowed to act as a server;
        each band counts at most ``max_clients_per_server`` clients."""
        ids = [r.resource_id for r in request.resource]
        check_ids(request.server_id, "server_id", ids, "resource")
        caller = self._lease_caller(context, "lease_server", ids)
        self._claim(self._servers, caller, "server_id", request.server_id)
        templates, most = self._templates(), self._leases.max_clients_per_server
        for r in request.resource:
            for band in r.wants:
                band.num_clients = min(band.num_clients, most)
                band.wants = cap_wants(band.wants, r.resource_id, templates, self._leases)

    def release_lease(self, context: Any, request: Any) -> None:
        """ReleaseCapacity: only by the caller the client id belongs to."""
        ids = list(request.resource_id)
        check_ids(request.client_id, "client_id", ids, "resource_id")
        caller = self._lease_caller(context, "lease", ids)
        self._claim(self._clients, caller, "client_id", request.client_id)

    # -- the Envoy path --------------------------------------------------------------------

    def envoy(self, context: Any, request: Any) -> None:
        """The checks of an Envoy RateLimitRequest from ``context`` (a gRPC call's, or
        the Caller of an HTTP request): the domain may be asked, and its
        descriptors' negative hits and own limits are allowed (by the policy, and by the
        domain's ``allow_negative_hits`` and ``allow_overrides``). A limit the domain does
        not allow is dropped from the request; anything else not allowed is refused. The
        caller becomes the request's asker (``core.answers.ASKER``) for the engine."""
        asking = _Asking(self, context)
        ASKER.set(asking)
        config = self._config()
        if config is None:
            return
        policy, domain = config.access, config.domains.get(request.domain)
        strict = domain is not None and not (domain.allow_overrides and domain.allow_negative_hits)
        if policy is None and not strict:
            return
        caller = asking.caller
        self.check(caller, policy, "rls", request.domain)
        for d in request.descriptors:
            if negative_hits(d):
                if domain is not None and not domain.allow_negative_hits:
                    self.deny(caller, "negative_hits", request.domain)
                self.check(caller, policy, "negative_hits", request.domain)
            if d.HasField("limit"):
                if domain is not None and not domain.allow_overrides:
                    d.ClearField("limit")
                    self._stats.inc(OVERRIDES_IGNORED)
                    continue
                self.check(caller, policy, "overrides", request.domain)

    def count(self, name: str) -> None:
        self._stats.inc(name)

    def allows(self, caller: Caller, permission: str, scope: str = "*") -> bool:
        policy = self.policy
        return policy is None or policy.allows(caller.names, permission, scope)

    def check(self, caller: Caller, policy: Policy | None, permission: str, scope: str) -> None:
        """Raise AccessDeniedError, counted and logged, unless ``caller`` may."""
        assert permission in PERMISSIONS, permission
        if policy is None or policy.allows(caller.names, permission, scope):
            return
        self.deny(caller, permission, scope)

    def deny(self, caller: Caller, permission: str, scope: str) -> None:
        """Count, log and raise a refusal (for checks made outside the policy too)."""
        self._stats.inc(f"{DENIED}.{permission}")
        self._stats.inc(f"{DENIED}.by.{self._counted(caller.identity)}")
        self.refusals.report(
            f"refused {permission} on {scope!r} to {caller.identity} from {caller.peer}"
        )
        raise AccessDeniedError(permission, scope, caller.identity)

    def _counted(self, identity: str) -> str:
        if identity in self._named:
            return identity
        if len(self._named) < _MAX_NAMED:
            self._named.add(identity)
            return identity
        return "_other_"


class CallerCaps:
    """How many of a thing (sessions, streams) each caller has open, with a cap per caller:
    past it, that caller alone is refused (RESOURCE_EXHAUSTED, counted)."""

    def __init__(self, what: str, most: int, stats: Stats) -> None:
        self.what = what
        self.most = most
        self._stats = stats
        self._open: dict[str, int] = {}

    def count(self, key: str) -> int:
        return self._open.get(key, 0)

    def take(self, key: str) -> Callable[[], None]:
        """One more open for ``key``; the function that gives it back (once). Raises
        CapExceededError past the cap (0: no cap)."""
        n = self._open.get(key, 0)
        if self.most and n >= self.most:
            self._stats.inc(f"{CAPPED}.{self.what}")
            raise CapExceededError(self.what, self.most)
        self._open[key] = n + 1
        given = False

        def give_back() -> None:
            nonlocal given
            if given:
                return
            given = True
            left = self._open[key] - 1
            if left:
                self._open[key] = left
            else:
                del self._open[key]

        return give_back
