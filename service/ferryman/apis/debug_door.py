"""The debug port's door: the ``Host`` a browser was sent to, and, under a policy, who asks.

The debug port binds loopback by default, but a page on any site can make a browser send
requests to ``127.0.0.1`` through a name it controls (DNS rebinding): such a request names
that site in ``Host``. Only IP literals, ``localhost`` and the names of DEBUG_ALLOWED_HOSTS
are served. With an access policy, each page also needs the ``debug`` permission on its
path (the config API's calls carry their own tokens, and are left to them).
"""

from __future__ import annotations

import ipaddress
from fnmatch import fnmatchcase

from ferryman.access import Access, http_caller
from ferryman.edge.http import HttpRequest, HttpResponse
from ferryman.errors import AccessDeniedError

__all__ = ["REFUSED_HOST", "DebugDoor"]

#: Counted per request refused for its Host header.
REFUSED_HOST = "ferryman.access.debug_host_refused"
_CONFIG_API = "/api/"


def _hostname(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:6070
        return host[1:].partition("]")[0]
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() and ":" not in name else host


def _literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class DebugDoor:
    """The guard of the debug port's HTTP server (``HttpServer(guard=...)``)."""

    def __init__(self, access: Access, allowed_hosts: tuple[str, ...] = ()) -> None:
        self._access = access
        self._allowed = tuple(h.lower() for h in allowed_hosts)

    def host_allowed(self, host: str) -> bool:
        name = _hostname(host)
        return (
            name == "localhost"
            or _literal(name)
            or any(fnmatchcase(name, pattern) for pattern in self._allowed)
        )

    def __call__(self, request: HttpRequest) -> HttpResponse | None:
        host = request.headers.get("host")
        if host is not None and not self.host_allowed(host):
            self._access.count(REFUSED_HOST)
            return HttpResponse(
                403,
                f"forbidden: Host {host!r} is not a name of this server "
                "(an IP address, localhost, or one of DEBUG_ALLOWED_HOSTS)\n".encode(),
            )
        policy = self._access.policy
        if policy is None or request.path.startswith(_CONFIG_API):
            return None
        caller = http_caller(request.peercert, request.peer)
        try:
            self._access.check(caller, policy, "debug", request.path)
        except AccessDeniedError as error:
            return HttpResponse(403, f"forbidden: {error}\n".encode())
        return None
