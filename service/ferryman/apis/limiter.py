"""Ferryman's own gRPC service, ``ferryman.v1.Limiter``: Charon's operations on descriptors."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import grpc

from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman.access import Access
from ferryman.access.policy import MAX_PRIORITY
from ferryman.apis import api
from ferryman.apis.holds import HoldManager, Session
from ferryman.connections.deadline import margin
from ferryman.edge.rpc import Method
from ferryman.engine import RateLimitEngine
from ferryman.engine.validate import MAX_TRANSFER_ID, check_descriptor, check_name, check_names
from ferryman.errors import LeaseLostError, RequestError
from ferryman.stats import REQUEST_CALL

__all__ = ["API", "METHODS", "SERVICE", "LimiterServicer"]

log = logging.getLogger("ferryman.limiter")

SESSION_METADATA = "ferryman-session"

SERVICE = limiter_pb2.DESCRIPTOR.services_by_name["Limiter"]

#: What the edge records of each method: the prefix of its error counters.
METHODS = {
    "Session": Method("ratelimit.service.call.session"),
    "Reserve": Method("ratelimit.service.call.reserve"),
    "Release": Method("ratelimit.service.call.release"),
    "Transfer": Method("ratelimit.service.call.transfer"),
    "Seize": Method("ratelimit.service.call.seize"),
    "Request": Method(REQUEST_CALL),
}
T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]


def _entries(descriptor: Any) -> tuple[tuple[str, str], ...]:
    return tuple((e.key, e.value) for e in descriptor)


def _wait(request: limiter_pb2.ReserveRequest, context: Context) -> float:
    """How long a reservation may wait (seconds): its max_wait, ended early enough before
    the call's own deadline for the answer to reach the caller."""
    max_wait = request.max_wait
    if max_wait.seconds < 0 or max_wait.nanos < 0:
        raise RequestError("max_wait", "must not be negative")
    wait = max_wait.seconds + max_wait.nanos / 1e9
    remaining = context.time_remaining()
    if wait > 0 and remaining is not None and remaining < 1e6:
        # Leave room to leave the queue and answer (a tenth, at most 100 ms).
        wait = min(wait, remaining - margin(remaining) - min(0.1, remaining * 0.1))
    return max(wait, 0.0)


def _duration(seconds: float, into: Any) -> None:
    whole = math.floor(seconds)
    into.seconds = whole
    into.nanos = round((seconds - whole) * 1e9)


class LimiterServicer(limiter_pb2_grpc.LimiterServicer):
    """Charon's operations (errors become statuses at the edge)."""

    def __init__(
        self, engine: RateLimitEngine, holds: HoldManager, access: Access | None = None
    ) -> None:
        self._engine = engine
        self._holds = holds
        self._access = access or Access.unrestricted()

    def _session(self, context: Context) -> Session:
        metadata = dict(context.invocation_metadata() or ())
        value = metadata.get(SESSION_METADATA)
        return self._holds.get(
            value if isinstance(value, str) else None, self._access.owner(context)
        )

    async def Session(
        self, request_iterator: AsyncIterator[limiter_pb2.SessionRequest], context: Context
    ) -> AsyncIterator[limiter_pb2.SessionEvent]:
        Event = limiter_pb2.SessionEvent
        try:
            first = await request_iterator.__anext__()
        except StopAsyncIteration:
            return
        if not first.HasField("open"):
            raise RequestError("open", "the first message of a session must be open")
        check_name(first.open.client_name, "open.client_name", required=False)
        end = self._access.open_stream(context, self._access.sessions)
        session = self._holds.open(first.open.client_name, self._access.owner(context))
        replies: asyncio.Queue[limiter_pb2.SessionEvent | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for message in request_iterator:
                    if message.HasField("ping"):
                        replies.put_nowait(Event(pong=Event.Pong()))
            finally:
                replies.put_nowait(None)

        reader = asyncio.create_task(read())
        ended = asyncio.create_task(session.ended.wait())
        try:
            yield Event(opened=Event.Opened(session_id=session.id))
            while True:
                nxt = asyncio.create_task(replies.get())
                done, _ = await asyncio.wait({nxt, ended}, return_when=asyncio.FIRST_COMPLETED)
                if ended in done:
                    nxt.cancel()
                    yield Event(closing=Event.Closing(reason=session.reason))
                    raise LeaseLostError(session.reason)
                reply = nxt.result()
                if reply is None:
                    break
                yield reply
        finally:
            reader.cancel()
            ended.cancel()
            end()
            # The stream may be torn down by cancellation: release in a task of its own.
            self._holds.spawn_close(session)

    async def Reserve(
        self, request: limiter_pb2.ReserveRequest, context: Context
    ) -> limiter_pb2.ReserveResponse:
        copies = request.copies or 1
        min_copies = request.min_copies if request.HasField("min_copies") else copies

        if min_copies > copies:
            raise RequestError("min_copies", f"{min_copies} is more than copies ({copies})")
        check_descriptor(request.domain, _entries(request.descriptor), "descriptor")
        if request.priority > MAX_PRIORITY:
            raise RequestError("priority", f"{request.priority} is over {MAX_PRIORITY}")
        wait = _wait(request, context)
        self._priority(self._access.require(context, "holds", request.domain), request)
        session = self._session(context)
        done = await self._holds.reserve(
            session,
            request.domain,
            _entries(request.descriptor),
            copies,
            min_copies,
            wait,
            request.priority,
        )
        out = done.outcome
        reply = limiter_pb2.ReserveResponse(
            granted=out.granted,
            tenant_held=out.tenant_held,
            global_held=out.global_held,
            groups=[
                limiter_pb2.Group(name=g.name, limit=g.limit, held=out.group_held[g.name])
                for g in done.groups
            ],
        )
        if done.policy.limit is not None:
            reply.limit = done.policy.limit
        if done.policy.global_limit is not None:
            reply.global_limit = done.policy.global_limit
        # Whenever the call asked to wait, even if its deadline left no time for it: that is
        # how a client tells this server from one without queues.
        m = request.max_wait
        reply.queued = request.HasField("max_wait") and (m.seconds > 0 or m.nanos > 0)
        return reply

    def _priority(self, caller: Any, request: limiter_pb2.ReserveRequest) -> None:
        """Refuse a priority above what the access policy lets the caller claim."""
        policy = self._access.policy
        if caller is None or policy is None or request.priority == 0:
            return
        top = policy.max_priority(caller.names)
        if request.priority > top:
            self._access.deny(caller, f"claim a priority over {top}", request.domain)

    async def Release(
        self, request: limiter_pb2.ReleaseRequest, context: Context
    ) -> limiter_pb2.ReleaseResponse:
        if request.copies == 0:
            raise RequestError("copies", "must be at least 1")
        check_descriptor(request.domain, _entries(request.descriptor), "descriptor")
        check_names(request.groups, "groups")
        self._access.require(context, "holds", request.domain)
        await self._holds.release(
            self._session(context),
            request.domain,
            _entries(request.descriptor),
            request.copies,
            tuple(request.groups),
        )
        return limiter_pb2.ReleaseResponse()

    async def Transfer(
        self, request: limiter_pb2.TransferRequest, context: Context
    ) -> limiter_pb2.TransferResponse:
        if request.copies == 0:
            raise RequestError("copies", "must be at least 1")
        check_descriptor(request.domain, _entries(request.descriptor), "descriptor")
        check_names(request.groups, "groups")
        ttl = request.ttl.ToTimedelta().total_seconds()
        if ttl <= 0:
            raise RequestError("ttl", "must be positive")
        self._access.require(context, "holds", request.domain)
        transfer_id = await self._holds.transfer(
            self._session(context),
            request.domain,
            _entries(request.descriptor),
            request.copies,
            tuple(request.groups),
            ttl,
        )
        return limiter_pb2.TransferResponse(transfer_id=transfer_id)

    async def Seize(
        self, request: limiter_pb2.SeizeRequest, context: Context
    ) -> limiter_pb2.SeizeResponse:
        check_name(request.transfer_id, "transfer_id", most=MAX_TRANSFER_ID)
        self._access.require(context, "holds", self._holds.transfer_domain(request.transfer_id))
        domain, entries, groups, copies = await self._holds.seize(
            self._session(context), request.transfer_id
        )
        return limiter_pb2.SeizeResponse(
            domain=domain,
            descriptor=[limiter_pb2.Entry(key=k, value=v) for k, v in entries],
            groups=list(groups),
            copies=copies,
        )

    async def Request(
        self, request: limiter_pb2.RateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> limiter_pb2.RateResponse:
        copies = request.copies or 1
        min_copies = request.min_copies if request.HasField("min_copies") else copies
        entries = tuple((e.key, e.value) for e in request.descriptor)

        if min_copies > copies:
            raise RequestError("min_copies", f"{min_copies} is more than copies ({copies})")
        max_wait = request.max_wait
        if max_wait.seconds < 0 or max_wait.nanos < 0:
            raise RequestError("max_wait", "must not be negative")
        wait_ms = min(max_wait.seconds * 1000 + max_wait.nanos // 1_000_000, 2**31 - 1)
        self._access.require(context, "request", request.domain)
        got = await self._engine.request(request.domain, entries, copies, min_copies, wait_ms)
        reply = limiter_pb2.RateResponse(granted=got.granted)
        for name, value in got.fields.items():
            setattr(reply, name, value)
        for name, seconds in got.durations.items():
            _duration(seconds, getattr(reply, name))
        return reply


API = api.API(
    SERVICE,
    limiter_pb2_grpc.add_LimiterServicer_to_server,
    api.built(lambda parts: LimiterServicer(parts.engine, parts.holds, parts.access)),
    methods=METHODS,
    health=(SERVICE.full_name,),
)
