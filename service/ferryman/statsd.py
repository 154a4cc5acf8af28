"""The reference service's default stats sink: StatsD counters under its metric names.

Every ``STATS_FLUSH_INTERVAL`` the counters of :class:`ferryman.stats.Stats` that moved are
sent as ``<name>:<increase>|c`` lines to ``STATSD_HOST:STATSD_PORT``: over one TCP connection,
as the reference's statsd library does by default, or over UDP (several lines to a datagram)
with ``STATSD_PROTOCOL=udp``, that library's switch. ``EXTRA_TAGS`` are appended to every
name as that library does (``<name>.__<key>=<value>``, keys sorted). With ``USE_DOG_STATSD``
the lines are DogStatsD over UDP, tags as ``|#key:value``, and the mogrifiers named in
``USE_DOG_STATSD_MOGRIFIERS`` rewrite names into name plus tags
(``DOG_STATSD_MOGRIFIER_<NAME>_PATTERN``, ``_NAME``, ``_TAGS``).

A send never fails a request and never stops the loop: with nothing listening (StatsD is on
by default, as in the reference) that flush is lost, and the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ferryman.errors import SettingsError
from ferryman.stats import Stats
from ferryman.tasks import cancel

__all__ = ["Mogrifier", "StatsdSink", "mogrifiers_from_env"]

log = logging.getLogger("ferryman.statsd")

# Lines per datagram stay under a typical path MTU, as StatsD clients do.
MAX_DATAGRAM = 1432
_GROUP = re.compile(r"\$(\d+)")
_UNSAFE = re.compile(r"[:|@#,\s]")


@dataclass(frozen=True)
class Mogrifier:
    """A DogStatsD rewrite: a stat whose name matches ``pattern`` is sent as ``name`` with
    ``tags``; ``$1``, ``$2``... in either stand for the pattern's groups."""

    pattern: re.Pattern[str]
    name: str
    tags: tuple[tuple[str, str], ...]

    def apply(self, stat: str) -> tuple[str, list[tuple[str, str]]] | None:
        match = self.pattern.search(stat)
        if match is None:
            return None

        def fill(template: str) -> str:
            return _GROUP.sub(lambda g: match.group(int(g.group(1))) or "", template)

        return fill(self.name), [(k, fill(v)) for k, v in self.tags]


def mogrifiers_from_env(names: Sequence[str], env: Mapping[str, str]) -> list[Mogrifier]:
    """The mogrifiers ``names`` (USE_DOG_STATSD_MOGRIFIERS) as their variables define them;
    raises SettingsError naming a missing or invalid one."""
    out = []
    for raw in names:
        prefix = f"DOG_STATSD_MOGRIFIER_{raw.upper()}_"
        pattern = env.get(prefix + "PATTERN", "")
        name = env.get(prefix + "NAME", "")
        if not pattern or not name:
            raise SettingsError(
                f"USE_DOG_STATSD_MOGRIFIERS names {raw!r}: set {prefix}PATTERN and {prefix}NAME"
            )
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise SettingsError(f"{prefix}PATTERN={pattern!r} is not a regex: {exc}") from None
        tags = []
        for item in env.get(prefix + "TAGS", "").split(","):
            if item.strip():
                key, _, value = item.partition(":")
                tags.append((key.strip(), value.strip()))
        out.append(Mogrifier(compiled, name, tuple(tags)))
    return out


class StatsdSink:
    """Flushes the increase of every counter to StatsD over UDP, every ``interval`` seconds
    and once more at :meth:`stop`."""

    def __init__(
        self,
        stats: Stats,
        host: str,
        port: int,
        interval: float,
        *,
        tags: Sequence[tuple[str, str]] = (),
        dog: bool = False,
        mogrifiers: Sequence[Mogrifier] = (),
        protocol: str = "tcp",
        quiet: bool = False,
    ) -> None:
        self._stats = stats
        self.host = host
        self.port = port
        self.protocol = protocol
        # On by default and not configured: a missing agent is said at INFO, not WARNING.
        self._quiet = quiet
        self.interval = interval if interval > 0 else 10.0
        self._dog = dog
        self._mogrifiers = list(mogrifiers)
        self._tags = sorted(tags)
        self._suffix = "".join(f".__{k}={_safe(v)}" for k, v in self._tags)
        self._sent: dict[str, int] = {}
        self._socket: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        self._stream: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._warned = False

    def describe(self) -> str:
        kind = "dogstatsd" if self._dog else "statsd"
        return f"{kind} {self.protocol} {self.host}:{self.port} every {self.interval:g}s"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ferryman-statsd")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
        await asyncio.to_thread(self.flush)
        for sock in (self._socket, self._stream):
            if sock is not None:
                sock.close()
        self._socket = self._stream = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self.flush)
            except Exception:  # a bug here must not end the flushing
                log.exception("statsd flush failed")

    def lines(self) -> list[str]:
        """The lines of the next flush: each counter's increase since the last one."""
        out = []
        sent = self._sent
        for name, value in self._stats.snapshot().items():
            delta = value - sent.get(name, 0)
            if delta <= 0:
                continue
            sent[name] = value
            out.append(self._line(name, delta))
        return out

    def _line(self, name: str, delta: int) -> str:
        if not self._dog:
            return f"{name}{self._suffix}:{delta}|c"
        tags = list(self._tags)
        for mogrifier in self._mogrifiers:
            applied = mogrifier.apply(name)
            if applied is not None:
                name, extra = applied
                tags = extra + tags
                break
        if not tags:
            return f"{name}:{delta}|c"
        return f"{name}:{delta}|c|#" + ",".join(f"{k}:{_safe(v)}" for k, v in tags)

    def flush(self) -> int:
        """Send the next flush's lines; how many datagrams (or TCP writes) were sent."""
        lines = self.lines()
        if not lines:
            return 0
        if self.protocol == "tcp":
            return self._send_tcp(lines)
        sock, address = self._connect()
        if sock is None or address is None:
            return 0
        sent = 0
        for packet in _packets(lines):
            try:
                sock.sendto(packet, address)
                sent += 1
            except OSError as exc:
                self._warn(f"cannot send to {self.host}:{self.port}: {exc}")
        return sent

    def _send_tcp(self, lines: Sequence[str]) -> int:
        data = "".join(line + "\n" for line in lines).encode()
        for _ in range(2):  # a connection the agent closed is opened again, once
            try:
                if self._stream is not None and not _open(self._stream):
                    self._stream.close()
                    self._stream = None
                if self._stream is None:
                    self._stream = socket.create_connection((self.host, self.port), timeout=2)
                self._stream.sendall(data)
                return 1
            except OSError as exc:
                if self._stream is not None:
                    self._stream.close()
                    self._stream = None
                error = exc
        self._warn(f"cannot send to {self.host}:{self.port} over TCP: {error}")
        return 0

    def _connect(self) -> tuple[socket.socket | None, tuple[str, int] | None]:
        if self._socket is not None and self._address is not None:
            return self._socket, self._address
        try:
            family, _, _, _, address = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_DGRAM
            )[0]
        except OSError as exc:
            self._warn(f"cannot resolve STATSD_HOST={self.host!r}: {exc}")
            return None, None
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._socket.setblocking(False)
        self._address = (str(address[0]), int(address[1]))
        return self._socket, self._address

    def _warn(self, message: str) -> None:
        # Once: StatsD is on by default, and a missing agent is not worth a line a flush.
        if not self._warned:
            self._warned = True
            log.log(
                logging.INFO if self._quiet else logging.WARNING,
                "statsd: %s (further failures are not logged)",
                message,
            )


def _open(sock: socket.socket) -> bool:
    """False once the agent has closed the connection: a write would still succeed, and
    be lost, so this is asked before each flush."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _safe(value: str) -> str:
    return _UNSAFE.sub("_", value)


def _packets(lines: Sequence[str]) -> list[bytes]:
    packets: list[bytes] = []
    current = b""
    for line in lines:
        data = line.encode()
        if current and len(current) + 1 + len(data) > MAX_DATAGRAM:
            packets.append(current)
            current = b""
        current = data if not current else current + b"\n" + data
    if current:
        packets.append(current)
    return packets
