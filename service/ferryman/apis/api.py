"""What a protocol module declares: one ``API`` object, listed once in ``ferryman.apis.APIS``.

An API is built from ``Parts`` (the parts of the service it may use), never from the
service itself. Its ``serve`` context manager makes its servicer and runs whatever the
protocol needs while it is served: the service enters the APIs in the registry's order
and leaves them in reverse, as aiohttp runs its cleanup contexts. ``drain`` is the one
step taken once the gRPC server refuses new calls and before its calls in flight are
waited for: it ends the API's long streams, so that their clients move to another replica
at once instead of holding the grace period; again in reverse order.

A protocol with nothing to start (its module imports ``ferryman.apis.api``)::

    API = api.API(
        SERVICE,
        foo_pb2_grpc.add_FooServicer_to_server,
        api.built(lambda parts: FooServicer(parts.engine)),
        methods={"Bar": Method("ratelimit.service.call.bar")},
        health=(SERVICE.full_name,),
    )
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.descriptor import ServiceDescriptor

from ferryman.edge.rpc import Method

if TYPE_CHECKING:
    from ferryman.access import Access
    from ferryman.algorithms.token_bucket.model import BucketStore
    from ferryman.apis.capacity import CapacityService
    from ferryman.apis.holds import HoldManager
    from ferryman.apis.leased import LeasedResources
    from ferryman.apis.quota_events import QuotaEventHub
    from ferryman.apis.rlqs import QuotaShares
    from ferryman.clock import Clock
    from ferryman.config.reloader import ConfigHolder
    from ferryman.engine import RateLimitEngine
    from ferryman.settings import Settings
    from ferryman.stats import Stats

__all__ = ["API", "Parts", "built", "health_names", "unary_methods", "undecodable_stats"]

T = TypeVar("T")


@dataclass(frozen=True)
class Parts:
    """What the APIs are built from: the service's shared parts, and the gRPC port bound
    (0 on a unix socket)."""

    settings: Settings
    clock: Clock
    stats: Stats
    holder: ConfigHolder
    engine: RateLimitEngine
    holds: HoldManager
    quota_store: BucketStore
    quota_events: QuotaEventHub
    capacity: CapacityService
    leased: LeasedResources | None
    rlqs: QuotaShares
    healthy: Callable[[], bool]
    health_names: tuple[str, ...]
    # Set when the process starts draining: health reports not serving at once, for good.
    draining: asyncio.Event
    grpc_port: int
    # Who may do what: every API checks its calls with ``access.require``.
    access: Access


@dataclass(frozen=True)
class API:
    """One gRPC service: its descriptor, how its servicer is registered (the generated
    ``add_<Name>Servicer_to_server``) and served, what the edge records of each method, the
    names it is reported under by the health service, and its drain step."""

    service: ServiceDescriptor
    register: Callable[[Any, Any], None]
    serve: Callable[[Parts], AbstractAsyncContextManager[Any]]
    methods: Mapping[str, Method] = field(default_factory=dict)
    health: tuple[str, ...] = ()
    drain: Callable[[Any], Awaitable[None]] | None = None
    # False only for the health service: probes are not calls, and count nothing.
    edge: bool = True

    @property
    def name(self) -> str:
        return str(self.service.full_name)


def built(build: Callable[[Parts], T]) -> Callable[[Parts], AbstractAsyncContextManager[T]]:
    """``serve`` for an API that has nothing to start or stop: the servicer ``build`` makes."""

    @asynccontextmanager
    async def serve(parts: Parts) -> AsyncIterator[T]:
        yield build(parts)

    return serve


def health_names(apis: Sequence[API]) -> tuple[str, ...]:
    """Every name the health service reports: the whole server's ("") and each API's."""
    return ("", *(name for api in apis for name in api.health))


def unary_methods(apis: Sequence[API]) -> list[str]:
    """The unary methods of the APIs, in order: the call metrics have one series each
    (a stream is counted in the stats, not timed as a call)."""
    return [
        name
        for api in apis
        for name in api.methods
        if not _streams(api.service.methods_by_name[name])
    ]


def _streams(method: Any) -> bool:
    return bool(method.client_streaming or method.server_streaming)


def undecodable_stats(apis: Sequence[API]) -> dict[str, tuple[str, ...]]:
    """Method path -> the counters of its own that a request that does not decode adds."""
    return {
        f"/{api.name}/{name}": method.undecodable
        for api in apis
        for name, method in api.methods.items()
        if method.undecodable
    }
