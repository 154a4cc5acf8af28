"""BACKEND_TYPE=memcache: fixed-window counters in memcached, as the reference keeps them
(see ``ferryman.algorithms.fixed_window.memcache``); every other rule kind's state in this
process (memcached has nothing to run them on)."""

from __future__ import annotations

from collections.abc import Sequence

from ferryman.algorithms import COUNTERS
from ferryman.backends.memory import InProcessStores
from ferryman.clock import Clock, SystemClock
from ferryman.connections.memcache import MemcacheServer

__all__ = ["MemcacheBackend"]


class MemcacheBackend(InProcessStores):
    """Counters in memcached (``MEMCACHE_HOST_PORT``); every other rule kind's state in
    process."""

    name = "memcache"

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        *,
        timeout: float = 1.0,
        jitter_max: int = 0,
        clock: Clock | None = None,
    ) -> None:
        clock = clock or SystemClock()
        servers = [MemcacheServer(host, port, timeout) for host, port in addresses]
        self.addresses = list(addresses)
        super().__init__(clock)
        self.counters = COUNTERS.memcache_store(servers, jitter_max)
        self._stores[COUNTERS.name] = self.counters

    async def start(self) -> None:
        return None

    def healthy(self) -> bool:
        return bool(self.counters.healthy)

    async def close(self) -> None:
        await self.counters.close()
        self.clear()
