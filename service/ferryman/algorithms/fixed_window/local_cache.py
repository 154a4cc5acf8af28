"""The local over-limit cache (LOCAL_CACHE_SIZE_IN_BYTES): keys known to be over this window."""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["OverLimitCache"]

# Rough per-entry cost of an OrderedDict slot, its int value and the key object header.
_ENTRY_OVERHEAD = 120


class OverLimitCache:
    """A byte-bounded LRU of counter keys that are over their limit until their window ends."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def contains(self, key: str, now: float) -> bool:
        with self._lock:
            expires_at = self._entries.get(key)
            if expires_at is None:
                return False
            if expires_at <= now:
                self._drop(key)
                return False
            self._entries.move_to_end(key)
            return True

    def add(self, key: str, expires_at: int) -> None:
        cost = len(key) + _ENTRY_OVERHEAD
        if cost > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._entries[key] = expires_at
                self._entries.move_to_end(key)
                return
            while self._entries and self._bytes + cost > self.max_bytes:
                oldest = next(iter(self._entries))
                self._drop(oldest)
            self._entries[key] = expires_at
            self._bytes += cost

    def discard(self, key: str) -> None:
        with self._lock:
            if key in self._entries:
                self._drop(key)

    def _drop(self, key: str) -> None:
        del self._entries[key]
        self._bytes -= len(key) + _ENTRY_OVERHEAD
