"""The quota service's API, ``quotaservice.QuotaService/Allow``, on token buckets (its
events are in ``quota_events``)."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from ferryman._proto.quotaservice import quota_service_pb2, quota_service_pb2_grpc
from ferryman.access import MAX_BUCKET_NAME, Access
from ferryman.algorithms.token_bucket.model import BucketStore, TakeResult, TakeStatus
from ferryman.apis import api
from ferryman.apis.quota_hub import QUOTA, BucketEvent, QuotaEventHub
from ferryman.config.quota import NAME
from ferryman.config.reloader import ConfigHolder
from ferryman.edge.rpc import Method
from ferryman.errors import BackendError
from ferryman.stats import Stats

__all__ = ["API", "METHODS", "SERVICE", "QuotaServicer"]

log = logging.getLogger("ferryman.quota")

SERVICE = quota_service_pb2.DESCRIPTOR.services_by_name["QuotaService"]
# Allow answers every problem with a status of its own: nothing for the edge to map.
METHODS = {"Allow": Method("ratelimit.service.call.allow")}
_BY_STATUS = {
    TakeStatus.REJECTED_TIMEOUT: "timeout",
    TakeStatus.REJECTED_TOO_MANY_TOKENS_REQUESTED: "too_many_tokens_requested",
    TakeStatus.REJECTED_TOO_MANY_BUCKETS: "too_many_buckets",
}
Context = grpc.aio.ServicerContext[Any, Any]


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
        access: Access | None = None,
    ) -> None:
        self._access = access or Access.unrestricted()
        self._holder = holder
        self.store = store
        self._hub = hub
        self._stats = stats
        self._fail_open = fail_open

    async def Allow(
        self, request: quota_service_pb2.AllowRequest, context: Context
    ) -> quota_service_pb2.AllowResponse:
        status, granted, wait = await self.checked(
            context,
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

    async def checked(
        self,
        context: Any,
        namespace: str,
        bucket: str,
        tokens: int,
        max_wait_millis: int | None,
    ) -> tuple[TakeStatus, int, int]:
        """``allow`` for the caller of ``context`` (a gRPC call's, or an HTTP request's
        ``Caller``): the access policy's ``quota`` on the namespace (AccessDeniedError),
        and its cap on the dynamic buckets one caller makes. Every door of Allow comes here."""
        self._access.require(context, "quota", namespace)
        maker = self._access.bucket_maker(context)
        return await self.allow(namespace, bucket, tokens, max_wait_millis, caller=maker)

    async def allow(
        self,
        namespace: str,
        bucket: str,
        tokens: int,
        max_wait_millis: int | None,
        caller: str = "",
    ) -> tuple[TakeStatus, int, int]:
        """(status, tokens granted, wait in milliseconds) for one request."""
        self._stats.inc(f"{QUOTA}.allow")
        if (
            tokens < 0
            or (max_wait_millis is not None and max_wait_millis < 0)
            or not NAME.fullmatch(namespace)
            or not NAME.fullmatch(bucket)
            or len(bucket) > MAX_BUCKET_NAME
        ):
            self._stats.inc(f"{QUOTA}.invalid_request")
            return TakeStatus.REJECTED_INVALID_REQUEST, 0, 0
        tokens = max(tokens, 1)
        config = self._holder.config
        quota = config.quota if config is not None else None
        found = quota.lookup(namespace, bucket) if quota is not None else None
        if found is None:
            self._hub.emit(BucketEvent("bucket_miss", namespace, bucket, tokens=tokens))
            return TakeStatus.REJECTED_NO_BUCKET, 0, 0
        ref, spec = found
        buckets = self._access.buckets
        if ref.dynamic and buckets.refuses(caller, namespace, bucket):
            return TakeStatus.REJECTED_TOO_MANY_BUCKETS, 0, 0
        allowed = spec.wait_timeout_millis
        if max_wait_millis is not None:
            allowed = min(allowed, max_wait_millis)
        try:
            result = await self.store.take(ref, spec, tokens, allowed)
        except BackendError as exc:
            self._stats.inc(f"{QUOTA}.store_error")
            log.warning("token bucket store error: %s", exc)
            if self._fail_open:
                return TakeStatus.OK, tokens, 0
            return TakeStatus.REJECTED_SERVER_ERROR, 0, 0
        buckets.record(caller, namespace, bucket, result.created, result.removed)
        self._events(namespace, bucket, ref.dynamic, tokens, result)
        return result.status, result.tokens_granted, result.wait_millis

    def _events(
        self, namespace: str, bucket: str, dynamic: bool, tokens: int, result: TakeResult
    ) -> None:
        emit = self._hub.emit
        for name in result.removed:
            emit(BucketEvent("bucket_removed", namespace, name, True))
        if result.created:
            emit(BucketEvent("bucket_created", namespace, bucket, True))
        if result.status is TakeStatus.OK:
            kind = "tokens_served_with_wait" if result.wait_millis > 0 else "tokens_served"
        else:
            kind = _BY_STATUS[result.status]
        emit(BucketEvent(kind, namespace, bucket, dynamic, tokens, result.wait_millis))


API = api.API(
    SERVICE,
    quota_service_pb2_grpc.add_QuotaServiceServicer_to_server,
    api.built(
        lambda parts: QuotaServicer(
            parts.holder,
            parts.quota_store,
            parts.quota_events,
            parts.stats,
            fail_open=parts.settings.fail_open,
            access=parts.access,
        )
    ),
    methods=METHODS,
    health=(SERVICE.full_name,),
)
