"""A real ferryman server on loopback ports, driven over real sockets, and what tests ask it."""

from __future__ import annotations

import asyncio
import gc
import http.client
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from envoy.type.v3 import ratelimit_unit_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2_grpc
from ferryman.backends.base import Backend
from ferryman.clock import ManualClock, SystemClock
from ferryman.core.wire import mark_negative_hits
from ferryman.server.app import Service
from ferryman.settings import Settings
from ferryman.telemetry import Telemetry

T = TypeVar("T")

# 2023-11-15T00:00:00Z: a multiple of every unit up to a day, so window arithmetic is plain.
EPOCH = 1_700_006_400.0

Entries = Sequence[tuple[str, str]]


def descriptor(
    entries: Entries,
    *,
    hits: int | None = None,
    limit: tuple[int, int] | None = None,
    negative: bool = False,
) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.value = hits
    if limit is not None:
        d.limit.requests_per_unit = limit[0]
        d.limit.unit = cast(ratelimit_unit_pb2.RateLimitUnit, limit[1])
    if negative:
        mark_negative_hits(d)
    return d


def rls_stub(channel: grpc.Channel) -> rls_pb2_grpc.RateLimitServiceStub:
    """An Envoy RLS client on ``channel`` (the generated constructor is untyped)."""
    return rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]


def limiter_stub(channel: grpc.Channel) -> limiter_pb2_grpc.LimiterStub:
    """A ``ferryman.v1.Limiter`` client on ``channel`` (the generated constructor is untyped)."""
    return limiter_pb2_grpc.LimiterStub(channel)  # type: ignore[no-untyped-call]


def quota_stub(channel: grpc.Channel) -> quota_service_pb2_grpc.QuotaServiceStub:
    """A ``quotaservice.QuotaService`` client on ``channel``."""
    return quota_service_pb2_grpc.QuotaServiceStub(channel)  # type: ignore[no-untyped-call]


def quota_events_stub(channel: grpc.Channel) -> limiter_pb2_grpc.QuotaEventsStub:
    """A ``ferryman.v1.QuotaEvents`` client on ``channel``."""
    return limiter_pb2_grpc.QuotaEventsStub(channel)  # type: ignore[no-untyped-call]


# What asyncio logs when an exception or a coroutine was lost.
LOST = ("Task exception was never retrieved", "was never awaited")


class Server:
    """A Service running on its own event loop thread, with loopback clients."""

    def __init__(
        self,
        settings: Settings,
        clock: ManualClock,
        backend: Backend | None,
        telemetry: Telemetry | None = None,
        real_clock: bool = False,
    ) -> None:
        self.settings = settings
        self.clock = clock  # with real_clock the Service reads the system clock instead
        self.loop = asyncio.new_event_loop()
        # FERRYMAN_ASYNCIO_DEBUG=1 runs every server's loop in asyncio debug mode (which
        # says where a lost task or coroutine came from); lost ones fail the test either way.
        self.loop.set_debug(os.environ.get("FERRYMAN_ASYNCIO_DEBUG") == "1")
        self.loop.slow_callback_duration = 10.0
        self.lost: list[str] = []
        self.loop.set_exception_handler(self._exception)
        self.service = Service(
            settings,
            clock=SystemClock() if real_clock else clock,
            backend=backend,
            telemetry=telemetry,
        )
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.run(self.service.start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.service.grpc_port}")
        self.stub = rls_stub(self.channel)
        self._stopped = False

    def _exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if any(lost in message for lost in LOST):
            self.lost.append(f"{message}: {context.get('exception')!r}")
        loop.default_exception_handler(context)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    @property
    def stats(self) -> dict[str, int]:
        return self.service.stats.snapshot()

    def stat(self, name: str) -> int:
        return self.service.stats.get(name)

    def ask(
        self,
        domain: str,
        *descriptors: Entries | ratelimit_pb2.RateLimitDescriptor,
        hits: int = 0,
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> rls_pb2.RateLimitResponse:
        built = [
            d if isinstance(d, ratelimit_pb2.RateLimitDescriptor) else descriptor(d)
            for d in descriptors
        ]
        request = rls_pb2.RateLimitRequest(domain=domain, descriptors=built, hits_addend=hits)
        response: rls_pb2.RateLimitResponse = self.stub.ShouldRateLimit(
            request, timeout=10, metadata=metadata
        )
        return response

    def http(
        self, method: str, path: str, body: bytes | None = None, debug: bool = False
    ) -> tuple[int, bytes]:
        port = self.service.debug_port if debug else self.service.http_port
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request(method, path, body=body)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stop(self, grace: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.channel.close()
        self.run(self.service.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        gc.collect()  # a lost task exception is reported when its task is collected
        assert not self.lost, self.lost


ServerFactory = Callable[..., Server]


class ConfigDir:
    """A descriptor directory that tests write YAML into."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, text: str) -> Path:
        target = self.path / name
        target.write_text(text)
        return target


# The reference's README example: five marketing messages a day per number.
MESSAGING = """
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
"""

# One request touching each kind of node: a fixed window, burst tiers, held copies.
MIXED = """
domain: mx
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tiers
    burst_tiers:
      - {limit: 100, window: 1s, active: 1h}
  - key: seats
    copies: {limit: 100, hold_ttl: 30s}
"""
MIXED_REQUEST = ([("fixed", "a")], [("tiers", "t")], [("seats", "s")])


def wait_for(
    what: str,
    predicate: Callable[[], object],
    timeout: float = 5,
    interval: float = 0.02,
    ignoring: tuple[type[BaseException], ...] = (),
) -> float:
    """Poll ``predicate`` until it is true (an exception in ``ignoring`` counts as not yet);
    the seconds it took. Fails naming ``what`` once ``timeout`` passes."""
    start = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - start
        except ignoring:
            pass
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)


def codes(response: rls_pb2.RateLimitResponse) -> list[str]:
    """Status codes by name, for compact assertions."""
    name = rls_pb2.RateLimitResponse.Code.Name
    return [name(s.code) for s in response.statuses]


def overall(response: rls_pb2.RateLimitResponse) -> str:
    return rls_pb2.RateLimitResponse.Code.Name(response.overall_code)


def remaining(response: rls_pb2.RateLimitResponse) -> list[int]:
    return [s.limit_remaining for s in response.statuses]
