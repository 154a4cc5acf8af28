"""A memcached server as the fixed windows' memcache store talks to it: one connection,
commands written together, answers read in order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from ferryman.errors import BackendError, BackendTimeoutError

__all__ = ["MemcacheServer"]


class MemcacheServer:
    """One memcached server: one connection, commands written together, answers in order."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    async def run(self, commands: Sequence[bytes], values: int = 0) -> list[bytes]:
        """Send ``commands`` and read one answer line each; the first ``values`` commands
        are ``get``s, whose answer is the value (b"" when missing)."""
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout):
                    return await self._run(commands, values)
            except TimeoutError:
                self._drop()
                raise BackendTimeoutError(
                    f"memcached {self} did not answer within {self.timeout}s"
                ) from None
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                self._drop()
                raise BackendError(f"memcached {self}: {exc}") from exc

    async def _run(self, commands: Sequence[bytes], values: int) -> list[bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        writer.write(b"".join(commands))
        await writer.drain()
        out: list[bytes] = []
        for i in range(len(commands)):
            line = (await reader.readuntil(b"\r\n"))[:-2]
            if i < values:
                value = b""
                if line.startswith(b"VALUE "):
                    size = int(line.split()[3])
                    value = (await reader.readexactly(size + 2))[:-2]
                    line = (await reader.readuntil(b"\r\n"))[:-2]
                if line != b"END":
                    raise ValueError(f"unexpected answer to get: {line!r}")
                out.append(value)
            else:
                if line.startswith((b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")):
                    raise ValueError(line.decode(errors="replace"))
                out.append(line)
        return out

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def close(self) -> None:
        writer = self._writer
        self._drop()
        if writer is not None:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
