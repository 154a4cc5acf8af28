"""A server with a parent is the parent's client: it leases each resource's capacity with
``GetServerCapacity`` (its clients' demand summed by priority band) and divides the lease
among its own clients with the algorithm the parent names."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman.algorithms.leases.model import (
    AlgorithmSpec,
    Kind,
    Lease,
    ResourceTemplate,
    with_parameters,
)
from ferryman.algorithms.leases.state import LeaseState, TemplateSource
from ferryman.client._protocol import RECONNECT_BACKOFF_MS, channel_credentials
from ferryman.clock import Clock
from ferryman.settings import Settings
from ferryman.tasks import cancel, wait_event

__all__ = ["ParentClient", "parent_credentials"]

log = logging.getLogger("ferryman.capacity")

_RETRY = 1.0  # seconds: the next try after a failure, or when a resource has no lease yet
_TIMEOUT = 5.0


@dataclass(frozen=True)
class _Granted:
    lease: Lease
    template: ResourceTemplate  # capacity: the lease's; safe capacity: per client
    safe_total: float | None  # the parent's safe capacity for all of this server's clients


def _spec(algorithm: doorman_pb2.Algorithm) -> AlgorithmSpec:
    learning = (
        algorithm.learning_mode_duration if algorithm.HasField("learning_mode_duration") else None
    )
    spec = AlgorithmSpec(
        Kind(algorithm.kind),
        max(1, algorithm.lease_length),
        max(1, algorithm.refresh_interval),
        learning,
        tuple((p.name, p.value) for p in algorithm.parameters),
    )
    try:
        return with_parameters(spec)
    except ValueError as exc:  # the parent's own check differs: keep its numbers
        log.warning("capacity: the parent's algorithm parameters: %s", exc)
        return spec


def _handed_down(spec: AlgorithmSpec, lease: Lease) -> AlgorithmSpec:
    """What this server's clients get: the parent's algorithm, refreshed more often by its
    decay factor than the parent's lease (Doorman: for convergence, each level down a tree
    refreshes faster than the one above)."""
    refresh = spec.refresh_below(lease.refresh_interval)
    return replace(spec, refresh_interval=min(refresh, spec.lease_length))


def parent_credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    """How this server reaches its parent: the ``DOORMAN_PARENT_TLS*`` settings, read as
    ``ferryman.Client`` reads its TLS options (files unreadable: a ValueError naming them)."""
    s = settings
    return channel_credentials(
        None,
        s.doorman_parent_tls,
        s.doorman_parent_tls_cacert or None,
        s.doorman_parent_tls_cert or None,
        s.doorman_parent_tls_key or None,
    )


class ParentClient(TemplateSource):
    """The parent's leases, as templates for this server's own clients."""

    def __init__(
        self,
        address: str,
        server_id: str,
        clock: Clock,
        state: Callable[[], LeaseState | None],
        *,
        refresh_floor: float,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self._credentials = credentials
        self.server_id = server_id
        self._clock = clock
        self._state = state
        self._target = address
        self._refresh_floor = max(1, math.ceil(refresh_floor))
        self._granted: dict[str, _Granted] = {}
        self._wake = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._stub: doorman_pb2_grpc.CapacityStub | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_error = ""
        self.exchanges = 0

    # -- TemplateSource -----------------------------------------------------------------

    def template(self, resource_id: str) -> ResourceTemplate | None:
        granted = self._granted.get(resource_id)
        if granted is None:
            # Nothing from the parent yet: nothing to divide; bring the clients back soon.
            self._wake.set()
            spec = AlgorithmSpec(Kind.FAIR_SHARE, 2 * self._refresh_floor, self._refresh_floor, 0)
            return ResourceTemplate(resource_id, 0.0, spec)
        if granted.lease.expiry_time <= self._clock.now():
            # The parent is out of reach and the lease is over: safe mode.
            safe = granted.safe_total
            capacity = 0.0 if safe is None else math.inf if safe < 0 else safe
            return replace(granted.template, capacity=capacity)
        return granted.template

    def expiry_cap(self, resource_id: str) -> float | None:
        granted = self._granted.get(resource_id)
        if granted is None or granted.lease.expiry_time <= self._clock.now():
            return None
        return granted.lease.expiry_time

    # -- the exchange with the parent ----------------------------------------------------

    def wake(self, resource_id: str = "") -> None:
        """Ask the parent now (a resource appeared: its clients have nothing yet)."""
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ferryman-capacity-parent")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None

    def _connect(self, target: str) -> doorman_pb2_grpc.CapacityStub:
        if self._stub is None or target != self._target:
            if self._channel is not None:
                # Closed in the background: a call may still be finishing on it.
                asyncio.get_running_loop().create_task(self._channel.close(None))
            self._target = target
            # A parent back after an outage is found within seconds, not gRPC's 2 minutes.
            options = [("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS)]
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(target, options)
            else:
                self._channel = grpc.aio.secure_channel(target, self._credentials, options)
            self._stub = doorman_pb2_grpc.CapacityStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                answered = self.exchanges
                wait = await self.exchange()
                if self.exchanges != answered:  # the parent answered (not: nothing to ask)
                    self.last_error = ""
            except grpc.aio.AioRpcError as exc:
                self.last_error = f"{exc.code().name}: {exc.details()}"
                log.warning("capacity: parent %s: %s", self._target, self.last_error)
                self._connect(self.address)
                wait = _RETRY
            await wait_event(self._wake, wait)

    async def exchange(self) -> float:
        """Ask the parent for every resource this server's clients hold; seconds to the next."""
        state = self._state()
        if state is None:
            return _RETRY
        now = self._clock.now()
        request = doorman_pb2.GetServerCapacityRequest(server_id=self.server_id)
        reported: dict[str, int] = {}  # clients spoken for, per resource
        for resource in state:
            resource.expire(now)
            if not resource.clients:
                continue
            bands: dict[int, list[float]] = {}
            for client in resource.clients.values():
                band = bands.setdefault(client.priority, [0, 0.0])
                band[0] += client.weight
                band[1] += client.wants
            item = request.resource.add(resource_id=resource.resource_id)
            reported[resource.resource_id] = max(1, sum(int(c) for c, _ in bands.values()))
            for priority, (clients, wants) in sorted(bands.items()):
                item.wants.add(priority=priority, num_clients=int(clients), wants=wants)
            granted = self._granted.get(resource.resource_id)
            if granted is not None and granted.lease.expiry_time > now:
                lease = granted.lease
                item.has.expiry_time = int(lease.expiry_time)
                item.has.refresh_interval = int(lease.refresh_interval)
                item.has.capacity = lease.capacity
        if not request.resource:
            return _RETRY
        stub = self._connect(self._target)
        reply = await stub.GetServerCapacity(request, timeout=_TIMEOUT)
        self.exchanges += 1
        # The parent answers again: an expired grant nobody holds can go (the parent grants
        # anew when asked). While it is out of reach, every grant stays: its template names
        # the safe capacity that clients coming back get in the meantime.
        for resource_id in [r for r, g in self._granted.items() if g.lease.expiry_time <= now]:
            if resource_id not in state.resources:
                del self._granted[resource_id]
        if not reply.response and reply.HasField("mastership"):
            master = reply.mastership.master_address
            log.warning("capacity: parent %s is not master; master: %r", self._target, master)
            self._connect(master or self.address)
            return 0.05 if master else _RETRY
        wait = self._take(reply, reported)
        asked = {r.resource_id for r in request.resource}
        return _RETRY if asked - set(self._granted) or wait == math.inf else wait

    def _take(
        self, reply: doorman_pb2.GetServerCapacityResponse, reported: dict[str, int]
    ) -> float:
        """Keep the parent's grants as templates; the shortest refresh interval among them."""
        wait = math.inf
        for item in reply.response:
            lease = Lease(
                float(item.gets.expiry_time), float(item.gets.refresh_interval), item.gets.capacity
            )
            spec = _spec(item.algorithm) if item.HasField("algorithm") else AlgorithmSpec()
            spec = _handed_down(spec, lease)
            safe = item.safe_capacity if item.HasField("safe_capacity") else None
            # The parent's safe capacity is for all the clients this server spoke for; its
            # own clients each get their part (-1, unlimited, stays unlimited).
            each = safe if safe is None or safe < 0 else safe / reported.get(item.resource_id, 1)
            template = ResourceTemplate(item.resource_id, lease.capacity, spec, each)
            self._granted[item.resource_id] = _Granted(lease, template, safe)
            wait = min(wait, lease.refresh_interval)
        return wait

    def status(self) -> dict[str, object]:
        now = self._clock.now()
        return {
            "address": self.address,
            "talking_to": self._target,
            "last_error": self.last_error or None,
            "exchanges": self.exchanges,
            "leases": {
                rid: {
                    "capacity": g.lease.capacity,
                    "expires_in": round(g.lease.expiry_time - now, 3),
                    "refresh_interval": g.lease.refresh_interval,
                    "kind": g.template.algorithm.kind.name,
                }
                for rid, g in sorted(self._granted.items())
            },
        }
