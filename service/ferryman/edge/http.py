"""A small HTTP/1.1 server on asyncio for the health, JSON and debug endpoints.

It serves a handful of tiny endpoints to probes and people, so it stays dependency-free.
Every port is bounded (``HttpLimits``): its open connections, the body bytes it buffers at
once, the time a client has to send a request's head and body, and how deep a JSON body
nests (``HttpRequest.json``). What a client gets wrong is answered with a 4xx status and
logged at most once per interval (``BAD_INPUT``), never with a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ferryman.errors import RequestError
from ferryman.logs import ThrottledLog
from ferryman.settings import Settings

__all__ = ["BAD_INPUT", "HttpLimits", "HttpRequest", "HttpResponse", "HttpServer"]

log = logging.getLogger("ferryman.http")
#: Requests refused for what their client sent, on every HTTP port: one line per interval.
BAD_INPUT = ThrottledLog(log, 10.0)

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
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
# A handler's failure is logged with its traceback at most once per this many seconds.
_FAILURE_INTERVAL = 10.0
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(rb"[^\[\]{}]+")
_OPENING = frozenset(b"[{")


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP port allows: open connections, body bytes read at once over all of
    them, the seconds a client has to send a request's head and then its body (and to
    start the next on a kept-alive connection), and how deep a JSON body may nest."""

    connections: int = 256
    buffered: int = 16 << 20
    read_timeout: float = 5.0
    json_depth: int = 32

    @classmethod
    def of(cls, settings: Settings) -> HttpLimits:
        return cls(
            settings.http_max_connections,
            settings.http_max_buffered_bytes,
            settings.http_read_timeout,
            settings.http_max_json_depth,
        )


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
    # How deep a JSON body may nest on the port that read it.
    json_depth: int = HttpLimits.json_depth

    def json(self) -> Any:
        """The body as JSON (an empty body is ``{}``); RequestError naming the body when it
        is not UTF-8 JSON, repeats a key, or nests deeper than its port allows (each one
        logged, at most once per interval)."""
        try:
            if _nests_deeper(self.body, self.json_depth):
                raise RequestError("body", f"JSON nested deeper than {self.json_depth} levels")
            try:
                return json.loads(self.body.decode("utf-8") or "{}", object_pairs_hook=_once)
            except (UnicodeDecodeError, ValueError) as exc:
                raise RequestError("body", f"not JSON ({exc})") from None
        except RequestError as exc:
            BAD_INPUT.report(f"{self.method} {self.path} from {self.peer or '?'}: {exc}")
            raise


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice is ambiguous (protojson refuses it too): refused, not last-wins.
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise RequestError("body", f"the key {key!r} is given twice")
        found[key] = value
    return found


def _nests_deeper(body: bytes, most: int) -> bool:
    """Whether a JSON text opens more than ``most`` arrays or objects inside each other
    (read without recursion, so that any depth is refused, not only the interpreter's)."""
    if body.count(b"[") + body.count(b"{") <= most:
        return False
    depth = 0
    for byte in _NOT_BRACKETS.sub(b"", _STRINGS.sub(b"", body)):
        if byte in _OPENING:
            depth += 1
            if depth > most:
                return True
        else:
            depth -= 1
    return False


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
        limits: HttpLimits | None = None,
    ) -> None:
        # Asked before every routed request: an answer refuses it (the debug port's checks).
        self._guard = guard
        self._limits = limits or HttpLimits()
        self._routes = {k: h for k, h in routes.items() if not k[1].endswith("/*")}
        # Longest prefix first, so that a deeper prefix wins.
        self._prefixes = sorted(
            ((m, p[:-1], h) for (m, p), h in routes.items() if p.endswith("/*")),
            key=lambda route: -len(route[1]),
        )
        self._name = name
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        # Body bytes being read now, over every connection (HttpLimits.buffered).
        self.buffered = 0
        self._failed_at = -_FAILURE_INTERVAL

    @property
    def routes(self) -> list[tuple[str, str]]:
        """Every ``(method, path)`` routed, a prefix ending in ``/*``."""
        return [*self._routes, *((m, p + "*") for m, p, _ in self._prefixes)]

    @property
    def connections(self) -> int:
        """The connections open now."""
        return len(self._conns)

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
        handshake = self._limits.read_timeout if tls else None
        if host and host not in ("::", "[::]"):
            self._server = await asyncio.start_server(
                self._serve,
                host,
                port,
                limit=MAX_LINE,
                ssl=tls,
                ssl_handshake_timeout=handshake,
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
                ssl_handshake_timeout=handshake,
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
        try:
            if len(self._conns) >= self._limits.connections:
                # Past the cap a connection is answered at once and closed, reading nothing.
                most = self._limits.connections
                BAD_INPUT.report(f"{self._name} port: {most} connections open, refused one")
                await self._write(writer, _busy(f"more than {most} open connections"), False)
                return
            self._conns.add(task)
            while await self._one(reader, writer):
                pass
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
        peer = writer.get_extra_info("peername")
        shown = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) > 1 else ""
        try:
            request = await self._read(reader)
        except _Refused as refused:
            # A client's malformed request: answered, and the connection closed (what follows
            # it on the connection cannot be trusted to start a request).
            BAD_INPUT.report(f"{self._name} port refused a request from {shown or '?'}: {refused}")
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
            peercert = writer.get_extra_info("peercert") or None
            depth = self._limits.json_depth
            incoming = HttpRequest(method, path, query, headers, body, peercert, shown, depth)
            response = await self._handle(handler, incoming)
        await self._write(writer, response, keep_alive, head=method == "HEAD")
        return keep_alive

    async def _handle(self, handler: Handler, request: HttpRequest) -> HttpResponse:
        door = self._guard(request) if self._guard is not None else None
        try:
            return door or await handler(request)
        except Exception:
            # A bug, not the client's doing: its traceback once per interval, not per call.
            now = time.monotonic()
            if now - self._failed_at >= _FAILURE_INTERVAL:
                self._failed_at = now
                log.exception("%s handler for %s failed", self._name, request.path)
            return HttpResponse(500, b"internal error\n")

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
        """One request, None at the end of the connection (or when none starts within the
        read timeout); raises _Refused when malformed or not sent in time."""
        try:
            async with asyncio.timeout(self._limits.read_timeout):
                line = await self._line(reader, 414, "request line")
        except TimeoutError:
            return None
        if not line:
            return None
        try:
            method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        except ValueError:
            raise _Refused(400, "malformed request line") from None
        try:
            async with asyncio.timeout(self._limits.read_timeout):
                headers = await self._headers(reader)
                body = await self._body(reader, headers)
        except TimeoutError:
            seconds = self._limits.read_timeout
            raise _Refused(408, f"the request was not sent within {seconds:g}s") from None
        return method, target, version, headers, body

    async def _headers(self, reader: asyncio.StreamReader) -> dict[str, str]:
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            raw = await self._line(reader, 431, "header line")
            if raw in (b"\r\n", b"\n", b""):
                return headers
            name, colon, value = raw.decode("latin-1").partition(":")
            if not colon or not name.strip():
                raise _Refused(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        raise _Refused(431, f"more than {MAX_HEADERS} header lines")

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "transfer-encoding" in headers:
            raise _Refused(411, "send the body with a Content-Length")
        text = headers.get("content-length", "0").strip() or "0"
        if not text.isdigit():
            raise _Refused(400, f"Content-Length {text!r} is not a non-negative integer")
        length = int(text)
        if length > MAX_BODY:
            raise _Refused(413, "body too large")
        if not length:
            return b""
        if self.buffered + length > self._limits.buffered:
            raise _Refused(503, f"more than {self._limits.buffered} body bytes in flight")
        self.buffered += length
        try:
            return await reader.readexactly(length)
        finally:
            self.buffered -= length

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


def _busy(reason: str) -> HttpResponse:
    return HttpResponse(503, f"{reason}\n".encode(), headers={"Retry-After": "1"})
