"""``doorman.Capacity``: capacity leases on the gRPC port, wire-compatible with Doorman.

``CapacityService`` owns the lease state of this server while it is master (an election
decides: always on memory, one replica at a time through Redis), the parent client when the
server has one, and a sweeper that forgets expired clients. ``CapacityServicer`` checks and
converts messages; it refuses bad input whole, before anything is stored.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman.access import Access
from ferryman.algorithms.leases.election import (
    Election,
    MemoryElection,
    RedisElection,
    redis_client,
)
from ferryman.algorithms.leases.model import Lease, ResourceTemplate, find_template
from ferryman.algorithms.leases.state import Band, LeaseState, TemplateSource
from ferryman.apis import api
from ferryman.clock import Clock
from ferryman.config.reloader import ConfigHolder
from ferryman.edge.rpc import Method
from ferryman.settings import Settings
from ferryman.tasks import cancel

if TYPE_CHECKING:
    from ferryman.apis.capacity_parent import ParentClient

R = TypeVar("R", doorman_pb2.GetCapacityResponse, doorman_pb2.GetServerCapacityResponse)

__all__ = ["API", "METHODS", "SERVICE", "CapacityService", "CapacityServicer"]

log = logging.getLogger("ferryman.capacity")

SWEEP_EVERY = 1.0
MAX_LISTED_CLIENTS = 1000  # per resource on the debug page
CONSOLE_LEASES = 30  # leases listed on the console, the biggest first
_MAX_CACHED = 10_000

SERVICE = doorman_pb2.DESCRIPTOR.services_by_name["Capacity"]
METHODS = {
    "Discovery": Method("ratelimit.service.call.discovery"),
    "GetCapacity": Method("ratelimit.service.call.get_capacity"),
    "GetServerCapacity": Method("ratelimit.service.call.get_server_capacity"),
    "ReleaseCapacity": Method("ratelimit.service.call.release_capacity"),
}


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
        if not master:
            self.state = None
            return
        self.state = LeaseState(
            self.source,
            min_refresh_interval=self.settings.doorman_minimum_refresh_interval,
            grant_unconfigured=self.settings.doorman_grant_unconfigured,
            on_new_resource=self.parent.wake if self.parent is not None else None,
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

    def mastership(self) -> doorman_pb2.Mastership:
        out = doorman_pb2.Mastership()
        if self.election.master_address:
            out.master_address = self.election.master_address
        return out

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


def _lease(lease: Lease, out: doorman_pb2.Lease) -> None:
    out.expiry_time = int(lease.expiry_time)
    out.refresh_interval = int(lease.refresh_interval)
    out.capacity = lease.capacity


def _algorithm(template: ResourceTemplate, out: doorman_pb2.Algorithm) -> None:
    spec = template.algorithm
    out.kind = int(spec.kind)  # type: ignore[assignment]
    out.lease_length = spec.lease_length
    out.refresh_interval = spec.refresh_interval
    if spec.learning_mode_duration is not None:
        out.learning_mode_duration = spec.learning_mode_duration
    for name, value in spec.parameters:
        out.parameters.add(name=name, value=value)


def _has(message: Any) -> Lease | None:
    if not message.HasField("has"):
        return None
    has = message.has
    return Lease(float(has.expiry_time), float(has.refresh_interval), has.capacity)


def _bad_wants(value: float) -> bool:
    return not math.isfinite(value) or value < 0


class CapacityServicer(doorman_pb2_grpc.CapacityServicer):
    """The four RPCs of doorman.Capacity."""

    def __init__(self, service: CapacityService, access: Access | None = None) -> None:
        self._service = service
        self._access = access or Access.unrestricted()

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], message: str) -> None:
        self._service.refused += 1
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    async def Discovery(
        self,
        request: doorman_pb2.DiscoveryRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> doorman_pb2.DiscoveryResponse:
        service = self._service
        return doorman_pb2.DiscoveryResponse(
            mastership=service.mastership(), is_master=service.election.is_master
        )

    async def _lease_each(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        problem: str,
        request: Any,
        response: type[R],
        answer: Callable[[LeaseState, Any, float, Any], None],
    ) -> R:
        """The body both lease RPCs share: refuse a bad request, answer with the mastership
        when this server is not the one to ask, else ``answer`` each resource in turn."""
        if problem:
            await self._refuse(context, problem)
        service = self._service
        service.requests += 1
        state = service.serving_state()
        if state is None:
            return response(mastership=service.mastership())
        now = service.clock.now()
        out = response()
        for item in request.resource:
            answer(state, item, now, out.response.add(resource_id=item.resource_id))
        return out

    async def GetCapacity(
        self,
        request: doorman_pb2.GetCapacityRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> doorman_pb2.GetCapacityResponse:
        def answer(state: LeaseState, item: Any, now: float, out: Any) -> None:
            lease, out.safe_capacity, _ = state.ask(
                request.client_id,
                item.resource_id,
                wants=item.wants,
                now=now,
                priority=item.priority,
                has=_has(item),
            )
            _lease(lease, out.gets)

        self._access.client_lease(context, request)
        problem = _check_client_request(request)
        return await self._lease_each(
            context, problem, request, doorman_pb2.GetCapacityResponse, answer
        )

    async def GetServerCapacity(
        self,
        request: doorman_pb2.GetServerCapacityRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> doorman_pb2.GetServerCapacityResponse:
        def answer(state: LeaseState, item: Any, now: float, out: Any) -> None:
            bands = tuple(Band(b.priority, b.num_clients, b.wants) for b in item.wants)
            lease, safe, template = state.ask(
                request.server_id,
                item.resource_id,
                wants=math.fsum(b.wants for b in bands),
                now=now,
                priority=max((b.priority for b in bands), default=0),
                has=_has(item),
                bands=bands,
            )
            if template is not None and safe >= 0:
                safe *= max(1, sum(b.num_clients for b in item.wants))  # one per client
            out.safe_capacity = safe
            _lease(lease, out.gets)
            if template is not None:
                _algorithm(template, out.algorithm)

        self._access.server_lease(context, request)
        problem = _check_server_request(request)
        return await self._lease_each(
            context, problem, request, doorman_pb2.GetServerCapacityResponse, answer
        )

    async def ReleaseCapacity(
        self,
        request: doorman_pb2.ReleaseCapacityRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> doorman_pb2.ReleaseCapacityResponse:
        if not request.client_id:
            await self._refuse(context, "client_id must not be empty")
        for i, resource_id in enumerate(request.resource_id):
            if not resource_id:
                await self._refuse(context, f"resource_id[{i}] must not be empty")
        self._access.release_lease(context, request)
        service = self._service
        state = service.serving_state()
        if state is None:
            return doorman_pb2.ReleaseCapacityResponse(mastership=service.mastership())
        state.release(request.client_id, list(request.resource_id))
        return doorman_pb2.ReleaseCapacityResponse()


def _check_resource_ids(items: Any) -> str:
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not item.resource_id:
            return f"resource[{i}].resource_id must not be empty"
        if item.resource_id in seen:
            return f"resource[{i}].resource_id {item.resource_id!r} appears twice in the request"
        seen.add(item.resource_id)
    return ""


def _check_client_request(request: doorman_pb2.GetCapacityRequest) -> str:
    """The first problem of a GetCapacity request, naming its field; empty when none."""
    if not request.client_id:
        return "client_id must not be empty"
    for i, item in enumerate(request.resource):
        if _bad_wants(item.wants):
            return f"resource[{i}].wants must be a finite number >= 0, not {item.wants!r}"
    return _check_resource_ids(request.resource)


def _check_server_request(request: doorman_pb2.GetServerCapacityRequest) -> str:
    if not request.server_id:
        return "server_id must not be empty"
    for i, item in enumerate(request.resource):
        for j, band in enumerate(item.wants):
            if _bad_wants(band.wants):
                return (
                    f"resource[{i}].wants[{j}].wants must be a finite number >= 0, "
                    f"not {band.wants!r}"
                )
            if band.num_clients < 0:
                return f"resource[{i}].wants[{j}].num_clients must not be negative"
    return _check_resource_ids(request.resource)


@asynccontextmanager
async def serve(parts: api.Parts) -> AsyncIterator[CapacityServicer]:
    """The capacity side while the API is served: the election (and the parent client) on
    this server's address, then the leases the engine takes from a parent, which are
    stopped first."""
    capacity, leased = parts.capacity, parts.leased
    try:
        await capacity.start(parts.grpc_port)
        if leased is not None:
            await leased.start(capacity.address)
        yield CapacityServicer(capacity, parts.access)
    finally:
        if leased is not None:
            await leased.stop()
        await capacity.stop()


API = api.API(
    SERVICE,
    doorman_pb2_grpc.add_CapacityServicer_to_server,
    serve,
    methods=METHODS,
    health=(SERVICE.full_name,),
)
