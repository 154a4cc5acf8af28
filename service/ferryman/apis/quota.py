"""The quota service's API, ``quotaservice.QuotaService/Allow``, on token buckets; and its
events: counted in Stats (hence metrics) and streamed by ``ferryman.v1.QuotaEvents/Watch``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.metrics import CallbackOptions, Observation

from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2, quota_service_pb2_grpc
from ferryman._version import __version__
from ferryman.algorithms.token_bucket.model import BucketStore, Status, TakeResult
from ferryman.config.quota import NAME
from ferryman.config.reloader import ConfigHolder
from ferryman.errors import BackendError
from ferryman.stats import Stats
from ferryman.telemetry import SCOPE, Telemetry

__all__ = [
    "EVENT_KINDS",
    "MAX_SUBSCRIBERS",
    "QUOTA",
    "QuotaEventHub",
    "QuotaEventsServicer",
    "QuotaServicer",
]

log = logging.getLogger("ferryman.quota")

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
_BY_STATUS = {
    Status.REJECTED_TIMEOUT: Kind.TIMEOUT,
    Status.REJECTED_TOO_MANY_TOKENS_REQUESTED: Kind.TOO_MANY_TOKENS_REQUESTED,
    Status.REJECTED_TOO_MANY_BUCKETS: Kind.TOO_MANY_BUCKETS,
}
MAX_SUBSCRIBERS = 64
SUBSCRIBER_QUEUE = 1024
Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class QuotaEvent:
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
        self.queue: asyncio.Queue[QuotaEvent | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self.dropped = 0


class QuotaEventHub:
    """Counts every event and hands it to the subscribers (bounded queues: a slow one loses
    events, and Allow never waits for it)."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._subscribers: set[_Subscriber] = set()

    def emit(self, event: QuotaEvent) -> None:
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


class QuotaServicer(quota_service_pb2_grpc.QuotaServiceServicer):
    """Allow: every answer is a status, never a gRPC error."""

    def __init__(
        self,
        holder: ConfigHolder,
        store: BucketStore,
        hub: QuotaEventHub,
        stats: Stats,
        *,
        fail_open: bool,
    ) -> None:
        self._holder = holder
        self.store = store
        self._hub = hub
        self._stats = stats
        self._fail_open = fail_open

    async def Allow(
        self, request: quota_service_pb2.AllowRequest, context: Context
    ) -> quota_service_pb2.AllowResponse:
        status, granted, wait = await self.allow(
            request.namespace,
            request.bucket_name,
            request.tokens_requested,
            request.max_wait_millis_override if request.max_wait_time_override else None,
        )
        return quota_service_pb2.AllowResponse(
            status=int(status),  # type: ignore[arg-type]
            tokens_granted=granted,
            wait_millis=wait,
        )

    async def allow(
        self, namespace: str, bucket: str, tokens: int, max_wait_millis: int | None
    ) -> tuple[Status, int, int]:
        """(status, tokens granted, wait in milliseconds) for one request."""
        self._stats.inc(f"{QUOTA}.allow")
        if (
            tokens < 0
            or (max_wait_millis is not None and max_wait_millis < 0)
            or not NAME.fullmatch(namespace)
            or not NAME.fullmatch(bucket)
        ):
            self._stats.inc(f"{QUOTA}.invalid_request")
            return Status.REJECTED_INVALID_REQUEST, 0, 0
        tokens = max(tokens, 1)
        config = self._holder.config
        quota = config.quota if config is not None else None
        found = quota.lookup(namespace, bucket) if quota is not None else None
        if found is None:
            self._hub.emit(QuotaEvent(Kind.BUCKET_MISS, namespace, bucket, tokens=tokens))
            return Status.REJECTED_NO_BUCKET, 0, 0
        ref, spec = found
        allowed = spec.wait_timeout_millis
        if max_wait_millis is not None:
            allowed = min(allowed, max_wait_millis)
        try:
            result = await self.store.take(ref, spec, tokens, allowed)
        except BackendError as exc:
            self._stats.inc(f"{QUOTA}.store_error")
            log.warning("token bucket store error: %s", exc)
            if self._fail_open:
                return Status.OK, tokens, 0
            return Status.REJECTED_SERVER_ERROR, 0, 0
        self._events(namespace, bucket, ref.dynamic, tokens, result)
        return result.status, result.tokens_granted, result.wait_millis

    def _events(
        self, namespace: str, bucket: str, dynamic: bool, tokens: int, result: TakeResult
    ) -> None:
        emit = self._hub.emit
        for name in result.removed:
            emit(QuotaEvent(Kind.BUCKET_REMOVED, namespace, name, True))
        if result.created:
            emit(QuotaEvent(Kind.BUCKET_CREATED, namespace, bucket, True))
        if result.status is Status.OK:
            kind = Kind.TOKENS_SERVED_WITH_WAIT if result.wait_millis > 0 else Kind.TOKENS_SERVED
        else:
            kind = _BY_STATUS[result.status]
        emit(QuotaEvent(kind, namespace, bucket, dynamic, tokens, result.wait_millis))


class QuotaEventsServicer(limiter_pb2_grpc.QuotaEventsServicer):
    """Watch: the events of this server from the call's start, while the caller reads."""

    def __init__(self, hub: QuotaEventHub) -> None:
        self._hub = hub

    async def Watch(
        self, request: limiter_pb2.WatchQuotaEventsRequest, context: Context
    ) -> AsyncIterator[limiter_pb2.QuotaEvent]:
        if self._hub.subscribers >= MAX_SUBSCRIBERS:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {MAX_SUBSCRIBERS} quota event streams at once",
            )
        with self._hub.subscribe(request.namespace) as sub:
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
