"""The edge every gRPC API shares: one wrapper around each method of each servicer that
counts the call, times it, traces it, and turns a ferryman error into its gRPC status
(from ``errors.STATUSES``, the one table), so that a servicer only converts messages.
Streaming methods go through it as well: counted on entry, their errors answered from the
same table, whenever in the stream they are raised.

The caller's deadline of a unary call (less a margin, see ``ferryman.connections.deadline``)
is handed down to the backend connection, which answers with the failure policy before it
passes. A stream's deadline is not: it bounds the stream, not the backend calls made for it
(a session's holds are released after it ends)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from ferryman.connections.deadline import ANSWER_BY, answer_by
from ferryman.edge.decoding import ANSWERS_ENCODED, CHECKS_UNDECODABLE, Undecodable
from ferryman.errors import BackendError, FerrymanError, status_of
from ferryman.stats import Stats, total_requests
from ferryman.telemetry import Telemetry

__all__ = ["Edge", "Method", "OnFirstCall", "grpc_status"]

log = logging.getLogger("ferryman.server")

Context = grpc.aio.ServicerContext[Any, Any]
Unary = Callable[[Any, Context], Awaitable[Any]]


def grpc_status(error: FerrymanError) -> tuple[grpc.StatusCode, str]:
    """The status and message a call that failed with ``error`` is answered with."""
    status = status_of(error)
    message = f"rate limit backend: {error}" if isinstance(error, BackendError) else str(error)
    return grpc.StatusCode[status.grpc], message


@dataclass(frozen=True)
class Method:
    """What the edge records of one method: the prefix of its error counters, the span
    attributes read from its request and its response (for the unary methods that have
    them), and the counters a request to it that does not decode adds to the guard's own."""

    counters: str
    request_attributes: Callable[[Any], Mapping[str, str | int]] | None = None
    response_attributes: Callable[[Any], Mapping[str, str | int]] | None = None
    undecodable: tuple[str, ...] = ()


class Edge:
    """Wraps servicers before they are added to the server."""

    def __init__(self, stats: Stats, telemetry: Telemetry | None = None) -> None:
        self._stats = stats
        self._latency = telemetry.request_latency if telemetry is not None else None
        self._telemetry = telemetry if telemetry is not None and telemetry.tracer else None

    def wrap(self, servicer: Any, service: ServiceDescriptor, methods: Mapping[str, Method]) -> Any:
        """``servicer`` with each method of ``service`` wrapped (``methods`` says how; a
        method missing from it is an error at start, not a call that escapes the edge)."""
        for m in service.methods:
            fn = getattr(servicer, m.name)
            method = methods[m.name]
            if m.client_streaming or m.server_streaming:
                setattr(servicer, m.name, self._stream(m.name, method, fn))
            else:
                setattr(servicer, m.name, self._unary(service.full_name, m.name, method, fn))
        return servicer

    def _stream(self, name: str, method: Method, fn: Callable[..., Any]) -> Callable[..., Any]:
        stats = self._stats
        total = total_requests(name)
        counters = method.counters

        async def streamed(request: Any, context: Context) -> AsyncIterator[Any]:
            stats.inc(total)
            replies = fn(request, context)
            try:
                async for reply in replies:
                    yield reply
            except FerrymanError as error:
                await self._fail(error, counters, context)
            finally:
                await replies.aclose()

        return streamed

    async def _fail(self, error: FerrymanError, counters: str, context: Context) -> NoReturn:
        code, message = grpc_status(error)
        self._stats.inc(f"{counters}.{status_of(error).counter}")
        if isinstance(error, BackendError):
            # Counted, and the backend logs its own state changes: one line per failed call
            # would flood the log during an outage.
            log.debug("%s", message)
        await context.abort(code, message)

    def _unary(self, service: str, name: str, method: Method, fn: Unary) -> Unary:
        stats = self._stats
        total = total_requests(name)
        counters = method.counters

        latency = self._latency
        telemetry = self._telemetry
        if latency is None and telemetry is None:

            async def plain(request: Any, context: Context) -> Any:
                # The plain path: no span, nothing but the deadline and the answer.
                if request.__class__ is Undecodable:
                    return await request.refuse(context)
                stats.inc(total)
                ANSWER_BY.set(answer_by(context.time_remaining()))
                try:
                    return await fn(request, context)
                except FerrymanError as error:
                    await self._fail(error, counters, context)

            setattr(plain, CHECKS_UNDECODABLE, True)
            setattr(plain, ANSWERS_ENCODED, getattr(fn, ANSWERS_ENCODED, False))
            return plain

        attributes = {"grpc_method": name}

        async def observed(request: Any, context: Context) -> Any:
            if request.__class__ is Undecodable:
                return await request.refuse(context)
            stats.inc(total)
            ANSWER_BY.set(answer_by(context.time_remaining()))
            start = perf_counter()
            try:
                if telemetry is None:
                    try:
                        return await fn(request, context)
                    except FerrymanError as error:
                        await self._fail(error, counters, context)
                return await self._traced(service, name, method, fn, request, context, telemetry)
            finally:
                if latency is not None:
                    latency.record(perf_counter() - start, attributes)

        setattr(observed, CHECKS_UNDECODABLE, True)
        setattr(observed, ANSWERS_ENCODED, getattr(fn, ANSWERS_ENCODED, False))
        return observed

    async def _traced(
        self,
        service: str,
        name: str,
        method: Method,
        fn: Unary,
        request: Any,
        context: Context,
        telemetry: Telemetry,
    ) -> Any:
        from opentelemetry import trace  # traced: OpenTelemetry is loaded

        extra = method.request_attributes(request) if method.request_attributes else {}
        failed: FerrymanError | None = None
        with telemetry.server_span(context.invocation_metadata(), service, name, extra) as span:
            try:
                response = await fn(request, context)
            except FerrymanError as error:
                failed = error
                code, message = grpc_status(error)
                span.set_status(trace.Status(trace.StatusCode.ERROR, message))
                span.set_attribute("rpc.grpc.status_code", code.value[0])
            else:
                span.set_attribute("rpc.grpc.status_code", 0)
                if method.response_attributes is not None:
                    for key, value in method.response_attributes(response).items():
                        span.set_attribute(key, value)
        if failed is not None:
            await self._fail(failed, method.counters, context)
        return response


if TYPE_CHECKING:
    _GenericHandler = grpc.GenericRpcHandler[Any, Any]
else:
    _GenericHandler = grpc.GenericRpcHandler


class OnFirstCall(_GenericHandler):
    """One service, on the port from the start by its name, whose methods' handlers are
    made by its first call: ``load(server)`` registers them on ``server`` then (importing the
    service's servicer and generated messages only when a caller asks for them)."""

    def __init__(self, service: str, load: Callable[[Any], None]) -> None:
        self._prefix = f"/{service}/"
        self._load = load
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] | None = None

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = str(handler_call_details.method)
        if not method.startswith(self._prefix):
            return None
        if self._handlers is None:
            registered = _Registered()
            self._load(registered)
            self._handlers = registered.handlers
        return self._handlers.get(method[len(self._prefix) :])


class _Registered:
    """Takes what a generated ``add_<Name>Servicer_to_server`` registers (through a guard)."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same methods, by name below

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.handlers.update(handlers)
