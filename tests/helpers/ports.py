"""Loopback ports: free ones to listen on, refused ones and silent ones to fail against."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A loopback port nothing listens on right now (free to bind, refused to connect)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def listeners(port: int) -> int:
    """Sockets listening on ``port`` (IPv4 and IPv6), from /proc/net: one per process
    sharing it (workers)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def refused_port() -> int:
    """A loopback port nothing listens on: connections are refused."""
    return free_port()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(200):
        port = random.randrange(20000, 55000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A loopback port that accepts TCP connections and never says a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        port: int = s.getsockname()[1]
        yield port
