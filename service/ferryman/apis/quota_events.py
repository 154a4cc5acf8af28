"""The quota service's events, ``ferryman.v1.QuotaEvents/Watch``: each event of
``quotaservice.QuotaService/Allow`` is counted in Stats (hence metrics) and handed to the
streams that watch it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.metrics import CallbackOptions, Observation

from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman._version import __version__
from ferryman.access import Access
from ferryman.apis import api
from ferryman.edge.rpc import Method
from ferryman.errors import TooManyStreamsError
from ferryman.stats import Stats
from ferryman.telemetry import SCOPE, Telemetry

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
QUOTA = "ratelimit.service.quota"
Kind = limiter_pb2.QuotaEvent.Kind
# Event kinds by their stat names (``ratelimit.service.quota.<name>``).
EVENT_KINDS: dict[str, int] = {
    "tokens_served": Kind.TOKENS_SERVED,
    "tokens_served_with_wait": Kind.TOKENS_SERVED_WITH_WAIT,
    "timeout": Kind.TIMEOUT,
    "too_many_tokens_requested": Kind.TOO_MANY_TOKENS_REQUESTED,
    "bucket_miss": Kind.BUCKET_MISS,
    "too_many_buckets": Kind.TOO_MANY_BUCKETS,
    "bucket_created": Kind.BUCKET_CREATED,
    "bucket_removed": Kind.BUCKET_REMOVED,
}
_STAT = {kind: f"{QUOTA}.{name}" for name, kind in EVENT_KINDS.items()}
MAX_SUBSCRIBERS = 64
SUBSCRIBER_QUEUE = 1024
Context = grpc.aio.ServicerContext[Any, Any]
METHODS = {"Watch": Method("ratelimit.service.call.watch")}


@dataclass(frozen=True, slots=True)
class BucketEvent:
    """One event of a token bucket (``kind`` is a QuotaEvent.Kind), as the hub counts it."""

    kind: int
    namespace: str
    bucket: str
    dynamic: bool = False
    tokens: int = 0
    wait_millis: int = 0


class _Subscriber:
    __slots__ = ("dropped", "namespace", "queue")

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        # None: the server is stopping, the stream ends.
        self.queue: asyncio.Queue[BucketEvent | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self.dropped = 0


class QuotaEventHub:
    """Counts every event and hands it to the subscribers (bounded queues: a slow one loses
    events, and Allow never waits for it)."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._subscribers: set[_Subscriber] = set()

    def emit(self, event: BucketEvent) -> None:
        self._stats.inc(_STAT[event.kind])
        for sub in self._subscribers:
            if sub.namespace and sub.namespace != event.namespace:
                continue
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                sub.dropped += 1

    @contextlib.contextmanager
    def subscribe(self, namespace: str) -> Iterator[_Subscriber]:
        sub = _Subscriber(namespace)
        self._subscribers.add(sub)
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)

    def close(self) -> None:
        """End every stream (at shutdown, so that none holds the server's grace period)."""
        for sub in self._subscribers:
            while sub.queue.full():
                sub.queue.get_nowait()
            sub.queue.put_nowait(None)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def observe(self, telemetry: Telemetry) -> None:
        """A metric counting the events by kind (read from Stats when collected)."""
        if telemetry.meter_provider is None:
            return
        meter = telemetry.meter_provider.get_meter(SCOPE, __version__)
        stats = self._stats

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(stats.get(f"{QUOTA}.{name}"), {"event": name}) for name in EVENT_KINDS
            ]

        meter.create_observable_counter(
            "ratelimit_service_quota_events",
            callbacks=[observe],
            description="Token bucket events of quotaservice Allow calls, by event.",
        )


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
                    kind=event.kind,  # type: ignore[arg-type]
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
