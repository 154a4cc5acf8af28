"""A small HTTP/1.1 server on asyncio for the health, JSON and debug endpoints.

It serves a handful of tiny endpoints to probes and people, so it stays dependency-free:
requests are read with a size cap and a timeout, and connections may be kept alive.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HttpRequest", "HttpResponse", "HttpServer"]

log = logging.getLogger("ferryman.http")

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    412: "Precondition Failed",
    413: "Payload Too Large",
    414: "URI Too Long",
    428: "Precondition Required",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
MAX_BODY = 1 << 20
MAX_LINE = 64 << 10  # the request line and each header line
MAX_HEADERS = 100
READ_TIMEOUT = 30.0


class _Refused(Exception):
    """A request answered with an error status, after which the connection closes."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.response = HttpResponse(status, f"{reason}\n".encode())


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    # The verified client certificate (as ssl.SSLSocket.getpeercert() gives it) over TLS.
    peercert: Mapping[str, Any] | None = None
    # The client's address, "host:port".
    peer: str = ""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class HttpServer:
    """Routes ``(method, path)`` to async handlers. A path ending in ``/*`` is a prefix:
    it takes every longer path below it (the handler reads the rest from the request)."""

    def __init__(
        self,
        routes: Mapping[tuple[str, str], Handler],
        name: str,
        guard: Callable[[HttpRequest], HttpResponse | None] | None = None,
    ) -> None:
        # Asked before every routed request: an answer refuses it (the debug port's checks).
        self._guard = guard
        self._routes = {k: h for k, h in routes.items() if not k[1].endswith("/*")}
        # Longest prefix first, so that a deeper prefix wins.
        self._prefixes = sorted(
            ((m, p[:-1], h) for (m, p), h in routes.items() if p.endswith("/*")),
            key=lambda route: -len(route[1]),
        )
        self._name = name
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
        reuse_port: bool = False,
    ) -> int:
        """Listen on ``host`` (empty or ``::``: every interface, IPv4 and IPv6, as the
        reference does) and ``port`` (0: a free one); HTTPS with ``tls``; ``reuse_port``:
        shared with other processes (workers)."""
        if host and host not in ("::", "[::]"):
            self._server = await asyncio.start_server(
                self._serve,
                host,
                port,
                limit=MAX_LINE,
                ssl=tls,
                ssl_handshake_timeout=READ_TIMEOUT if tls else None,
                reuse_port=reuse_port,
            )
        else:
            # One socket for IPv4 and IPv6, so that port 0 means one port, not one per family.
            dual = socket.has_dualstack_ipv6()
            sock = socket.create_server(
                ("::" if dual else "0.0.0.0", port),
                family=socket.AF_INET6 if dual else socket.AF_INET,
                dualstack_ipv6=dual,
                reuse_port=reuse_port,
            )
            self._server = await asyncio.start_server(
                self._serve,
                sock=sock,
                limit=MAX_LINE,
                ssl=tls,
                ssl_handshake_timeout=READ_TIMEOUT if tls else None,
            )
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                async with asyncio.timeout(READ_TIMEOUT):
                    keep_alive = await self._one(reader, writer)
                if not keep_alive:
                    break
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            # Never a traceback per connection at the default level: a client can cause it.
            log.debug("%s connection failed", self._name, exc_info=True)
        finally:
            self._conns.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            request = await self._read(reader)
        except _Refused as refused:
            # A client's malformed request: answered, and the connection closed (what follows
            # it on the connection cannot be trusted to start a request).
            await self._write(writer, refused.response, False)
            return False
        if request is None:
            return False
        method, target, version, headers, body = request
        path, _, query = target.partition("?")
        keep_alive = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        handler = self._route(method, path)
        if handler is None:
            known = {p for _, p in self._routes}
            below = any(path.startswith(p) and len(path) > len(p) for _, p, _ in self._prefixes)
            status = 405 if path in known or below else 404
            response = HttpResponse(status, f"{_REASONS[status].lower()}\n".encode())
        else:
            peercert = writer.get_extra_info("peercert")
            peer = writer.get_extra_info("peername")
            shown = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) > 1 else ""
            incoming = HttpRequest(method, path, query, headers, body, peercert or None, shown)
            door = self._guard(incoming) if self._guard is not None else None
            try:
                response = door or await handler(incoming)
            except Exception:
                log.exception("%s handler for %s failed", self._name, path)
                response = HttpResponse(500, b"internal error\n")
        await self._write(writer, response, keep_alive, head=method == "HEAD")
        return keep_alive

    def _route(self, method: str, path: str) -> Handler | None:
        handler = self._routes.get((method, path))
        if handler is None:
            for m, prefix, candidate in self._prefixes:
                if m == method and path.startswith(prefix) and len(path) > len(prefix):
                    return candidate
        return handler

    @staticmethod
    async def _line(reader: asyncio.StreamReader, status: int, what: str) -> bytes:
        try:
            return await reader.readline()
        except ValueError:  # longer than the reader's limit (MAX_LINE)
            raise _Refused(status, f"{what} longer than {MAX_LINE} bytes") from None

    async def _read(
        self, reader: asyncio.StreamReader
    ) -> tuple[str, str, str, dict[str, str], bytes] | None:
        """One request, None at the end of the connection; raises _Refused when malformed."""
        line = await self._line(reader, 414, "request line")
        if not line:
            return None
        try:
            method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        except ValueError:
            raise _Refused(400, "malformed request line") from None
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            raw = await self._line(reader, 431, "header line")
            if raw in (b"\r\n", b"\n", b""):
                break
            name, colon, value = raw.decode("latin-1").partition(":")
            if not colon or not name.strip():
                raise _Refused(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        else:
            raise _Refused(431, f"more than {MAX_HEADERS} header lines")
        if "transfer-encoding" in headers:
            raise _Refused(411, "send the body with a Content-Length")
        text = headers.get("content-length", "0").strip() or "0"
        if not text.isdigit():
            raise _Refused(400, f"Content-Length {text!r} is not a non-negative integer")
        length = int(text)
        if length > MAX_BODY:
            raise _Refused(413, "body too large")
        body = await reader.readexactly(length) if length else b""
        return method, target, version, headers, body

    @staticmethod
    async def _write(
        writer: asyncio.StreamWriter, response: HttpResponse, keep_alive: bool, head: bool = False
    ) -> None:
        reason = _REASONS.get(response.status, "Unknown")
        lines = [
            f"HTTP/1.1 {response.status} {reason}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        lines.extend(f"{k}: {v}" for k, v in response.headers.items())
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head:
            writer.write(response.body)
        await writer.drain()
