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

A protocol whose servicer has nothing to start is listed in the registry as ``Deferred``:
its name and health names only. Its methods are on the port from the start (a generic
handler per service); its module, with its servicer and generated messages, is imported by
its first call, and the servicer built then, through the same edge and guard. What must run
from the start all the same (an election, a ticker) is the ``Deferred``'s ``start``, from a
module that does not import the messages.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from google.protobuf.descriptor import ServiceDescriptor

from ferryman.edge.decoding import GuardedServer
from ferryman.edge.rpc import Edge, Method, OnFirstCall

if TYPE_CHECKING:
    from ferryman.access import Access
    from ferryman.algorithms.token_bucket.model import BucketStore
    from ferryman.apis.capacity_service import CapacityService
    from ferryman.apis.holds import HoldManager
    from ferryman.apis.leased import LeasedResources
    from ferryman.apis.quota_hub import QuotaEventHub
    from ferryman.apis.rlqs import QuotaShares
    from ferryman.clock import Clock
    from ferryman.config.reloader import ConfigHolder
    from ferryman.engine import RateLimitEngine
    from ferryman.settings import Settings
    from ferryman.stats import Stats

__all__ = [
    "API",
    "Deferred",
    "Parts",
    "built",
    "health_names",
    "unary_methods",
    "undecodable_stats",
]

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

    def add(self, servicer: Any, server: GuardedServer, edge: Edge) -> None:
        """Registers ``servicer`` on ``server``, each method through ``edge``."""
        if self.edge:
            servicer = edge.wrap(servicer, self.service, self.methods)
        self.register(servicer, server)


class built(Generic[T]):
    """``serve`` for an API that has nothing to start or stop: the servicer ``build`` makes."""

    def __init__(self, build: Callable[[Parts], T]) -> None:
        self.build = build

    @asynccontextmanager
    async def __call__(self, parts: Parts) -> AsyncIterator[T]:
        yield self.build(parts)


@dataclass
class _Pending:
    """A deferred API while it is served: the parts to build it from, and once a call has
    come, its API and servicer."""

    parts: Parts
    api: API | None = None
    servicer: Any = None


@dataclass(frozen=True)
class Deferred:
    """A protocol named here and declared in ``module`` (its ``API``, whose servicer has
    nothing to start): the module is imported, and its servicer built, by the service's
    first call. ``start``, from a module without the messages, runs from the start."""

    name: str
    module: str
    health: tuple[str, ...] = ()
    # What runs from the start whether or not a call comes (capacity's election).
    start: Callable[[Parts], AbstractAsyncContextManager[None]] | None = None
    edge: bool = True

    def load(self) -> API:
        """The protocol's own ``API`` (importing its module, servicer and messages)."""
        loaded: API = importlib.import_module(self.module).API
        if (loaded.name, loaded.health) != (self.name, self.health):
            raise AssertionError(f"{self.module}.API is not {self.name} {self.health}")
        return loaded

    @property
    def service(self) -> ServiceDescriptor:
        return self.load().service

    @property
    def methods(self) -> Mapping[str, Method]:
        return self.load().methods

    @asynccontextmanager
    async def serve(self, parts: Parts) -> AsyncIterator[_Pending]:
        if self.start is None:
            yield _Pending(parts)
            return
        async with self.start(parts):
            yield _Pending(parts)

    def add(self, pending: _Pending, server: GuardedServer, edge: Edge) -> None:
        """Puts the service on ``server`` by its name; its first call builds it."""
        server.add_on_first_call(
            OnFirstCall(self.name, partial(self._build, pending, server, edge))
        )

    def _build(self, pending: _Pending, guard: GuardedServer, edge: Edge, server: Any) -> None:
        api = self.load()
        if not isinstance(api.serve, built):
            raise AssertionError(f"{self.module}.API starts something: it cannot be deferred")
        servicer = api.serve.build(pending.parts)
        api.add(servicer, guard.over(server, undecodable_stats([api])), edge)
        pending.api, pending.servicer = api, servicer

    async def drain(self, pending: _Pending) -> None:
        if pending.api is not None and pending.api.drain is not None:
            await pending.api.drain(pending.servicer)


def health_names(apis: Sequence[API | Deferred]) -> tuple[str, ...]:
    """Every name the health service reports: the whole server's ("") and each API's."""
    return ("", *(name for api in apis for name in api.health))


def unary_methods(apis: Sequence[API | Deferred]) -> list[str]:
    """The unary methods of the APIs, in order: the call metrics have one series each
    (a stream is counted in the stats, not timed as a call). Deferred APIs are imported."""
    return [
        name
        for api in apis
        for name in api.methods
        if not _streams(api.service.methods_by_name[name])
    ]


def _streams(method: Any) -> bool:
    return bool(method.client_streaming or method.server_streaming)


def undecodable_stats(apis: Sequence[API | Deferred]) -> dict[str, tuple[str, ...]]:
    """Method path -> the counters of its own that a request that does not decode adds
    (a deferred API's are added by its first call, when it is built)."""
    return {
        f"/{api.name}/{name}": method.undecodable
        for api in apis
        if isinstance(api, API)
        for name, method in api.methods.items()
        if method.undecodable
    }
