"""Who holds what: the clients and leases of every resource, and the rules of granting.

All time comes from the caller (``now``, epoch seconds), so tests step through lease
lengths in microseconds. Nothing here awaits: a request is served in one step of the event
loop, so concurrent refreshes cannot over-commit.

Each client's lease of a resource is one entry against the memory backend's cap
(``MEMORY_MAX_KEYS``, ``core.memory_cap``; ``leases`` in its shares). A new one that would
pass it first makes room: expired leases go (their clients hold nothing any more); a live
lease is never forgotten, since its capacity would then be granted twice. With no room, the
new client gets nothing (a lease of 0, not kept) and asks again at its refresh interval.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ferryman.algorithms.leases.algorithms import Division, divide
from ferryman.algorithms.leases.model import Band, Demand, Kind, Lease, ResourceTemplate
from ferryman.core.memory_cap import MemoryCap

__all__ = ["Band", "ClientEntry", "LeaseState", "ResourceState", "TemplateSource"]

# Kinds whose capacity is a total to share (the others cap each client, or nothing).
_SHARED = frozenset({Kind.PROPORTIONAL_SHARE, Kind.FAIR_SHARE})
AMORTIZE = 64


@dataclass
class ClientEntry:
    client_id: str
    priority: int
    wants: float
    weight: int
    lease: Lease
    computed_at: float
    bands: tuple[Band, ...] = ()


class _Tally:
    """Clients' leases held over every resource of a lease state."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class ResourceState:
    """One resource: its template, its clients' demands and leases, and running sums."""

    def __init__(
        self,
        resource_id: str,
        template: ResourceTemplate,
        recompute_interval: float = 0.0,
        tally: _Tally | None = None,
    ) -> None:
        self.tally = _Tally() if tally is None else tally
        self.resource_id = resource_id
        self.template = template
        self.recompute_interval = recompute_interval
        self.clients: dict[str, ClientEntry] = {}
        self.sum_leases = 0.0
        self.sum_wants = 0.0
        self.sum_weight = 0
        self._expiries: list[tuple[float, str]] = []
        self._division: Division | None = None
        self._dirty = False  # the demands changed since the division was computed
        self._computed_at = -math.inf
        self._served = 0  # grants since the division was computed

    @property
    def capacity(self) -> float:
        return self.template.capacity

    def retemplate(self, template: ResourceTemplate) -> None:
        if template != self.template:
            self.template = template
            self._division = None

    def division(self, now: float) -> Division:
        """The ideal division of the current demands, recomputed once they change.

        With many clients a recomputation (a sort) waits until 1/AMORTIZE of them have been
        served since the last one, or ``recompute_interval`` has passed: an arrival storm
        or a fleet whose wants all move then costs O(AMORTIZE log n) per request, not
        O(n log n). A slightly stale division never over-commits: what a client gets is
        also capped by what is free.
        """
        self._served += 1
        due = (
            self._served * AMORTIZE >= len(self.clients)
            or now - self._computed_at >= self.recompute_interval
        )
        if self._division is None or (self._dirty and due):
            demands = list(self.clients.values())
            self._division = divide(self.template.algorithm.kind, self.capacity, demands)
            self._dirty = False
            self._computed_at = now
            self._served = 0
        return self._division

    def expire(self, now: float, most: int = -1) -> int:
        """Forget the clients whose leases have run out (``most`` of them, -1: all); how
        many were."""
        heap = self._expiries
        before = len(self.clients)
        while heap and heap[0][0] <= now and before - len(self.clients) != most:
            _, client_id = heapq.heappop(heap)
            entry = self.clients.get(client_id)
            if entry is not None and entry.lease.expiry_time <= now:
                self.remove(client_id)
        if not self.clients:
            heap.clear()
            # No float drift survives an empty resource.
            self.sum_leases = self.sum_wants = 0.0
            self.sum_weight = 0
        return before - len(self.clients)

    def remove(self, client_id: str) -> None:
        entry = self.clients.pop(client_id, None)
        if entry is None:
            return
        self.tally.n -= 1
        self.sum_leases -= entry.lease.capacity
        self.sum_wants -= entry.wants
        self.sum_weight -= entry.weight
        self._dirty = True

    def safe_capacity(self) -> float:
        """The template's safe capacity, else (per client) STATIC's capacity, which is each
        client's already, or an equal share among the clients known."""
        if self.template.safe_capacity is not None:
            return self.template.safe_capacity
        if self.template.algorithm.kind is Kind.STATIC:
            return self.capacity
        return self.capacity / max(1, self.sum_weight)

    def grant(
        self,
        client_id: str,
        *,
        priority: int,
        wants: float,
        weight: int,
        has: Lease | None,
        now: float,
        learning: bool,
        min_interval: float,
        expiry_cap: float | None = None,
        bands: tuple[Band, ...] = (),
    ) -> Lease:
        """The lease for one client's request (its current one if it asks too often)."""
        entry = self.clients.get(client_id)
        if entry is not None and now - entry.computed_at < min_interval:
            return entry.lease
        old = 0.0
        if entry is None or (entry.wants, entry.weight, entry.priority, entry.bands) != (
            wants,
            weight,
            priority,
            bands,
        ):
            self._dirty = True
        if entry is not None:
            old = entry.lease.capacity
            self.sum_wants += wants - entry.wants
            self.sum_weight += weight - entry.weight
        else:
            self.sum_wants += wants
            self.sum_weight += weight
        spec = self.template.algorithm
        if learning:
            # A new master cannot know the outstanding leases: believe what the client holds.
            gets = min(has.capacity, wants) if has is not None else 0.0
        else:
            if entry is not None:  # the division must see it
                entry.wants, entry.weight = wants, weight
                entry.priority, entry.bands = priority, bands
            else:
                self.clients[client_id] = ClientEntry(
                    client_id, priority, wants, weight, Lease(0.0, 0.0, 0.0), now, bands
                )
            gets = self.division(now).share(Demand(wants, weight, priority, bands))
            if spec.kind in _SHARED:
                gets = min(gets, self.capacity - (self.sum_leases - old))
        gets = max(0.0, gets)
        expiry = float(math.floor(now) + spec.lease_length)
        if expiry_cap is not None:
            expiry = min(expiry, expiry_cap)
        lease = Lease(expiry, float(spec.refresh_interval), gets)
        self.sum_leases += gets - old
        previous = self.clients.get(client_id)
        self.tally.n += entry is None  # a new client, whichever way it came in
        self.clients[client_id] = ClientEntry(client_id, priority, wants, weight, lease, now, bands)
        if previous is None or previous.lease.expiry_time != expiry:
            heapq.heappush(self._expiries, (expiry, client_id))
        return lease


class TemplateSource:
    """Where a server finds a resource's template (and a cap on lease expiry).

    The root reads the configured templates; a server with a parent derives them from
    what the parent grants.
    """

    def template(self, resource_id: str) -> ResourceTemplate | None:
        raise NotImplementedError

    def expiry_cap(self, resource_id: str) -> float | None:
        return None


class LeaseState:
    """Every resource a master serves; dropped whole when mastership changes."""

    def __init__(
        self,
        source: TemplateSource,
        *,
        min_refresh_interval: float,
        grant_unconfigured: bool = True,
        unconfigured_lease: int = 60,
        recompute_interval: float = 0.1,
        on_new_resource: Callable[[str], None] | None = None,
        cap: MemoryCap | None = None,
    ) -> None:
        self.source = source
        self.min_refresh_interval = min_refresh_interval
        self.grant_unconfigured = grant_unconfigured
        self.unconfigured_lease = unconfigured_lease
        self.recompute_interval = recompute_interval
        self.resources: dict[str, ResourceState] = {}
        self.master_since = 0.0
        self.unconfigured_requests = 0
        self._on_new_resource = on_new_resource
        self._tally = _Tally()
        self._now = 0.0  # the last request's time, for making room between requests
        self.cap = MemoryCap() if cap is None else cap
        self.cap.join("leases", self)

    def __len__(self) -> int:
        """Clients' leases held, over every resource."""
        return self._tally.n

    def make_room(self, want: int) -> int:
        """Forget up to ``want`` expired leases (a live one is never forgotten)."""
        gone = 0
        for state in list(self.resources.values()):
            gone += state.expire(self._now, want - gone)
            if not state.clients:
                del self.resources[state.resource_id]
            if gone >= want:
                break
        return gone

    def reset(self, now: float) -> None:
        """Start over (on becoming master): no leases known, learning mode from ``now``."""
        self.resources.clear()
        self._tally.n = 0
        self.master_since = now

    def learning_until(self, template: ResourceTemplate) -> float:
        return self.master_since + template.algorithm.learning_seconds

    def _resource(self, resource_id: str, now: float) -> ResourceState | None:
        template = self.source.template(resource_id)
        state = self.resources.get(resource_id)
        if template is None:
            if state is not None:  # its template was removed from the configuration
                del self.resources[resource_id]
                self._tally.n -= len(state.clients)
            return None
        if state is None:
            state = ResourceState(resource_id, template, self.recompute_interval, self._tally)
            self.resources[resource_id] = state
            if self._on_new_resource is not None:
                self._on_new_resource(resource_id)
        else:
            state.retemplate(template)
        state.expire(now)
        return state

    def ask(
        self,
        client_id: str,
        resource_id: str,
        *,
        wants: float,
        now: float,
        priority: int = 0,
        has: Lease | None = None,
        bands: tuple[Band, ...] = (),
    ) -> tuple[Lease, float, ResourceTemplate | None]:
        """(lease, safe capacity, template) for one resource of one request.

        With ``bands`` the asker is a server: it weighs as its clients and wants their sum.
        """
        state = self._resource(resource_id, now)
        if state is None:
            self.unconfigured_requests += 1
            gets = wants if self.grant_unconfigured else 0.0
            expiry = float(math.floor(now) + self.unconfigured_lease)
            interval = max(1.0, self.min_refresh_interval)
            return Lease(expiry, interval, gets), gets, None
        weight = max(1, sum(b.clients for b in bands)) if bands else 1
        template = state.template
        self._now = now
        if client_id not in state.clients and self.cap.max_keys and not self.cap.admit(self):
            # No room, and no expired lease to forget: nothing granted, nothing kept.
            expiry = float(math.floor(now) + template.algorithm.refresh_interval)
            interval = float(template.algorithm.refresh_interval)
            return Lease(expiry, interval, 0.0), state.safe_capacity(), template
        lease = state.grant(
            client_id,
            priority=priority,
            wants=wants,
            weight=weight,
            has=has,
            now=now,
            learning=now < self.learning_until(template),
            min_interval=self.min_refresh_interval,
            expiry_cap=self.source.expiry_cap(resource_id),
            bands=bands,
        )
        return lease, state.safe_capacity(), template

    def release(self, client_id: str, resource_ids: list[str]) -> None:
        """Free the client's leases of ``resource_ids`` at once."""
        for resource_id in resource_ids:
            state = self.resources.get(resource_id)
            if state is not None:
                state.remove(client_id)
                if not state.clients:
                    del self.resources[resource_id]

    def sweep(self, now: float) -> None:
        """Expire leases everywhere and forget resources nobody holds."""
        for resource_id in list(self.resources):
            state = self.resources[resource_id]
            state.expire(now)
            if not state.clients:
                del self.resources[resource_id]

    def __iter__(self) -> Iterator[ResourceState]:
        return iter(list(self.resources.values()))
