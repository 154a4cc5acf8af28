"""The quota service's events as its servicers make them (``quotaservice.QuotaService/Allow``
and ``POST /quota/allow``): each counted in Stats (hence metrics) and handed to the
``ferryman.v1.QuotaEvents/Watch`` streams that watch it (``ferryman.apis.quota_events``,
which turns them into messages)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ferryman._version import __version__
from ferryman.stats import Stats
from ferryman.telemetry import SCOPE, Telemetry

__all__ = ["EVENT_KINDS", "QUOTA", "SUBSCRIBER_QUEUE", "BucketEvent", "QuotaEventHub"]

QUOTA = "ratelimit.service.quota"
# The events, each counted as ``ratelimit.service.quota.<name>`` (a QuotaEvent.Kind's name).
EVENT_KINDS = (
    "tokens_served",
    "tokens_served_with_wait",
    "timeout",
    "too_many_tokens_requested",
    "bucket_miss",
    "too_many_buckets",
    "bucket_created",
    "bucket_removed",
)
SUBSCRIBER_QUEUE = 1024
_STAT = {name: f"{QUOTA}.{name}" for name in EVENT_KINDS}


@dataclass(frozen=True, slots=True)
class BucketEvent:
    """One event of a token bucket (``kind`` is its name in ``EVENT_KINDS``, the name of a
    QuotaEvent.Kind in lower case), as the hub counts it."""

    kind: str
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
        from opentelemetry.metrics import CallbackOptions, Observation

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
