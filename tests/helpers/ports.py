"""Loopback ports: free ones to listen on, refused ones and silent ones to fail against."""

from __future__ import annotations

import contextlib
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path


def _ephemeral_start() -> int:
    """The first port the kernel hands out to outgoing connections (and to binds of port 0)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Ports handed out in this process: none is handed out twice.
_handed: set[int] = set()


def _share(low: int, high: int) -> range:
    """This test process's own slice of [low, high): under pytest-xdist each worker picks
    from its own slice, so two workers never hand out the same port at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    width = (high - low) // max(count, 1)
    start = low + width * (index % max(count, 1))
    return range(start, start + width)


def free_port() -> int:
    """A loopback port nothing listens on right now (free to bind, refused to connect).
    It lies below the kernel's ephemeral range: a port from that range could be taken as
    the source port of any outgoing connection before the server under test binds it."""
    top = _ephemeral_start()
    if top > 12000:
        ports = _share(11000, top)
        for _ in range(200):
            port = random.choice(ports)
            if port not in _handed and _bindable(port):
                _handed.add(port)
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
    return found


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
    ports = _share(20000, 55000)
    for _ in range(200):
        port = random.choice(ports)
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
