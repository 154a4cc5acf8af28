"""``grpc.health.v1.Health``: the service's health under every name the APIs declare, kept
in step with ``healthy()``; NOT_SERVING for good, at once, when the process starts
draining (while every other API still answers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from ferryman.access import Access
from ferryman.apis import api
from ferryman.errors import CapExceededError
from ferryman.tasks import cancel, wait_event

__all__ = ["API", "SERVICE"]

SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]
# How often healthy() is read: a change reaches watchers within this.
EVERY = 0.2


class _Servicer(HealthServicer):  # type: ignore[misc]  # grpc_health ships no types
    """The health service, with each caller's open Watch streams capped (the edge does not
    wrap this service, so the refusal is answered here), and List answered."""

    def __init__(self, access: Access) -> None:
        super().__init__()
        self._access = access
        # Set at shutdown: every Watch stream ends (its last status NOT_SERVING), so that
        # none holds the server's grace period.
        self._closed = asyncio.Event()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        try:
            end = self._access.open_stream(context, self._access.streams)
        except CapExceededError as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        watching = asyncio.ensure_future(super().Watch(request, context))
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({watching, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            end()
            closed.cancel()
            watching.cancel()
            # Waited for, and their errors (a write to a call the client ended) taken, even
            # when this handler is itself being cancelled.
            await asyncio.gather(closed, watching, return_exceptions=True)

    async def close(self) -> None:
        """NOT_SERVING under every name, for good, and every Watch stream ended."""
        await self.enter_graceful_shutdown()
        self._closed.set()

    async def List(
        self, request: health_pb2.HealthListRequest, context: Any
    ) -> health_pb2.HealthListResponse:
        """Every name and its status (the stock servicer answers UNKNOWN and logs a
        traceback per call)."""
        statuses = dict(self._server_status)
        return health_pb2.HealthListResponse(
            statuses={n: health_pb2.HealthCheckResponse(status=s) for n, s in statuses.items()}
        )


@asynccontextmanager
async def serve(parts: api.Parts) -> AsyncIterator[_Servicer]:
    servicer = _Servicer(parts.access)
    tracker = asyncio.create_task(
        _track(servicer, parts.healthy, parts.health_names, parts.draining),
        name="ferryman-health",
    )
    try:
        yield servicer
    finally:
        await cancel(tracker)


async def _track(
    servicer: HealthServicer,
    healthy: Callable[[], bool],
    names: tuple[str, ...],
    draining: asyncio.Event,
) -> None:
    """Mirror ``healthy()`` into the health service as it changes; once ``draining`` is
    set, NOT_SERVING under every name at once, for good."""
    serving = None
    while not draining.is_set():
        now = healthy()
        if now != serving:
            await _set(servicer, names, now)
            serving = now
        await wait_event(draining, EVERY)
    await _set(servicer, names, False)


async def _set(servicer: HealthServicer, names: tuple[str, ...], serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in names:
        await servicer.set(name, status)


API = api.API(
    SERVICE,
    health_pb2_grpc.add_HealthServicer_to_server,
    serve,
    drain=_Servicer.close,
    edge=False,
)
