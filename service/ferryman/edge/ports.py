"""Binding the ports: each one checked before anything starts, and a port that cannot be
listened on reported with the setting that moves it and a hint at the cause."""

from __future__ import annotations

import errno
import socket
import ssl

import grpc

from ferryman.edge.http import HttpServer
from ferryman.edge.tls import TlsFiles
from ferryman.errors import SettingsError
from ferryman.settings import Settings

__all__ = ["PORT_NAMES", "bind_grpc", "bracketed", "listen", "probe_port"]

# What an operator sets to move each port: the variable and the flag.
PORT_NAMES = {
    "grpc": "GRPC_PORT / --grpc-port",
    "http": "PORT / --http-port",
    "debug": "DEBUG_PORT / --debug-port",
}
_BIND_HINTS = {
    errno.EADDRINUSE: "already in use: stop the process that holds it "
    "(`ss -ltnp` names it) or choose another port",
    errno.EACCES: "permission denied: ports below 1024 need privileges; choose a higher port",
    errno.EADDRNOTAVAIL: "this host has no such address: check the host setting",
}


def bracketed(host: str) -> str:
    """``host`` as it is written before ``:port`` (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _bind_problem(host: str, port: int, what: str, reason: str) -> str:
    shown = f"{bracketed(host) or '*'}:{port}"
    return f"cannot listen on {shown} ({what}): {reason}"


def _bind_error(host: str, port: int, what: str, exc: OSError) -> SettingsError:
    if isinstance(exc, socket.gaierror):
        reason = f"unknown host {host!r}: check the host setting"
    else:
        reason = _BIND_HINTS.get(exc.errno or 0, exc.strerror or str(exc))
    return SettingsError(_bind_problem(host, port, what, reason))


def probe_port(host: str, port: int, what: str) -> None:
    """Raise SettingsError when ``host:port`` cannot be listened on (port 0 always can)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as sock:
            # As the servers themselves bind: a port in TIME_WAIT is free to take.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        raise _bind_error(host, port, what, exc) from None


async def listen(
    server: HttpServer,
    host: str,
    port: int,
    what: str,
    tls: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> int:
    """Start ``server`` on ``host:port``; the port it listens on."""
    try:
        return await server.start(host, port, tls, reuse_port)
    except OSError as exc:
        raise _bind_error(host, port, what, exc) from None


def bind_grpc(server: grpc.aio.Server, settings: Settings, tls: TlsFiles | None) -> int:
    """Add the gRPC port to ``server``; the port bound (0 on a unix socket)."""
    s = settings
    # As the reference: GRPC_UDS replaces GRPC_HOST:GRPC_PORT (gRPC removes a socket file
    # left by a previous run).
    address = f"unix:{s.grpc_uds}" if s.grpc_uds else f"{bracketed(s.grpc_host)}:{s.grpc_port}"
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.grpc_credentials())
    except RuntimeError:
        if s.grpc_uds:
            raise SettingsError(
                f"cannot listen on the unix socket GRPC_UDS={s.grpc_uds!r}: check that "
                "its directory exists and is writable and that no file is in the way"
            ) from None
        raise SettingsError(
            _bind_problem(s.grpc_host, s.grpc_port, PORT_NAMES["grpc"], "cannot listen")
        ) from None
    return 0 if s.grpc_uds else port
