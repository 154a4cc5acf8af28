"""The Redis backend: every rule kind's Redis store over one connection.

Keys keep the reference service's format, so ferryman and envoyproxy/ratelimit pointed at
one Redis count the same hits. With ``REDIS_PERSECOND`` per-second counters go to a second
Redis, as in the reference (:class:`RoutedBackend`).
"""

from __future__ import annotations

from typing import Any

from ferryman.algorithms import ALGORITHMS, COUNTERS
from ferryman.algorithms.fixed_window.synced import SyncedFixedWindows
from ferryman.algorithms.token_bucket.model import BucketStore
from ferryman.algorithms.token_bucket.redis import RedisTokenBucketStore
from ferryman.clock import Clock, SystemClock
from ferryman.connections.redis import RedisConnection
from ferryman.connections.redis_target import (
    RedisTarget,
    parse_backend_url,
    target_from_env_style,
)
from ferryman.core.algorithm import StoreOptions

__all__ = [
    "RedisBackend",
    "RedisTarget",
    "RoutedBackend",
    "parse_backend_url",
    "target_from_env_style",
]


class RedisBackend:
    """Every rule kind's state in one Redis deployment."""

    name = "redis"

    def __init__(
        self,
        target: RedisTarget,
        *,
        jitter_max: int = 0,
        server_time: bool = True,
        clock: Clock | None = None,
    ) -> None:
        """``server_time``: decisions take their time from Redis (TIME) so replicas with
        skewed clocks agree; tests that drive a clock turn this off and pass ``now`` (and
        ``clock``, which tells the synced counters when their windows end)."""
        self.target = target
        self.server_time = server_time
        self.connection = RedisConnection(target)
        options = StoreOptions(
            clock or SystemClock(), jitter_max=jitter_max, server_time=server_time
        )
        self._stores: dict[str, Any] = {
            a.name: a.redis_store(self.connection, options) for a in ALGORITHMS
        }

    def store(self, name: str) -> Any:
        return self._stores[name]

    @property
    def writes(self) -> int:
        return self.connection.writes

    @property
    def main_connection(self) -> RedisConnection:
        """The connection that holds everything but routed counters (the config store)."""
        return self.connection

    def quota_store(self, prefix: str, clock: Clock) -> BucketStore:
        # Decided on Redis time, unless this backend is driven by the caller's clock.
        return RedisTokenBucketStore(
            self.connection, prefix=prefix, clock=None if self.server_time else clock
        )

    async def start(self) -> None:
        await self.connection.start()

    def healthy(self) -> bool:
        return self.connection.healthy()

    def connections(self) -> list[RedisConnection]:
        return [self.connection]

    def synced(self) -> list[SyncedFixedWindows]:
        """The stores that count synced fixed windows in this process."""
        store = self._stores[COUNTERS.name]
        return [store] if isinstance(store, SyncedFixedWindows) else []

    async def close(self) -> None:
        for store in self.synced():  # their last hits, while the connection is open
            await store.close()
        await self.connection.close()


class RoutedBackend:
    """Per-second counters to one Redis, every other window and all other state to another
    (REDIS_PERSECOND)."""

    name = "redis+persecond"

    def __init__(self, main: RedisBackend, per_second: RedisBackend) -> None:
        self.main = main
        self._per_second = per_second
        name = COUNTERS.name
        self._counters = COUNTERS.routed_store(main.store(name), per_second.store(name))

    def store(self, name: str) -> Any:
        return self._counters if name == COUNTERS.name else self.main.store(name)

    @property
    def main_connection(self) -> RedisConnection:
        """The connection that holds everything but per-second counters."""
        return self.main.connection

    def quota_store(self, prefix: str, clock: Clock) -> BucketStore:
        return self.main.quota_store(prefix, clock)

    async def start(self) -> None:
        await self.main.start()
        await self._per_second.start()

    def healthy(self) -> bool:
        return self.main.healthy() and self._per_second.healthy()

    def connections(self) -> list[RedisConnection]:
        return [self.main.connection, self._per_second.connection]

    def synced(self) -> list[SyncedFixedWindows]:
        return [*self.main.synced(), *self._per_second.synced()]

    async def close(self) -> None:
        await self.main.close()
        await self._per_second.close()
