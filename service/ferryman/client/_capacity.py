"""``CapacityClient``: leases on shares of global capacities (Doorman's protocol).

A client keeps the resources it was asked for, refreshes their leases in a background
thread as often as the server says, and follows ``mastership`` to the master. While the
server is out of reach a lease stays good until it expires; after that the resource's
capacity is its safe capacity (-1: unlimited, 0: stop).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
import threading
import time
from types import TracebackType

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc

__all__ = ["CapacityClient", "CapacityResource"]

_IDS = itertools.count(1)
_RETRY = 1.0  # seconds before asking again when no lease says otherwise


class CapacityResource:
    """One resource of a CapacityClient: what is wanted and what is held."""

    def __init__(self, client: CapacityClient, resource_id: str, wants: float, priority: int):
        self._client = client
        self.resource_id = resource_id
        self.priority = priority
        self._wants = wants
        self.lease: doorman_pb2.Lease | None = None
        self.safe_capacity: float | None = None

    @property
    def wants(self) -> float:
        return self._wants

    @wants.setter
    def wants(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"wants must be a finite number >= 0, not {value!r}")
        self._wants = value
        self._client.refresh_soon()

    @property
    def capacity(self) -> float:
        """The capacity to use now: the lease's while it lasts, else the safe capacity."""
        with self._client.lock:
            lease, safe = self.lease, self.safe_capacity
        if lease is not None and lease.expiry_time > time.time():
            return float(lease.capacity)
        if safe is None:
            return 0.0
        return math.inf if safe < 0 else float(safe)

    def release(self) -> None:
        """Give the lease back at once and stop asking for this resource."""
        self._client.release(self)


class CapacityClient:
    """A Doorman client of ``target`` (host:port of any replica); ``client_id`` defaults to
    ``host:pid:n``, so two clients in one process are two clients to the server."""

    def __init__(self, target: str, client_id: str | None = None, *, timeout: float = 5.0):
        self.client_id = client_id or f"{socket.gethostname()}:{os.getpid()}:{next(_IDS)}"
        self.target = target
        self.master = target
        self.timeout = timeout
        self.lock = threading.Lock()
        self.last_error = ""
        self._resources: dict[str, CapacityResource] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ferryman-capacity", daemon=True)
        self._thread.start()

    def resource(self, resource_id: str, wants: float, priority: int = 0) -> CapacityResource:
        """Start asking for ``resource_id``; the first lease comes with the next refresh."""
        if not resource_id:
            raise ValueError("resource_id must not be empty")
        with self.lock:
            if resource_id in self._resources:
                raise ValueError(f"resource {resource_id!r} is already held by this client")
            resource = CapacityResource(self, resource_id, 0.0, priority)
            self._resources[resource_id] = resource
        resource.wants = wants
        return resource

    def refresh_soon(self) -> None:
        self._wake.set()

    def refresh(self) -> float:
        """Ask for every resource now; the seconds until the next refresh is due."""
        with self.lock:
            resources = list(self._resources.values())
        if not resources:
            return _RETRY
        request = doorman_pb2.GetCapacityRequest(client_id=self.client_id)
        for resource in resources:
            item = request.resource.add(
                resource_id=resource.resource_id, priority=resource.priority, wants=resource.wants
            )
            if resource.lease is not None and resource.lease.expiry_time > time.time():
                item.has.CopyFrom(resource.lease)
        reply = self._call_master(request)
        if reply is None:
            return _RETRY
        wait = math.inf
        with self.lock:
            for answer in reply.response:
                held = self._resources.get(answer.resource_id)
                if held is None:
                    continue
                held.lease = answer.gets
                if answer.HasField("safe_capacity"):
                    held.safe_capacity = answer.safe_capacity
                wait = min(wait, max(0.05, float(answer.gets.refresh_interval)))
        return _RETRY if wait == math.inf else wait

    def _stub(self, target: str) -> doorman_pb2_grpc.CapacityStub:
        if target not in self._channels:
            self._channels[target] = grpc.insecure_channel(target)
        return doorman_pb2_grpc.CapacityStub(self._channels[target])  # type: ignore[no-untyped-call]

    def _call_master(
        self, request: doorman_pb2.GetCapacityRequest
    ) -> doorman_pb2.GetCapacityResponse | None:
        """GetCapacity at the master, following ``mastership`` a few hops; None on failure."""
        for _ in range(3):
            try:
                reply: doorman_pb2.GetCapacityResponse = self._stub(self.master).GetCapacity(
                    request, timeout=self.timeout
                )
            except grpc.RpcError as exc:
                self.last_error = f"{self.master}: {exc.code().name}"
                self.master = self.target  # start over from the address we were given
                return None
            if reply.response or not reply.HasField("mastership"):
                self.last_error = ""
                return reply
            master = reply.mastership.master_address
            self.master = master or self.target
            if not master:
                self.last_error = "no master known"
                return None
        return None

    def release(self, resource: CapacityResource) -> None:
        with self.lock:
            self._resources.pop(resource.resource_id, None)
            resource.lease = None
        request = doorman_pb2.ReleaseCapacityRequest(
            client_id=self.client_id, resource_id=[resource.resource_id]
        )
        with contextlib.suppress(grpc.RpcError):  # else the lease expires on its own
            self._stub(self.master).ReleaseCapacity(request, timeout=self.timeout)

    def _run(self) -> None:
        while not self._closed:
            try:
                wait = self.refresh()
            except Exception as exc:  # never let the refresher die
                self.last_error = str(exc)
                wait = _RETRY
            self._wake.wait(wait)
            self._wake.clear()

    def close(self) -> None:
        """Stop refreshing and give every lease back."""
        self._closed = True
        self._wake.set()
        self._thread.join(self.timeout + 1)
        with self.lock:
            resources = list(self._resources.values())
        for resource in resources:
            resource.release()
        for channel in self._channels.values():
            channel.close()

    def __enter__(self) -> CapacityClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
