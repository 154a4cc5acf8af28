"""``doorman.Capacity``: capacity leases on the gRPC port, wire-compatible with Doorman.

``CapacityServicer`` checks and converts messages over the capacity side of the process
(``ferryman.apis.capacity_service.CapacityService``); it refuses bad input whole, before
anything is stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman.access import Access
from ferryman.algorithms.leases.model import Lease, ResourceTemplate
from ferryman.algorithms.leases.state import Band, LeaseState
from ferryman.apis import api
from ferryman.apis.capacity_service import CapacityService
from ferryman.edge.rpc import Method

R = TypeVar("R", doorman_pb2.GetCapacityResponse, doorman_pb2.GetServerCapacityResponse)

__all__ = ["API", "METHODS", "SERVICE", "CapacityService", "CapacityServicer"]

SERVICE = doorman_pb2.DESCRIPTOR.services_by_name["Capacity"]
METHODS = {
    "Discovery": Method("ratelimit.service.call.discovery"),
    "GetCapacity": Method("ratelimit.service.call.get_capacity"),
    "GetServerCapacity": Method("ratelimit.service.call.get_server_capacity"),
    "ReleaseCapacity": Method("ratelimit.service.call.release_capacity"),
}


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
            mastership=mastership(service), is_master=service.election.is_master
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
            return response(mastership=mastership(service))
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
            return doorman_pb2.ReleaseCapacityResponse(mastership=mastership(service))
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


def mastership(service: CapacityService) -> doorman_pb2.Mastership:
    """Where the master is, as the replies say it."""
    out = doorman_pb2.Mastership()
    if service.election.master_address:
        out.master_address = service.election.master_address
    return out


API = api.API(
    SERVICE,
    doorman_pb2_grpc.add_CapacityServicer_to_server,
    api.built(lambda parts: CapacityServicer(parts.capacity, parts.access)),
    methods=METHODS,
    health=(SERVICE.full_name,),
)
