"""Requests whose bytes do not decode (invalid UTF-8 in a string, a corrupt message).

grpc.aio answers those UNKNOWN and logs a traceback per request. Bad input is the client's
problem: each method's deserializer is wrapped once, at registration, so that such a request
reaches a small guard instead, which counts it, reports it through a ThrottledLog (one line
per interval, with a count) and answers INVALID_ARGUMENT. Decodable requests pay one class
check, made by the edge's own wrapper where there is one (no coroutine of the guard's then).
The same guard runs the peer check of mutual TLS (``authorize``), so that it covers every
method of every service, health included. A method marked ``answers_encoded`` returns its
response already serialized: its handler is registered without a serializer.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from ferryman.logs import ThrottledLog
from ferryman.stats import Stats

__all__ = [
    "ANSWERS_ENCODED",
    "CHECKS_UNDECODABLE",
    "UNDECODABLE",
    "GuardedServer",
    "Undecodable",
    "answers_encoded",
]

log = logging.getLogger("ferryman.grpc")

# Counted for every undecodable request, whichever the method.
UNDECODABLE = "ratelimit.service.undecodable_requests"


class Undecodable:
    """What a request that failed to decode is handed on as: ``refuse(context)`` answers it
    (a method wrapped by the edge calls it first thing, so it needs no guard of its own)."""

    __slots__ = ("_refuse", "error")

    def __init__(self, error: str, refuse: Callable[[Undecodable, Any], Awaitable[None]]) -> None:
        self.error = error
        self._refuse = refuse

    def refuse(self, context: Any) -> Awaitable[None]:
        """Count and log the request, and answer it INVALID_ARGUMENT (raises, as abort)."""
        return self._refuse(self, context)


#: Set on a method behaviour that answers an Undecodable request itself (``Edge``).
CHECKS_UNDECODABLE = "ferryman_checks_undecodable"
#: Set on a method behaviour whose responses are serialized bytes (``answers_encoded``).
ANSWERS_ENCODED = "ferryman_answers_encoded"

F = TypeVar("F", bound=Callable[..., Any])


def answers_encoded(method: F) -> F:
    """Marks a servicer method that returns its response serialized (bytes): gRPC then
    sends them as they are. Wrappers of the method carry the mark on (``Edge``)."""
    setattr(method, ANSWERS_ENCODED, True)
    return method


def _tolerant(
    deserialize: Callable[[bytes], Any] | None,
    refuse: Callable[[Undecodable, Any], Awaitable[None]],
) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return Undecodable(str(exc), refuse)

    return parse


class GuardedServer:
    """Stands in for a grpc.aio.Server while servicers are registered on it: every method
    handler it is given gets the tolerant deserializer and the guard."""

    def __init__(
        self,
        server: grpc.aio.Server,
        stats: Stats,
        error_stats: dict[str, tuple[str, ...]] | None = None,
        interval: float = 10.0,
        authorize: Callable[[Any], Awaitable[None]] | None = None,
    ) -> None:
        self._server = server
        self._authorize = authorize
        self._stats = stats
        # method path -> the method's own error stat, counted as well
        self._error_stats = error_stats or {}
        self.reporter = ThrottledLog(log, interval)

    def add_generic_rpc_handlers(
        self, handlers: Sequence[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        # The generated code registers each service twice, as a generic handler and then by
        # name; the guarded generic handler is added with the named ones, below.
        pass

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        guarded = {
            name: self._guard(f"/{service}/{name}", handler) for name, handler in handlers.items()
        }
        # Present on grpc.aio servers, missing from the type stubs.
        self._server.add_registered_method_handlers(service, guarded)  # type: ignore[attr-defined]
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, guarded),)
        )

    def add_on_first_call(self, handler: grpc.GenericRpcHandler[Any, Any]) -> None:
        """Adds ``handler`` as it is: a service whose methods' handlers are made by its first
        call, each through a guard like this one (``over``)."""
        self._server.add_generic_rpc_handlers((handler,))

    def over(self, server: Any, error_stats: dict[str, tuple[str, ...]]) -> GuardedServer:
        """A guard like this one (its counters, log and peer check) over ``server``."""
        twin = GuardedServer(server, self._stats, error_stats, authorize=self._authorize)
        twin.reporter = self.reporter
        return twin

    async def _refuse(self, method: str, bad: Undecodable, context: Any) -> None:
        self._stats.inc(UNDECODABLE)
        for name in self._error_stats.get(method, ()):
            self._stats.inc(name)
        peer = context.peer() if hasattr(context, "peer") else "?"
        self.reporter.report(
            f"undecodable request to {method} from {peer}: {bad.error}", method=method
        )
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request: {bad.error}")

    def _guard(self, method: str, handler: Any) -> Any:
        if _answers_encoded(handler):
            handler = handler._replace(response_serializer=None)
        if handler.request_deserializer is None:
            return handler
        authorize = self._authorize

        async def refuse(bad: Undecodable, context: Any) -> None:
            await self._refuse(method, bad, context)

        async def undecoded(request: Any, context: Any) -> Any:
            if isinstance(request, Undecodable):
                await request.refuse(context)
            return request

        async def check(request: Any, context: Any) -> Any:
            if authorize is not None:
                await authorize(context)
            return await undecoded(request, context)

        async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                yield await undecoded(request, context)

        async def check_stream(requests: AsyncIterator[Any], context: Any) -> Any:
            if authorize is not None:
                await authorize(context)
            return checked(requests, context)

        prepare = check_stream if handler.request_streaming else check
        changes: dict[str, Any] = {
            "request_deserializer": _tolerant(handler.request_deserializer, refuse)
        }
        for field in _BEHAVIOURS:
            inner = getattr(handler, field)
            if inner is None:
                continue
            if authorize is None and getattr(inner, CHECKS_UNDECODABLE, False):
                changes[field] = inner  # no coroutine of ours in between on the request path
            else:
                changes[field] = _wrap(inner, prepare)
        return handler._replace(**changes)


Prepare = Callable[[Any, Any], Awaitable[Any]]

_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _answers_encoded(handler: Any) -> bool:
    """Whether the handler's behaviour returns serialized responses (``answers_encoded``)."""
    return any(getattr(getattr(handler, f), ANSWERS_ENCODED, False) for f in _BEHAVIOURS)


def _wrap(inner: Callable[..., Any], prepare: Prepare) -> Callable[..., Any]:
    """A behaviour of the same kind as ``inner`` (grpc.aio tells them apart) that passes
    the request through ``prepare`` first."""
    if inspect.isasyncgenfunction(inner):

        async def generator(request: Any, context: Any) -> AsyncIterator[Any]:
            async for reply in inner(await prepare(request, context), context):
                yield reply

        return generator
    if inspect.iscoroutinefunction(inner):

        async def coroutine(request: Any, context: Any) -> Any:
            return await inner(await prepare(request, context), context)

        return coroutine
    return inner
