"""The stores a test runs on, chosen one way: the ``store_kind`` fixture (conftest), which
``on_stores`` parametrizes; and the one place a Redis backend is built from a URL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import TypeVar

import pytest
import redis
from _pytest.mark.structures import ParameterSet

from ferryman.backends.base import Backend
from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import ManualClock

T = TypeVar("T")

STORE_KINDS = ("memory", "redis", "cluster")
REDIS_FIXTURES = {"redis": "redis_server", "cluster": "redis_cluster"}


def store_params(*kinds: str) -> list[ParameterSet]:
    """One pytest.param per store kind; the Redis ones carry the ``redis`` mark."""
    return [
        pytest.param(kind, id=kind, marks=() if kind == "memory" else (pytest.mark.redis,))
        for kind in kinds
    ]


def on_stores(*kinds: str) -> pytest.MarkDecorator:
    """Run a test (or a module, as ``pytestmark``) once per named store; every store by
    default. ``make_server``, ``make_store`` and ``store`` all build the kind chosen here."""
    unknown = set(kinds) - set(STORE_KINDS)
    assert not unknown, unknown
    return pytest.mark.parametrize(
        "store_kind", store_params(*(kinds or STORE_KINDS)), indirect=True
    )


def unique_prefix(letter: str = "t") -> str:
    """A key prefix no other test uses, so tests sharing one Redis stay apart."""
    return f"{letter}{uuid.uuid4().hex[:10]}_"


def redis_backend(
    url: str, *, pool_size: int = 10, timeout: float = 5.0, server_time: bool = True
) -> RedisBackend:
    """A RedisBackend for ``url`` (single, Cluster or Sentinel); not started."""
    return RedisBackend(
        parse_backend_url(url, pool_size=pool_size, timeout=timeout), server_time=server_time
    )


class Store:
    """One started store on its own event loop, driven synchronously by a test.

    Memory reads ``clock``; Redis is told the time wherever the Backend API takes ``now``
    (``server_time=False``), so both see the same times.
    """

    def __init__(self, kind: str, backend: Backend, clock: ManualClock, port: int | None) -> None:
        self.kind = kind
        self.backend = backend
        self.clock = clock
        self.port = port  # a Redis node's port, to look at what the store wrote
        self.prefix = unique_prefix("s")
        self.loop = asyncio.new_event_loop()
        self.run(backend.start())

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.backend.close())
        self.loop.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def redis(self) -> redis.Redis | redis.RedisCluster:
        """A client of the Redis behind this store, to look at what it wrote."""
        assert self.port is not None, f"a {self.kind} store has no Redis"
        if self.kind == "cluster":
            return redis.RedisCluster(host="127.0.0.1", port=self.port, socket_timeout=5)
        return redis.Redis(port=self.port, socket_timeout=5)


def memory_store(clock: ManualClock) -> Store:
    """A started memory store on ``clock``: the reference a Redis store is compared with."""
    return Store("memory", MemoryBackend(clock), clock, None)
