"""``CapacityClient``: leases on shares of global capacities (Doorman's protocol).

A client keeps the resources it was asked for, refreshes all their leases in one
``GetCapacity`` as often as the server says, and follows ``mastership`` to the master. While
the server is out of reach a lease stays good until it expires; after that the resource's
capacity is its fallback: ``"safe"`` (the server's safe capacity; -1 unlimited, 0 stop; the
default), ``"optimistic"`` (what it wants), ``"pessimistic"`` (0) or a number, the local
capacity (a RateLimiter's rate) to use until the server answers again.
``AsyncCapacityClient`` is the same over ``grpc.aio``, refreshed by an asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import grpc
import grpc.aio

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman.client import _protocol
from ferryman.tasks import cancel, wait_event

__all__ = ["AsyncCapacityClient", "CapacityClient", "CapacityResource", "CapacityStats"]

#: A mode, or a number: the capacity (a rate, for a RateLimiter) to use in its place.
Fallback = Literal["safe", "optimistic", "pessimistic"] | float
FALLBACKS: tuple[str, ...] = ("safe", "optimistic", "pessimistic")

_IDS = itertools.count(1)
_RETRY = 1.0  # seconds before asking again when no lease says otherwise


@dataclass(frozen=True)
class CapacityStats:
    """A client's counters: refreshes that got an answer, failed refreshes, changes of a
    resource's mode (``lease`` or its fallback), and each resource's capacity now."""

    refreshes: int
    failures: int
    mode_changes: int
    capacity: dict[str, float]
    mode: dict[str, str]


class CapacityResource:
    """One resource of a capacity client: what is wanted and what is held."""

    def __init__(
        self,
        client: _Book,
        resource_id: str,
        wants: float,
        priority: int,
        fallback: Fallback = "safe",
    ):
        if (
            isinstance(fallback, bool)
            or not isinstance(fallback, str | int | float)
            or (
                (
                    isinstance(fallback, int | float)
                    and not (math.isfinite(fallback) and fallback >= 0)
                )
                or (isinstance(fallback, str) and fallback not in FALLBACKS)
            )
        ):
            raise ValueError(
                f"fallback must be one of {', '.join(FALLBACKS)} or a capacity >= 0, "
                f"not {fallback!r}"
            )
        self._client = client
        self.resource_id = resource_id
        self.priority = priority
        self.fallback: Fallback = fallback
        self._wants = wants
        self.users = 1  # opened this many times; released with the last
        self.learned = False  # wants comes from how the resource is used (RateLimiter)
        self.lease: doorman_pb2.Lease | None = None
        self.safe_capacity: float | None = None
        self.mode = "none"  # lease, safe, optimistic or pessimistic, as last seen

    @property
    def wants(self) -> float:
        return self._wants

    @wants.setter
    def wants(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"wants must be a finite number >= 0, not {value!r}")
        changed = value != self._wants
        self._wants = value
        if changed:
            self._client.refresh_soon()

    def ask(self, wants: float, *, now: bool = True) -> None:
        """Change the demand; the server hears it at once (``now``) or at the next refresh."""
        if not now:
            if not math.isfinite(wants) or wants < 0:
                raise ValueError(f"wants must be a finite number >= 0, not {wants!r}")
            self._wants = wants
            return
        self.wants = wants

    @property
    def capacity(self) -> float:
        """The capacity to use now: the lease's while it lasts, else the fallback's."""
        with self._client.lock:
            return self._client.observe(self, time.time())

    def release(self) -> None:
        """Let go of this resource: the lease is given back when its last user releases it."""
        with self._client.lock:
            self.users -= 1
            if self.users > 0:
                return
        self._client.release(self)


class _Book:
    """What both clients share: the resources, the request, the reply, the counters."""

    def __init__(self, target: str, client_id: str | None, timeout: float, fallback: Fallback):
        self.client_id = client_id or f"{socket.gethostname()}:{os.getpid()}:{next(_IDS)}"
        self.target = target
        self.master = target
        self.timeout = timeout
        self.fallback: Fallback = fallback
        self.lock = threading.Lock()
        self.last_error = ""
        self.refreshes = 0
        self.failures = 0
        self.mode_changes = 0
        self._resources: dict[str, CapacityResource] = {}
        self._listeners: list[Callable[[CapacityResource], None]] = []

    def refresh_soon(self) -> None:
        raise NotImplementedError

    def release(self, resource: CapacityResource) -> None:
        raise NotImplementedError

    def on_change(self, listener: Callable[[CapacityResource], None]) -> None:
        """Call ``listener(resource)`` (from the refresher) whenever a capacity changes."""
        self._listeners.append(listener)

    def _add(
        self, resource_id: str, wants: float | None, priority: int, fallback: Fallback | None
    ) -> CapacityResource:
        """The resource, opened once more if this client holds it already (one lease,
        shared: it asks for the larger demand, and is released with its last user)."""
        if not resource_id:
            raise ValueError("resource_id must not be empty")
        with self.lock:
            resource = self._resources.get(resource_id)
            if resource is not None:
                resource.users += 1
            else:
                mode = self.fallback if fallback is None else fallback
                resource = CapacityResource(self, resource_id, 0.0, priority, mode)
                resource.learned = wants is None
                self._resources[resource_id] = resource
        if wants is not None:
            resource.learned = False
            resource.wants = max(wants, resource.wants)
        return resource

    def observe(self, resource: CapacityResource, now: float) -> float:
        """The capacity of ``resource`` at ``now`` (under the lock), counting mode changes."""
        lease = resource.lease
        if lease is not None and lease.expiry_time > now:
            mode, capacity = "lease", float(lease.capacity)
        elif not isinstance(resource.fallback, str):
            mode, capacity = "fallback", float(resource.fallback)
        elif resource.fallback == "optimistic":
            mode, capacity = "optimistic", resource.wants
        elif resource.fallback == "pessimistic" or resource.safe_capacity is None:
            mode, capacity = str(resource.fallback), 0.0
        else:
            safe = resource.safe_capacity
            mode, capacity = "safe", (math.inf if safe < 0 else float(safe))
        if mode != resource.mode:
            if resource.mode != "none":
                self.mode_changes += 1
            resource.mode = mode
        return capacity

    def stats(self) -> CapacityStats:
        now = time.time()
        with self.lock:
            resources = list(self._resources.values())
            capacity = {r.resource_id: self.observe(r, now) for r in resources}
            return CapacityStats(
                refreshes=self.refreshes,
                failures=self.failures,
                mode_changes=self.mode_changes,
                capacity=capacity,
                mode={r.resource_id: r.mode for r in resources},
            )

    def _request(self) -> doorman_pb2.GetCapacityRequest | None:
        now = time.time()
        with self.lock:
            resources = list(self._resources.values())
        if not resources:
            return None
        request = doorman_pb2.GetCapacityRequest(client_id=self.client_id)
        for resource in resources:
            item = request.resource.add(
                resource_id=resource.resource_id, priority=resource.priority, wants=resource.wants
            )
            if resource.lease is not None and resource.lease.expiry_time > now:
                item.has.CopyFrom(resource.lease)
        return request

    def _next_hop(self, reply: doorman_pb2.GetCapacityResponse) -> str | None:
        """None when ``reply`` is an answer; else the master to ask next ("" none known)."""
        if reply.response or not reply.HasField("mastership"):
            self.last_error = ""
            return None
        master = reply.mastership.master_address
        self.master = master or self.target
        if not master:
            self.last_error = "no master known"
        return master

    def _failed(self, error: str) -> float:
        self.last_error = error
        self.master = self.target  # start over from the address we were given
        self.failures += 1
        self._tick()
        return _RETRY

    def _apply(self, reply: doorman_pb2.GetCapacityResponse) -> float:
        """Take the leases of ``reply``; the seconds until the next refresh is due."""
        wait = math.inf
        with self.lock:
            self.refreshes += 1
            for answer in reply.response:
                held = self._resources.get(answer.resource_id)
                if held is None:
                    continue
                held.lease = answer.gets
                if answer.HasField("safe_capacity"):
                    held.safe_capacity = answer.safe_capacity
                wait = min(wait, max(0.05, float(answer.gets.refresh_interval)))
        self._tick()
        return _RETRY if wait == math.inf else wait

    def _tick(self) -> None:
        """Notice mode changes (a lease may have just expired) and tell the listeners."""
        now = time.time()
        with self.lock:
            resources = list(self._resources.values())
            for resource in resources:
                self.observe(resource, now)
        for resource in resources:
            for listener in self._listeners:
                listener(resource)


class CapacityClient(_Book):
    """A Doorman client of ``target`` (host:port of any replica), refreshed by a thread;
    ``client_id`` defaults to ``host:pid:n``, so two clients in one process are two clients
    to the server. ``fallback`` is the default for its resources. ``tls``, ``ca_file``,
    ``cert_file``, ``key_file`` and ``credentials`` work as ``ferryman.Client``'s: TLS
    (verified against ``ca_file``, default the system's roots), mutual TLS with a client
    certificate, or any other channel credentials; every replica is reached the same way."""

    def __init__(
        self,
        target: str,
        client_id: str | None = None,
        *,
        timeout: float = 5.0,
        fallback: Fallback = "safe",
        tls: bool = False,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ):
        super().__init__(target, client_id, timeout, fallback)
        self._credentials = _protocol.channel_credentials(
            credentials, tls, ca_file, cert_file, key_file
        )
        self._channels: dict[str, grpc.Channel] = {}
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ferryman-capacity", daemon=True)
        self._thread.start()

    def resource(
        self,
        resource_id: str,
        wants: float | None = None,
        priority: int = 0,
        fallback: Fallback | None = None,
    ) -> CapacityResource:
        """Start asking for ``resource_id``; the first lease comes with the next refresh.

        Without ``wants`` the demand is learned from use (a ``RateLimiter`` on it). Opened
        again, the same resource (and lease) comes back; each opening is released once.
        """
        return self._add(resource_id, wants, priority, fallback)

    def refresh_soon(self) -> None:
        self._wake.set()

    def refresh(self) -> float:
        """Ask for every resource now; the seconds until the next refresh is due."""
        request = self._request()
        if request is None:
            return _RETRY
        for _ in range(3):
            try:
                reply: doorman_pb2.GetCapacityResponse = self._stub(self.master).GetCapacity(
                    request, timeout=self.timeout
                )
            except grpc.RpcError as exc:
                return self._failed(f"{self.master}: {exc.code().name}")
            master = self._next_hop(reply)
            if master is None:
                return self._apply(reply)
            if not master:
                break
        return self._failed(self.last_error or "no master")

    def _stub(self, target: str) -> doorman_pb2_grpc.CapacityStub:
        if target not in self._channels:
            if self._credentials is None:
                self._channels[target] = grpc.insecure_channel(target)
            else:
                self._channels[target] = grpc.secure_channel(target, self._credentials)
        return doorman_pb2_grpc.CapacityStub(self._channels[target])  # type: ignore[no-untyped-call]

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
                wait = self._failed(str(exc))
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
            self.release(resource)  # whoever still uses it: the client is closing
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


class AsyncCapacityClient(_Book):
    """``CapacityClient`` for asyncio (TLS options included): create it inside a running
    loop (or ``async with``); the refresh is a task of that loop."""

    def __init__(
        self,
        target: str,
        client_id: str | None = None,
        *,
        timeout: float = 5.0,
        fallback: Fallback = "safe",
        tls: bool = False,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ):
        super().__init__(target, client_id, timeout, fallback)
        self._credentials = _protocol.channel_credentials(
            credentials, tls, ca_file, cert_file, key_file
        )
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run())

    def resource(
        self,
        resource_id: str,
        wants: float | None = None,
        priority: int = 0,
        fallback: Fallback | None = None,
    ) -> CapacityResource:
        """Start asking for ``resource_id``; the first lease comes with the next refresh.

        Without ``wants`` the demand is learned from use (a ``RateLimiter`` on it). Opened
        again, the same resource (and lease) comes back; each opening is released once.
        """
        return self._add(resource_id, wants, priority, fallback)

    def refresh_soon(self) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    async def refresh(self) -> float:
        """Ask for every resource now; the seconds until the next refresh is due."""
        request = self._request()
        if request is None:
            return _RETRY
        for _ in range(3):
            try:
                reply: doorman_pb2.GetCapacityResponse = await self._stub(self.master).GetCapacity(
                    request, timeout=self.timeout
                )
            except grpc.RpcError as exc:
                return self._failed(f"{self.master}: {exc.code().name}")
            master = self._next_hop(reply)
            if master is None:
                return self._apply(reply)
            if not master:
                break
        return self._failed(self.last_error or "no master")

    def _stub(self, target: str) -> doorman_pb2_grpc.CapacityStub:
        if target not in self._channels:
            if self._credentials is None:
                self._channels[target] = grpc.aio.insecure_channel(target)
            else:
                self._channels[target] = grpc.aio.secure_channel(target, self._credentials)
        return doorman_pb2_grpc.CapacityStub(self._channels[target])  # type: ignore[no-untyped-call]

    def release(self, resource: CapacityResource) -> None:
        """Stop asking for ``resource``; the server hears of it from a task."""
        with self.lock:
            self._resources.pop(resource.resource_id, None)
            resource.lease = None
        self._loop.create_task(self._release(resource.resource_id))

    async def _release(self, resource_id: str) -> None:
        request = doorman_pb2.ReleaseCapacityRequest(
            client_id=self.client_id, resource_id=[resource_id]
        )
        with contextlib.suppress(grpc.RpcError):
            await self._stub(self.master).ReleaseCapacity(request, timeout=self.timeout)

    async def _run(self) -> None:
        while True:
            try:
                wait = await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the refresher die
                wait = self._failed(str(exc))
            await wait_event(self._wake, wait)
            self._wake.clear()

    async def close(self) -> None:
        """Stop refreshing and give every lease back."""
        await cancel(self._task)
        with self.lock:
            ids = list(self._resources)
            for resource in self._resources.values():
                resource.lease = None
            self._resources.clear()
        if ids:
            request = doorman_pb2.ReleaseCapacityRequest(client_id=self.client_id, resource_id=ids)
            with contextlib.suppress(grpc.RpcError):
                await self._stub(self.master).ReleaseCapacity(request, timeout=self.timeout)
        for channel in self._channels.values():
            await channel.close(None)

    async def __aenter__(self) -> AsyncCapacityClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
