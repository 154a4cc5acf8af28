"""The memory backend's one cap on the state it keeps (``MEMORY_MAX_KEYS``), shared by
every kind's in-process store: each kind's counters, tenants and whatever else it keeps
per request (a reservation, a remembered id) count against it.

Each store says how many entries it holds (``len``) and can make room: drop up to a number
of its least recently used entries that are safe to forget (never one whose forgetting
would let its caller in again). A new entry that would pass the cap first makes room, in
its own store, then in the others, the largest first; a share of the cap at once, so that
one scan serves many new entries. If none can be made the new entry is refused. Finding
the total is a sum over the kinds (a handful), so a request's cost does not grow with the
state held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol, TypeVar

__all__ = [
    "EVICTED",
    "EVICT_FRACTION",
    "REFUSED",
    "SCAN_PAST",
    "Held",
    "MemoryCap",
    "forget_oldest",
    "forget_safe",
]

K = TypeVar("K")
V = TypeVar("V")

#: Counted per entry forgotten to make room, and per new entry refused for want of it.
EVICTED = "ratelimit.service.memory.evicted_keys"
REFUSED = "ratelimit.service.memory.refused_keys"

#: Room made at once when the cap is reached: this fraction of the cap.
EVICT_FRACTION = 64

#: Entries not safe to forget that a store looks past, at most, when making room (its
#: least recently used come first, the further in the more recently used): a full cap
#: with nothing safe to forget costs a request a short look, not one over every entry.
SCAN_PAST = 64


class Held(Protocol):
    """A store whose entries count against the cap."""

    def __len__(self) -> int:
        """Entries held."""
        ...

    def make_room(self, want: int) -> int:
        """Forget up to ``want`` entries safe to forget, least recently used first; how
        many were forgotten."""
        ...


def forget_safe(entries: MutableMapping[K, V], want: int, safe: Callable[[V], bool]) -> int:
    """``make_room`` for a store kept least recently used first: up to ``want`` entries
    that ``safe`` says may be forgotten are dropped, looking past at most SCAN_PAST that may
    not; how many were."""
    gone: list[K] = []
    budget = SCAN_PAST
    for key, value in entries.items():
        if len(gone) >= want:
            break
        if safe(value):
            gone.append(key)
        else:
            budget -= 1
            if budget < 0:
                break
    for key in gone:
        del entries[key]
    return len(gone)


def forget_oldest(entries: OrderedDict[Any, Any], want: int) -> int:
    """``make_room`` for a store whose every entry is safe to forget: up to ``want`` of the
    least recently used (first) entries dropped; how many were."""
    gone = 0
    while entries and gone < want:
        entries.popitem(last=False)
        gone += 1
    return gone


class MemoryCap:
    """``max_keys`` entries at most over the stores that join it (0: no cap); evictions
    and refusals counted here and told to ``report`` (the service's Stats.inc)."""

    def __init__(self, max_keys: int = 0) -> None:
        self.max_keys = max_keys
        self.stores: dict[str, Held] = {}
        self.evicted = 0
        self.refused = 0
        self.report: Callable[[str, int], None] | None = None

    def join(self, name: str, store: Held) -> None:
        self.stores[name] = store

    def held(self) -> int:
        """Entries held by every store."""
        return sum(len(store) for store in self.stores.values())

    def shares(self) -> dict[str, int]:
        """Entries held by each store, by kind."""
        return {name: len(store) for name, store in self.stores.items()}

    def admit(self, asking: Held, need: int = 1, own: Callable[[int], int] | None = None) -> bool:
        """Whether ``asking`` may add ``need`` entries, making room when the cap is
        reached (``own``: the asking store's own way to, when it holds a lock)."""
        most = self.max_keys
        if not most or self.held() + need <= most:
            return True
        want = max(need, most // EVICT_FRACTION)
        freed = (own or asking.make_room)(want)
        if freed < want:
            others = sorted(
                (s for s in self.stores.values() if s is not asking), key=len, reverse=True
            )
            for store in others:
                freed += store.make_room(want - freed)
                if freed >= want:
                    break
        if freed:
            self.evicted += freed
            if self.report is not None:
                self.report(EVICTED, freed)
        if self.held() + need <= most:
            return True
        self.refused += 1
        if self.report is not None:
            self.report(REFUSED, 1)
        return False
