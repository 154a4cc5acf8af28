"""The embedded default backend: every rule kind's state in this process."""

from __future__ import annotations

from typing import Any

from ferryman.algorithms import ALGORITHMS, COUNTERS
from ferryman.algorithms.token_bucket.memory import MemoryTokenBucketStore
from ferryman.algorithms.token_bucket.model import BucketStore
from ferryman.clock import Clock, SystemClock
from ferryman.core.algorithm import StoreOptions
from ferryman.core.memory_cap import MemoryCap

__all__ = ["InProcessStores", "MemoryBackend"]


class InProcessStores:
    """Every rule kind's store in this process, each built by its kind; a backend built on
    it may keep the counters elsewhere (memcache). ``max_keys`` caps the entries of every
    kind together (``cap``: each kind's share, evictions and refusals)."""

    def __init__(self, clock: Clock, max_keys: int = 0) -> None:
        self.cap = MemoryCap(max_keys)
        options = StoreOptions(clock, max_keys=max_keys, cap=self.cap)
        self._stores: dict[str, Any] = {a.name: a.memory_store(options) for a in ALGORITHMS}

    def store(self, name: str) -> Any:
        return self._stores[name]

    def quota_store(self, prefix: str, clock: Clock) -> BucketStore:
        return MemoryTokenBucketStore(clock, self.cap)

    def clear(self) -> None:
        """Forget every counter, tier log, bucket and window (held copies end with their
        sessions)."""
        for store in self._stores.values():
            clear = getattr(store, "clear", None)
            if clear is not None:
                clear()


class MemoryBackend(InProcessStores):
    """Every rule kind's state in this process; nothing to connect to."""

    name = "memory"

    def __init__(self, clock: Clock | None = None, max_keys: int = 0) -> None:
        super().__init__(clock or SystemClock(), max_keys)

    @property
    def counters(self) -> Any:
        """The fixed windows' counters."""
        return self._stores[COUNTERS.name]

    async def start(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    async def close(self) -> None:
        self.clear()
