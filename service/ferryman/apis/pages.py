"""The pages of the HTTP and debug ports that read the service's state: /json (ShouldRateLimit
as protojson), /rlconfig, /stats, /status, /explain, /capacity, and the Prometheus scrape
(/explain/envoy is in ``envoy_routes``)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs

from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import json_format

from ferryman import heap
from ferryman.access import Access, http_caller
from ferryman.algorithms import algorithm_of
from ferryman.apis.capacity_service import CapacityService
from ferryman.apis.holds import HoldManager
from ferryman.apis.rlqs import QuotaShares, explain_bucket
from ferryman.apis.rls import RateLimitServicer
from ferryman.backends.base import Backend, Synced, Watched
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import Clock
from ferryman.config.model import Config
from ferryman.config.reloader import ConfigHolder
from ferryman.core.rules import Unit
from ferryman.edge.http import HttpRequest, HttpResponse
from ferryman.edge.tls import TlsFiles
from ferryman.engine import RateLimitEngine
from ferryman.engine.explain import explain, parse_descriptor, read_now
from ferryman.engine.observe import Unconfigured
from ferryman.errors import BackendError, FerrymanError, RequestError, status_of
from ferryman.prometheus_mapping import StatsdMapping
from ferryman.replay.decision_log import DecisionLog
from ferryman.settings import Settings
from ferryman.stats import CALL, TOTAL_REQUESTS, Stats
from ferryman.telemetry import PROMETHEUS_CONTENT_TYPE, STATS_COUNTER_FAMILIES, Telemetry

if TYPE_CHECKING:
    from ferryman.apis.config_api import ConfigApi
    from ferryman.apis.config_off import ConfigApiOff
    from ferryman.apis.leased import LeasedResources


class ServiceView(Protocol):
    """What the pages read of the running service (``ferryman.server.app.Service``)."""

    settings: Settings
    stats: Stats
    clock: Clock
    holder: ConfigHolder
    engine: RateLimitEngine
    backend: Backend
    holds: HoldManager
    capacity: CapacityService
    leased: LeasedResources | None
    rlqs: QuotaShares
    config_api: ConfigApi | ConfigApiOff
    telemetry: Telemetry
    mapping: StatsdMapping | None
    tls: TlsFiles | None
    event_loop: str
    access: Access
    decision_log: DecisionLog | None

    def healthy(self) -> bool: ...


class Pages:
    """Handlers over one Service's parts; each answers from state, counting nothing but /json."""

    def __init__(self, service: ServiceView) -> None:
        self.service = service
        self._rls = RateLimitServicer(service.engine, service.access)

    async def json(self, request: HttpRequest) -> HttpResponse:
        """ShouldRateLimit with the protojson of its request and response, counted with the
        gRPC calls, through the same checks (the access policy's ``rls`` on the domain, and
        its negative hits and own limits). Under mutual TLS it needs a verified client
        certificate (it counts hits). A body nested deeper than HTTP_MAX_JSON_DEPTH is 400."""
        self.service.stats.inc(TOTAL_REQUESTS)
        denied = (
            self.service.tls.http_denied(request.peercert) if self.service.tls is not None else None
        )
        if denied is not None:
            self.service.stats.inc(f"{CALL}.service_error")
            return HttpResponse(403, f"forbidden: {denied}\n".encode())
        message = rls_pb2.RateLimitRequest()
        try:
            data = request.json()
            if not isinstance(data, dict):
                raise RequestError("body", "expected a JSON object")
            json_format.ParseDict(data, message)
        except (json_format.ParseError, RequestError) as exc:
            self.service.stats.inc(f"{CALL}.service_error")
            return HttpResponse(400, _text(f"bad request: {exc}\n"))
        try:
            caller = http_caller(request.peercert, request.peer)
            response = await self._rls.respond(message, caller)
        except FerrymanError as exc:
            status = status_of(exc)
            self.service.stats.inc(f"{CALL}.{status.counter}")
            what = "backend error" if isinstance(exc, BackendError) else "bad request"
            return HttpResponse(status.http, _text(f"{what}: {exc}\n"))
        code = {
            rls_pb2.RateLimitResponse.OK: 200,
            rls_pb2.RateLimitResponse.OVER_LIMIT: 429,
        }.get(response.overall_code, 500)
        # As the reference's protojson.Marshal: fields at their zero value are left out
        # (an over-limit status has no limitRemaining).
        body = json_format.MessageToJson(response, indent=None)
        return HttpResponse(code, body.encode(), "application/json")

    async def rlconfig(self, request: HttpRequest) -> HttpResponse:
        config = self.service.holder.config
        lines = []
        for _domain, rule in config.iter_limits() if config is not None else []:
            modes = (
                f"shadow_mode: {str(rule.shadow_mode).lower()}, "
                f"quota_mode: {str(rule.quota_mode).lower()}"
            )
            assert rule.limit is not None
            algorithm = algorithm_of(rule.limit.kind)
            limit = algorithm.reported(rule.limit)
            if limit is None:
                text = algorithm.text(algorithm.describe(rule.limit))
                lines.append(f"{rule.stats_key}: {text}, {modes}")
                continue
            unit = "UNKNOWN" if limit.unit is None else Unit(limit.unit).name
            line = (
                f"{rule.stats_key}: unit={unit} requests_per_unit={limit.requests_per_unit}, "
                f"shadow_mode: {str(rule.shadow_mode).lower()}, "
                f"quota_mode: {str(rule.quota_mode).lower()}"
            )
            if limit.unlimited:
                line += ", unlimited: true"
            lines.append(line)
        return HttpResponse(200, ("\n".join(lines) + "\n").encode() if lines else b"")

    async def explain(self, request: HttpRequest) -> HttpResponse:
        """/explain?domain=D&descriptor=k=v[,k=v...] (repeatable): why a request is limited,
        with the current counts, tokens or sliding estimates, counting nothing (JSON)."""
        params = parse_qs(request.query)
        domain = params.get("domain", [""])[0]
        try:
            requests = [parse_descriptor(text) for text in params.get("descriptor", [])]
            if not requests:
                raise RequestError("descriptor", "give one or more descriptor=k=v[,k=v...]")
            config = self.service.holder.config
            if config is None:
                raise RequestError("domain", "no rate limit configuration is loaded")
            now = self.service.clock.now()
            answer = explain(config, domain, requests, self.service.engine.options, now)
            await read_now(self.service.backend.store, answer, now)
        except FerrymanError as exc:
            body = json.dumps({"error": str(exc)}) + "\n"
            return HttpResponse(status_of(exc).http, body.encode(), "application/json")
        body = json.dumps(answer.as_dict(), indent=2) + "\n"
        return HttpResponse(200, body.encode(), "application/json")

    async def unconfigured(self, request: HttpRequest) -> HttpResponse:
        """/unconfigured[?top=N]: per domain with allow_unconfigured, the descriptors that
        reached no rule, most frequent first, with their counts and rates (JSON)."""
        try:
            top = int(parse_qs(request.query).get("top", ["0"])[0]) or None
        except ValueError:
            return HttpResponse(400, b"bad request: top must be a whole number\n")
        report = self.service.engine.unconfigured.report(self.service.clock.now(), top)
        return HttpResponse(200, (json.dumps(report, indent=2) + "\n").encode(), "application/json")

    async def stats_page(self, request: HttpRequest) -> HttpResponse:
        body = "".join(f"{name}: {value}\n" for name, value in self.service.stats)
        return HttpResponse(200, body.encode())

    async def capacity_page(self, request: HttpRequest) -> HttpResponse:
        status = self.service.capacity.status()
        if self.service.leased is not None:
            status["leased"] = self.service.leased.status()
        body = json.dumps(status, indent=2) + "\n"
        return HttpResponse(200, body.encode(), "application/json")

    async def rlqs_page(self, request: HttpRequest) -> HttpResponse:
        body = json.dumps(self.service.rlqs.status(), indent=2) + "\n"
        return HttpResponse(200, body.encode(), "application/json")

    async def rlqs_explain(self, request: HttpRequest) -> HttpResponse:
        """/rlqs/explain?domain=D&bucket=k=v[,k=v...]: the rule a quota bucket id reaches,
        what it is answered, and each Envoy's share of it now (JSON)."""
        params = parse_qs(request.query)
        try:
            bucket = dict(parse_descriptor(params.get("bucket", [""])[0]))
            config = self.service.holder.config
            if config is None:
                raise RequestError("domain", "no rate limit configuration is loaded")
            domain = params.get("domain", [""])[0]
            now = self.service.clock.now()
            answer = explain_bucket(config, self.service.engine.options, domain, bucket, now)
        except FerrymanError as exc:
            body = json.dumps({"error": str(exc)}) + "\n"
            return HttpResponse(status_of(exc).http, body.encode(), "application/json")
        answer["envoys"] = self.service.rlqs.envoys_of(domain, bucket)
        body = json.dumps(answer, indent=2) + "\n"
        return HttpResponse(200, body.encode(), "application/json")

    async def status_page(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(
            200, (json.dumps(self.status(), indent=2) + "\n").encode(), "application/json"
        )

    def status(self) -> dict[str, object]:
        """What /status reports: the state an operator asks about first."""
        holder = self.service.holder
        config = holder.config
        cache = self.service.engine.local_cache
        store = self.service.config_api.store
        return {
            "healthy": self.service.healthy(),
            "event_loop": self.service.event_loop,
            "asyncio_tasks": _tasks(),
            "heap": heap.describe(),
            "config": {
                "version": holder.version,
                # The config API's version (its history's number), not the count of loads.
                "store": None if store is None else store.kind,
                "store_version": None if store is None else store.current().version.number,
                "loaded_at": _iso(holder.loaded_at) if config is not None else None,
                "directory": str(self.service.settings.config_dir),
                "files": list(config.files) if config is not None else [],
                "domains": len(config.domains) if config is not None else 0,
                "limits": len(config.iter_limits()) if config is not None else 0,
                "last_error": holder.last_error,
                "last_error_at": _iso(holder.last_error_at) if holder.last_error else None,
                "switches": {} if config is None else switches(config),
            },
            "backend": {
                "name": self.service.backend.name,
                "healthy": self.service.backend.healthy(),
                "connections": [c.describe_state() for c in self.service.backend.connections()]
                if isinstance(self.service.backend, Watched)
                else [],
                "sync": [s.state() for s in self.service.backend.synced()]
                if isinstance(self.service.backend, Synced)
                else [],
            },
            "tls": None
            if self.service.tls is None
            else {
                "cert": str(self.service.tls.cert),
                "mutual": self.service.tls.mutual,
                "client_san": self.service.tls.client_san or None,
                "reloads": self.service.tls.reloads,
            },
            "memory": None
            if not isinstance(self.service.backend, MemoryBackend)
            else {
                "keys": self.service.backend.cap.held(),
                "max_keys": self.service.backend.cap.max_keys,
                "kinds": self.service.backend.cap.shares(),
                "evicted": self.service.backend.cap.evicted,
                "refused": self.service.backend.cap.refused,
            },
            "holds": self.service.holds.status(),
            "shaping": self.service.engine.waits.status(),
            "decision_log": None if (log := self.service.decision_log) is None else log.status(),
            "local_cache": None
            if cache is None
            else {"entries": len(cache), "bytes": cache.size_bytes, "max_bytes": cache.max_bytes},
            "stats": self.service.stats.status(),
        }

    async def prometheus(self, request: HttpRequest) -> HttpResponse:
        reader = self.service.telemetry.prometheus
        assert reader is not None
        mapping = self.service.mapping
        if mapping is None:
            # Collection reads every series; keep it off the event loop.
            body = await asyncio.to_thread(reader.render)
        else:
            # PROMETHEUS_MAPPER_YAML: the counters under the file's names, the rest as usual.
            body = await asyncio.to_thread(reader.render, STATS_COUNTER_FAMILIES)
            body = mapping.render(self.service.stats) + body
        return HttpResponse(200, body.encode(), PROMETHEUS_CONTENT_TYPE)


def switches(config: Config) -> dict[str, dict[str, bool]]:
    """The domains with a switch on (``allow_unconfigured``, ``ignore_limits``)."""
    return {
        name: {"allow_unconfigured": d.allow_unconfigured, "ignore_limits": d.ignore_limits}
        for name, d in sorted(config.domains.items())
        if d.allow_unconfigured or d.ignore_limits
    }


def domains_panel(
    config: Config | None, unconfigured: Unconfigured, now: float
) -> dict[str, object]:
    """The console's table of the domain switches: one row per domain with a switch on,
    then its five most frequent unconfigured descriptors."""
    rows: list[list[object]] = []
    for name, on in ({} if config is None else switches(config)).items():
        flags = ", ".join(k for k, v in on.items() if v)
        table = unconfigured.domains.get(name)
        rows.append([name, flags, "" if table is None else table.total, ""])
        for top in [] if table is None else table.top(now, 5):
            rows.append(["", "", top["count"], f"{top['descriptor']} ({top['rate']}/s)"])
    return {
        "columns": ["domain", "switches", "unconfigured hits", "top unconfigured descriptors"],
        "rows": rows,
        "note": "ignore_limits: every rule in shadow mode; allow_unconfigured: see /unconfigured",
    }


def _text(message: str) -> bytes:
    # A caller's text quoted back may hold lone surrogates (JSON's "\ud800"): escaped.
    return message.encode("utf-8", "backslashreplace")


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def _tasks() -> int | None:
    """The serving loop's tasks (None when asked from outside a running loop)."""
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:
        return None
