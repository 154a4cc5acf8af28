"""The registry of APIs: every gRPC service is one API object, served through the edge."""

from __future__ import annotations

import ast
from pathlib import Path

import grpc
import pytest

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.apis import APIS, quota_events
from ferryman.apis.api import health_names, unary_methods
from ferryman.stats import total_requests

from helpers.server import ConfigDir, ServerFactory, limiter_stub, quota_events_stub, wait_for

APP = Path(__file__).resolve().parents[1] / "service" / "ferryman" / "server" / "app.py"


def test_every_method_of_every_api_goes_through_the_edge() -> None:
    """Each API behind the edge says how each of its methods is recorded, streams included."""
    for api in APIS:
        names = {m.name for m in api.service.methods}
        if api.edge:
            assert set(api.methods) == names, api.name
        else:
            assert not api.methods, api.name
    assert len({api.name for api in APIS}) == len(APIS)


def test_health_names_and_call_metrics_follow_the_registry() -> None:
    """The health service reports the whole server and each API under its names; the call
    metrics have one series per unary method, streams aside."""
    assert health_names(APIS) == (
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ferryman.v1.Limiter",
        "quotaservice.QuotaService",
        "doorman.Capacity",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    )
    methods = unary_methods(APIS)
    assert methods[0] == "ShouldRateLimit" and "Allow" in methods
    assert "Session" not in methods and "Watch" not in methods
    assert "StreamRateLimitQuotas" not in methods


def test_the_app_names_no_protocol() -> None:
    """The wiring loops over the registry: it imports no generated service and no servicer."""
    imported = [
        node.module
        for node in ast.walk(ast.parse(APP.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module
    ]
    assert not [m for m in imported if m.startswith("ferryman._proto") or "grpc_health" in m]
    for protocol in ("rls", "limiter", "quota", "health"):
        assert f"ferryman.apis.{protocol}" not in imported


def test_a_session_that_does_not_open_is_refused_at_the_edge(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A Session stream whose first message is not open gets INVALID_ARGUMENT from the one
    table, counted under the stream's own counters."""
    server = make_server()
    first = limiter_pb2.SessionRequest(ping=limiter_pb2.SessionRequest.Ping())
    replies = limiter_stub(server.channel).Session(iter([first]), timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        list(replies)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "open" in (info.value.details() or "")
    assert server.stat(total_requests("Session")) == 1
    assert server.stat("ratelimit.service.call.session.service_error") == 1


def test_one_watch_too_many_is_refused_at_the_edge(
    config_dir: ConfigDir, make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Watch stream past the limit gets RESOURCE_EXHAUSTED; the open one keeps streaming."""
    monkeypatch.setattr(quota_events, "MAX_SUBSCRIBERS", 1)
    server = make_server()
    stub = quota_events_stub(server.channel)
    first = stub.Watch(limiter_pb2.WatchQuotaEventsRequest())
    hub = server.service.quota_events
    wait_for("the first subscription", lambda: hub.subscribers == 1)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Watch(limiter_pb2.WatchQuotaEventsRequest(), timeout=10))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.stat("ratelimit.service.call.watch.service_error") == 1
    assert hub.subscribers == 1
    first.cancel()
