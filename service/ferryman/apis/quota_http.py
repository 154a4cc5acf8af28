"""The quota service's Allow over HTTP: ``POST /quota/allow`` on the HTTP port, the same
fields and statuses as the gRPC call, in JSON (the REST interface of the quota service),
through the same servicer: the access policy's ``quota`` permission and the cap on the
dynamic buckets one caller makes hold on both doors."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from ferryman.access import Access, http_caller
from ferryman.algorithms.token_bucket.model import BucketStore, TakeStatus
from ferryman.apis.quota_hub import QuotaEventHub
from ferryman.config.reloader import ConfigHolder
from ferryman.edge.http import HttpRequest, HttpResponse
from ferryman.edge.tls import TlsFiles
from ferryman.errors import FerrymanError, RequestError, status_of
from ferryman.settings import Settings
from ferryman.stats import Stats

if TYPE_CHECKING:
    from ferryman.apis.quota import QuotaServicer

__all__ = ["QuotaHttp"]

_HTTP_STATUS = {
    TakeStatus.OK: 200,
    TakeStatus.REJECTED_NO_BUCKET: 404,
    TakeStatus.REJECTED_INVALID_REQUEST: 400,
    TakeStatus.REJECTED_SERVER_ERROR: 503,
}
_UINT32 = 2**32 - 1


class QuotaParts(Protocol):
    """What the endpoint needs of the service (its TLS files are known once it starts)."""

    settings: Settings
    stats: Stats
    holder: ConfigHolder
    quota_store: BucketStore
    quota_events: QuotaEventHub
    access: Access
    tls: TlsFiles | None


class QuotaHttp:
    """``POST /quota/allow``: JSON ``{namespace, bucket_name, tokens_requested,
    max_wait_millis_override}`` in (read as JSON whatever its Content-Type), ``{status,
    tokens_granted, wait_millis}`` out. The HTTP status follows: 200 OK, 429 for a refusal
    of the bucket, 404 for no such bucket, 400 for a bad request (with ``error`` naming the
    field; a body not JSON, or nested deeper than HTTP_MAX_JSON_DEPTH), 503 when the store
    failed; 403 (with ``error``) for a caller the access policy does not grant ``quota`` on
    the namespace, as gRPC's PERMISSION_DENIED, and without a verified client certificate
    under mutual TLS, as ``/json``."""

    def __init__(self, parts: QuotaParts) -> None:
        self._parts = parts
        # The quota service's servicer (and its messages), made by the first request.
        self._made: QuotaServicer | None = None

    @classmethod
    def of(cls, parts: QuotaParts) -> QuotaHttp:
        """The endpoint over a service's config, bucket store, events and stats."""
        return cls(parts)

    def _servicer(self) -> QuotaServicer:
        if self._made is None:
            from ferryman.apis.quota import QuotaServicer

            parts = self._parts
            self._made = QuotaServicer(
                parts.holder,
                parts.quota_store,
                parts.quota_events,
                parts.stats,
                fail_open=parts.settings.fail_open,
                access=parts.access,
            )
        return self._made

    async def allow(self, request: HttpRequest) -> HttpResponse:
        tls = self._parts.tls
        denied = tls.http_denied(request.peercert) if tls is not None else None
        if denied is not None:
            return HttpResponse(403, f"forbidden: {denied}\n".encode())
        try:
            fields = _read(request)
            caller = http_caller(request.peercert, request.peer)
            status, granted, wait = await self._servicer().checked(caller, *fields)
        except RequestError as exc:
            return _answer(TakeStatus.REJECTED_INVALID_REQUEST, 0, 0, str(exc))
        except FerrymanError as exc:
            body = json.dumps({"error": str(exc)}) + "\n"
            return HttpResponse(status_of(exc).http, body.encode(), "application/json")
        return _answer(status, granted, wait)


def _read(request: HttpRequest) -> tuple[str, str, int, int | None]:
    """The request's fields, checked; RequestError naming the first bad one."""
    data = request.json()
    if not isinstance(data, dict):
        raise RequestError("body", "expected a JSON object")
    names = []
    for key in ("namespace", "bucket_name"):
        value = data.get(key, "")
        if not isinstance(value, str):
            raise RequestError(key, f"expected a string, got {value!r}")
        names.append(value)
    tokens = _count(data, "tokens_requested", 1)
    wait = _count(data, "max_wait_millis_override", None)
    return names[0], names[1], 0 if tokens is None else tokens, wait


def _count(data: dict[str, Any], key: str, default: int | None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT32:
        raise RequestError(key, f"expected a whole number in [0, {_UINT32}], got {value!r}")
    return value


def _answer(status: TakeStatus, granted: int, wait: int, error: str = "") -> HttpResponse:
    body: dict[str, object] = {"status": status.name, "tokens_granted": granted}
    body["wait_millis"] = wait
    if error:
        body["error"] = error
    code = _HTTP_STATUS.get(status, 429)
    return HttpResponse(code, (json.dumps(body) + "\n").encode(), "application/json")
