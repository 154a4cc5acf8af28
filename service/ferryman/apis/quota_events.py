"""The quota service's events, ``ferryman.v1.QuotaEvents/Watch``: each event of
``quotaservice.QuotaService/Allow`` is counted in Stats (hence metrics) and handed to the
streams that watch it by the hub (``ferryman.apis.quota_hub``), and sent here as a message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman.access import Access
from ferryman.apis import api
from ferryman.apis.quota_hub import EVENT_KINDS, QUOTA, BucketEvent, QuotaEventHub
from ferryman.edge.rpc import Method
from ferryman.errors import TooManyStreamsError

__all__ = [
    "API",
    "EVENT_KINDS",
    "MAX_SUBSCRIBERS",
    "QUOTA",
    "SERVICE",
    "BucketEvent",
    "QuotaEventHub",
    "QuotaEventsServicer",
]

SERVICE = limiter_pb2.DESCRIPTOR.services_by_name["QuotaEvents"]
Kind = limiter_pb2.QuotaEvent.Kind
MAX_SUBSCRIBERS = 64
Context = grpc.aio.ServicerContext[Any, Any]
METHODS = {"Watch": Method("ratelimit.service.call.watch")}


class QuotaEventsServicer(limiter_pb2_grpc.QuotaEventsServicer):
    """Watch: the events of this server from the call's start, while the caller reads."""

    def __init__(self, hub: QuotaEventHub, access: Access | None = None) -> None:
        self._hub = hub
        self._access = access or Access.unrestricted()

    async def Watch(
        self, request: limiter_pb2.WatchQuotaEventsRequest, context: Context
    ) -> AsyncIterator[limiter_pb2.QuotaEvent]:
        self._access.require(context, "quota_watch", request.namespace or "*")
        if self._hub.subscribers >= MAX_SUBSCRIBERS:
            raise TooManyStreamsError(f"at most {MAX_SUBSCRIBERS} quota event streams at once")
        end = self._access.open_watch(context, request.namespace)
        try:
            async for event in self._events(request.namespace):
                yield event
        finally:
            end()

    async def _events(self, namespace: str) -> AsyncIterator[limiter_pb2.QuotaEvent]:
        with self._hub.subscribe(namespace) as sub:
            while True:
                event = await sub.queue.get()
                if event is None:
                    return
                dropped, sub.dropped = sub.dropped, 0
                yield limiter_pb2.QuotaEvent(
                    kind=event.kind.upper(),  # the hub names a kind in lower case
                    namespace=event.namespace,
                    bucket=event.bucket,
                    dynamic=event.dynamic,
                    tokens=event.tokens,
                    wait_millis=event.wait_millis,
                    dropped=dropped,
                )

    async def drain(self) -> None:
        """End every stream (at shutdown, so that none holds the server's grace period)."""
        self._hub.close()


API = api.API(
    SERVICE,
    limiter_pb2_grpc.add_QuotaEventsServicer_to_server,
    api.built(lambda parts: QuotaEventsServicer(parts.quota_events, parts.access)),
    methods=METHODS,
    drain=QuotaEventsServicer.drain,
)
