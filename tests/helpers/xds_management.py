"""A small xDS management server: the ADS stream (state of the world) with the real
generated protos, serving RateLimitConfig snapshots and recording every request it gets.

It runs a grpc.aio server on its own event loop in a thread, so that tests drive it from
plain synchronous code: ``set`` pushes a new version to every open stream.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import Any

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2

from ferryman._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2
from ferryman.config.xds import TYPE_URL

from helpers.ports import free_port

Request = discovery_pb2.DiscoveryRequest


def rate_limit_config(
    domain: str, descriptors: Sequence[rls_conf_pb2.RateLimitDescriptor]
) -> rls_conf_pb2.RateLimitConfig:
    return rls_conf_pb2.RateLimitConfig(name=domain, domain=domain, descriptors=descriptors)


def limited(
    key: str, value: str, per: int, unit: rls_conf_pb2.RateLimitUnit = rls_conf_pb2.MINUTE
) -> rls_conf_pb2.RateLimitDescriptor:
    """A descriptor node ``key=value`` limited to ``per`` hits per ``unit``."""
    return rls_conf_pb2.RateLimitDescriptor(
        key=key,
        value=value,
        rate_limit=rls_conf_pb2.RateLimitPolicy(unit=unit, requests_per_unit=per),
    )


class _Servicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, owner: ManagementServer) -> None:
        self.owner = owner

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[Request],
        context: grpc.aio.ServicerContext[Request, discovery_pb2.DiscoveryResponse],
    ) -> AsyncIterator[discovery_pb2.DiscoveryResponse]:
        owner = self.owner
        owner.headers.append(dict(context.invocation_metadata() or ()))
        wake = asyncio.Event()
        owner.wakes.add(wake)
        asked = False

        async def read() -> None:
            nonlocal asked
            async for request in request_iterator:
                owner.requests.append(request)
                asked = True
                wake.set()

        reader = asyncio.create_task(read())
        sent: str | None = None
        try:
            while True:
                await wake.wait()
                wake.clear()
                snapshot = owner.snapshot
                if asked and snapshot is not None and snapshot[0] != sent:
                    sent = snapshot[0]
                    owner.nonce += 1
                    owner.sent.append((sent, str(owner.nonce)))
                    yield discovery_pb2.DiscoveryResponse(
                        version_info=sent,
                        type_url=TYPE_URL,
                        nonce=str(owner.nonce),
                        resources=snapshot[1],
                    )
        finally:
            reader.cancel()
            owner.wakes.discard(wake)


class ManagementServer:
    """ADS on 127.0.0.1:``port``; ``requests`` holds every DiscoveryRequest received,
    ``headers`` each stream's metadata, ``sent`` each (version, nonce) sent."""

    def __init__(self, port: int | None = None, tls: grpc.ServerCredentials | None = None) -> None:
        self.port = port or free_port()
        self.tls = tls
        self.requests: list[Request] = []
        self.headers: list[dict[str, Any]] = []
        self.sent: list[tuple[str, str]] = []
        self.snapshot: tuple[str, list[any_pb2.Any]] | None = None
        self.nonce = 0
        self.wakes: set[asyncio.Event] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(10)

    def start(self) -> ManagementServer:
        async def start() -> None:
            server = grpc.aio.server()
            ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(  # type: ignore[no-untyped-call]
                _Servicer(self), server
            )
            address = f"127.0.0.1:{self.port}"
            if self.tls is None:
                server.add_insecure_port(address)
            else:
                server.add_secure_port(address, self.tls)
            await server.start()
            self._server = server

        self._call(start())
        return self

    def set(self, version: str, configs: Sequence[Any]) -> None:
        """Serve ``configs`` (RateLimitConfig messages, or Any already packed) as
        ``version`` from now on, to every open stream."""
        packed: list[any_pb2.Any] = []
        for config in configs:
            if isinstance(config, any_pb2.Any):
                packed.append(config)
            else:
                item = any_pb2.Any()
                item.Pack(config)
                packed.append(item)

        async def update() -> None:
            self.snapshot = (version, packed)
            for wake in self.wakes:
                wake.set()

        self._call(update())

    def acks(self) -> list[tuple[str, str]]:
        """(version, nonce) of every ACK received."""
        return [
            (r.version_info, r.response_nonce)
            for r in list(self.requests)
            if r.response_nonce and not r.HasField("error_detail")
        ]

    def nacks(self) -> list[Request]:
        return [r for r in list(self.requests) if r.HasField("error_detail")]

    def stop(self) -> None:
        """Stop serving (open streams are cancelled); the loop stays for a restart."""

        async def stop() -> None:
            if self._server is not None:
                await self._server.stop(0)
                self._server = None

        self._call(stop())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
