"""Loopback ports: free ones to listen on, refused ones and silent ones to fail against."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator


def free_port() -> int:
    """A loopback port nothing listens on right now (free to bind, refused to connect)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


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
