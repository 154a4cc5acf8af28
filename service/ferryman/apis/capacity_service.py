"""The capacity side of one ferryman process (``doorman.Capacity``'s state): the lease state of
this server while it is master (an election decides: always on memory, one replica at a time
through Redis), the parent client when the server has one, and a sweeper that forgets
expired clients. It runs from the start whether or not a client calls; the servicer and its
messages (``ferryman.apis.capacity``) are imported by the first call.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ferryman.algorithms.leases.election import (
    Election,
    MemoryElection,
    RedisElection,
    redis_client,
)
from ferryman.algorithms.leases.model import ResourceTemplate, find_template
from ferryman.algorithms.leases.state import LeaseState, TemplateSource
from ferryman.clock import Clock
from ferryman.config.reloader import ConfigHolder
from ferryman.settings import Settings
from ferryman.tasks import cancel

if TYPE_CHECKING:
    from ferryman.apis.api import Parts
    from ferryman.apis.capacity_parent import ParentClient

__all__ = ["CapacityService", "ConfiguredTemplates", "serving"]

log = logging.getLogger("ferryman.capacity")

SWEEP_EVERY = 1.0
MAX_LISTED_CLIENTS = 1000  # per resource on the debug page
CONSOLE_LEASES = 30  # leases listed on the console, the biggest first
_MAX_CACHED = 10_000


class ConfiguredTemplates(TemplateSource):
    """A root server's templates: the resources files of the configuration in force."""

    def __init__(self, holder: ConfigHolder) -> None:
        self._holder = holder
        self._version = -1
        self._cache: dict[str, ResourceTemplate | None] = {}

    def template(self, resource_id: str) -> ResourceTemplate | None:
        if self._holder.version != self._version or len(self._cache) >= _MAX_CACHED:
            self._cache.clear()
            self._version = self._holder.version
        if resource_id not in self._cache:
            config = self._holder.config
            templates = config.resources if config is not None else ()
            self._cache[resource_id] = find_template(templates, resource_id)
        return self._cache[resource_id]


class CapacityService:
    """The capacity side of one ferryman process."""

    def __init__(self, settings: Settings, holder: ConfigHolder, clock: Clock, backend: Any):
        self.settings = settings
        self.clock = clock
        self._backend = backend
        self._holder = holder
        self.state: LeaseState | None = None
        self.parent: ParentClient | None = None
        self.source: TemplateSource = ConfiguredTemplates(holder)
        self.election: Election = MemoryElection("")
        self.address = ""
        self.requests = 0
        self.refused = 0
        self._unconfigured_before = 0
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, grpc_port: int) -> None:
        s = self.settings
        # Listening on every interface: the host's name is the address others can reach.
        wildcard = s.grpc_host in ("", "0.0.0.0", "::", "[::]")
        host = socket.gethostname() if wildcard else s.grpc_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        self.address = s.doorman_advertise_address or f"{host}:{grpc_port}"
        if s.doorman_parent:
            # The parent client (and the Python client it is built on) only where one is set.
            from ferryman.apis.capacity_parent import ParentClient, parent_credentials

            self.parent = ParentClient(
                s.doorman_parent,
                self.address,
                self.clock,
                lambda: self.state if self.election.is_master else None,
                refresh_floor=s.doorman_minimum_refresh_interval,
                credentials=parent_credentials(s),
            )
            self.source = self.parent
        target = getattr(self._backend, "target", None)
        if target is not None:
            term = s.doorman_election_term
            level = f":{s.doorman_parent}" if s.doorman_parent else ""
            key = f"{s.cache_key_prefix}ferryman:doorman:master{level}"
            client, also_close = redis_client(target, min(target.timeout, term / 3))
            self.election = RedisElection(client, key, self.address, term, also_close)
        else:
            self.election = MemoryElection(self.address)
        await self.election.start(self._mastership)
        if self.parent is not None:
            await self.parent.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="ferryman-capacity-sweeper")

    async def stop(self) -> None:
        await cancel(self._sweeper)
        self._sweeper = None
        if self.parent is not None:
            await self.parent.stop()
        await self.election.stop()

    def _mastership(self, master: bool) -> None:
        """A new master knows no leases and starts in learning mode; a replica keeps none."""
        if self.state is not None:
            self._unconfigured_before += self.state.unconfigured_requests
            self.state.reset(self.clock.now())  # its leases no longer count as held
        if not master:
            self.state = None
            return
        self.state = LeaseState(
            self.source,
            min_refresh_interval=self.settings.doorman_minimum_refresh_interval,
            grant_unconfigured=self.settings.doorman_grant_unconfigured,
            on_new_resource=self.parent.wake if self.parent is not None else None,
            cap=getattr(self._backend, "cap", None),
        )
        self.state.reset(self.clock.now())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            state = self.state
            if state is not None:
                state.sweep(self.clock.now())

    def serving_state(self) -> LeaseState | None:
        """The lease state while this server is master, else None."""
        return self.state if self.election.is_master else None

    # -- what the debug page and the metrics read ----------------------------------------

    def leases_table(self) -> dict[str, object]:
        """The console's table of clients and their leases: the biggest leases, at most
        ``CONSOLE_LEASES`` of them."""
        state = self.serving_state()
        now = self.clock.now()
        leases = [
            (resource.resource_id, client)
            for resource in (state if state is not None else ())
            for client in resource.clients.values()
        ]
        leases.sort(key=lambda rc: (-rc[1].lease.capacity, rc[0], rc[1].client_id))
        rows: list[list[object]] = [
            [
                resource_id,
                c.client_id,
                c.priority,
                _json_number(c.wants),
                _json_number(c.lease.capacity),
                round(max(0.0, c.lease.expiry_time - now), 1),
            ]
            for resource_id, c in leases[:CONSOLE_LEASES]
        ]
        note = f"{len(leases)} lease(s)" if state is not None else "leases are kept by the master"
        if len(leases) > CONSOLE_LEASES:
            note += f", the {CONSOLE_LEASES} biggest shown"
        return {
            "columns": ["resource", "client", "priority", "wants", "has", "expires in s"],
            "rows": rows,
            "note": note,
        }

    def status(self) -> dict[str, object]:
        state = self.serving_state()
        now = self.clock.now()
        resources = []
        for resource in state if state is not None else ():
            clients = sorted(resource.clients.values(), key=lambda c: c.client_id)
            template = resource.template
            resources.append(
                {
                    "resource_id": resource.resource_id,
                    "template": template.identifier_glob,
                    "algorithm": template.algorithm.kind.name,
                    "capacity": _json_number(resource.capacity),
                    "sum_leases": resource.sum_leases,
                    "sum_wants": resource.sum_wants,
                    "learning": state is not None and now < state.learning_until(template),
                    "client_count": len(clients),
                    "clients": [
                        {
                            "client_id": c.client_id,
                            "priority": c.priority,
                            "wants": c.wants,
                            "weight": c.weight,
                            "capacity": c.lease.capacity,
                            "expires_in": round(c.lease.expiry_time - now, 3),
                            "refresh_interval": c.lease.refresh_interval,
                            "bands": [
                                {"priority": b.priority, "clients": b.clients, "wants": b.wants}
                                for b in c.bands
                            ],
                        }
                        for c in clients[:MAX_LISTED_CLIENTS]
                    ],
                }
            )
        config = self._holder.config
        return {
            "address": self.address,
            "is_master": self.election.is_master,
            "master_address": self.election.master_address,
            "parent": None if self.parent is None else self.parent.status(),
            "unconfigured_requests": self.unconfigured_requests(),
            "templates": [
                {
                    "identifier_glob": t.identifier_glob,
                    "capacity": t.capacity,
                    "safe_capacity": t.safe_capacity,
                    "algorithm": t.algorithm.kind.name,
                    "lease_length": t.algorithm.lease_length,
                    "refresh_interval": t.algorithm.refresh_interval,
                    "source": t.source,
                }
                for t in (config.resources if config is not None else ())
            ],
            "resources": resources,
        }

    def panel(self) -> dict[str, object]:
        """The console's table of leased resources (the 30 with the most clients)."""
        status = self.status()
        resources = status.get("resources")
        rows: list[list[object]] = []
        for r in sorted(
            resources if isinstance(resources, list) else [], key=lambda r: -r["client_count"]
        )[:30]:
            rows.append(
                [
                    r["resource_id"],
                    r["algorithm"],
                    r["capacity"],
                    r["sum_leases"],
                    r["sum_wants"],
                    r["client_count"],
                    "learning" if r["learning"] else "",
                ]
            )
        master = (
            "master" if status.get("is_master") else f"master is {status.get('master_address')}"
        )
        return {
            "columns": ["resource", "algorithm", "capacity", "leased", "wanted", "clients", ""],
            "rows": rows,
            "note": f"this server: {master}",
        }

    def by_resource(self) -> list[tuple[dict[str, str], tuple[float, float, float, int]]]:
        """(labels, (capacity, sum of leases, sum of wants, clients)) per resource held."""
        state = self.serving_state()
        return [
            (
                {"resource": r.resource_id},
                (r.capacity, r.sum_leases, r.sum_wants, len(r.clients)),
            )
            for r in (state if state is not None else ())
        ]

    def unconfigured_requests(self) -> int:
        state = self.state
        return self._unconfigured_before + (0 if state is None else state.unconfigured_requests)


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


@asynccontextmanager
async def serving(parts: Parts) -> AsyncIterator[None]:
    """The capacity side while the API is served: the election (and the parent client) on
    this server's address, then the leases the engine takes from a parent, which are
    stopped first."""
    capacity, leased = parts.capacity, parts.leased
    try:
        await capacity.start(parts.grpc_port)
        if leased is not None:
            await leased.start(capacity.address)
        yield
    finally:
        if leased is not None:
            await leased.stop()
        await capacity.stop()
