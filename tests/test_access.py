"""Who may do what: the access policy (access.yaml) decided by the caller's client
certificate, and the Envoy path's per-domain refusals, with real mTLS certificates."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import redis
import yaml
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.type.v3 import ratelimit_unit_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.access import DENIED, MAX_WATCHERS_PER_NAMESPACE
from ferryman.apis.config_api import FOLLOW_ERRORS
from ferryman.clock import ManualClock
from ferryman.server.app import make_backend
from ferryman.settings import Settings

from helpers.capacity import resources_yaml
from helpers.certs import Authority, Pem
from helpers.holds import JOBS_CONFIG, Holder
from helpers.redis_procs import RedisProcess
from helpers.server import (
    ConfigDir,
    Server,
    ServerFactory,
    descriptor,
    overall,
    quota_events_stub,
    quota_stub,
    rls_stub,
    wait_for,
)
from helpers.stores import on_stores

EDGE = "spiffe://mesh/ns/edge/sa/envoy"
NEIGHBOUR = "spiffe://mesh/ns/other/sa/app"

DOMAIN = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
"""
STRICT = """
domain: d
allow_overrides: false
allow_negative_hits: false
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
"""
POLICY = f"""
access:
  - identities: ["spiffe://mesh/ns/edge/*"]
    allow:
      rls: [d]
      negative_hits: [d]
      overrides: [d]
      lease: true
      lease_server: true
  - identities: ["{NEIGHBOUR}"]
    allow:
      rls: [d]
      lease: ["fair"]
"""
MINUTE = ratelimit_unit_pb2.MINUTE


@dataclass(frozen=True)
class Mesh:
    """A CA, the server's certificate and two callers: the edge proxy and a neighbour."""

    ca: Authority
    server: Pem
    edge: Pem
    neighbour: Pem


@pytest.fixture
def mesh(tmp_path: Path) -> Mesh:
    ca = Authority(tmp_path / "ca")
    return Mesh(
        ca,
        ca.server(),
        ca.issue("edge", uris=(EDGE,), client=True),
        ca.issue("neighbour", uris=(NEIGHBOUR,), dns=("app.other",), client=True),
    )


def mtls_server(make_server: ServerFactory, mesh: Mesh, **settings: object) -> Server:
    return make_server(
        grpc_server_use_tls=True,
        grpc_server_tls_cert=str(mesh.server.cert),
        grpc_server_tls_key=str(mesh.server.key),
        grpc_client_tls_cacert=str(mesh.ca.cert),
        **settings,
    )


@pytest.fixture
def channels(mesh: Mesh) -> Iterator[dict[tuple[int, str], grpc.Channel]]:
    opened: dict[tuple[int, str], grpc.Channel] = {}
    yield opened
    for channel in opened.values():
        channel.close()


def channel_of(
    opened: dict[tuple[int, str], grpc.Channel], mesh: Mesh, port: int, who: Pem
) -> grpc.Channel:
    key = (port, str(who.cert))
    if key not in opened:
        credentials = grpc.ssl_channel_credentials(
            mesh.ca.cert.read_bytes(), who.key.read_bytes(), who.cert.read_bytes()
        )
        opened[key] = grpc.secure_channel(f"127.0.0.1:{port}", credentials)
    return opened[key]


def ask(channel: grpc.Channel, *descriptors: object) -> rls_pb2.RateLimitResponse:
    request = rls_pb2.RateLimitRequest(domain="d", descriptors=descriptors)  # type: ignore[arg-type]
    response: rls_pb2.RateLimitResponse = rls_stub(channel).ShouldRateLimit(request, timeout=5)
    return response


def refusal(channel: grpc.Channel, *descriptors: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        ask(channel, *descriptors)
    return info.value


def used_up(channel: grpc.Channel) -> None:
    for _ in range(5):
        assert overall(ask(channel, descriptor([("k", "t")]))) == "OK"
    assert overall(ask(channel, descriptor([("k", "t")]))) == "OVER_LIMIT"


@on_stores("memory", "redis")
def test_negative_hits_are_refused_to_a_caller_the_policy_does_not_allow(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """A neighbour's negative hits on a tenant are PERMISSION_DENIED, counted by identity,
    and change nothing; the edge proxy's own negative hits are applied."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("access.yaml", POLICY)
    server = mtls_server(make_server, mesh)
    port = server.service.grpc_port
    edge = channel_of(channels, mesh, port, mesh.edge)
    neighbour = channel_of(channels, mesh, port, mesh.neighbour)
    used_up(edge)
    error = refusal(neighbour, descriptor([("k", "t")], hits=3, negative=True))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "negative_hits" in (error.details() or "")
    assert server.stat(f"{DENIED}.negative_hits") == 1
    assert server.stat(f"{DENIED}.by.{NEIGHBOUR}") == 1
    assert overall(ask(neighbour, descriptor([("k", "t")]))) == "OVER_LIMIT"
    ask(edge, descriptor([("k", "t")], hits=3, negative=True))
    assert overall(ask(edge, descriptor([("k", "t")]))) == "OK"


def test_a_limit_override_is_refused_to_a_caller_the_policy_does_not_allow(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """A neighbour that sends its own limit of a million a minute is PERMISSION_DENIED."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("access.yaml", POLICY)
    server = mtls_server(make_server, mesh)
    neighbour = channel_of(channels, mesh, server.service.grpc_port, mesh.neighbour)
    error = refusal(neighbour, descriptor([("k", "t")], limit=(1_000_000, MINUTE)))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "overrides" in (error.details() or "")


def test_a_domain_the_policy_does_not_name_is_refused(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """A caller whose certificate no grant names, and a domain no grant names, are refused;
    a policy written while serving is in force at the next call."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("e.yaml", DOMAIN.replace("domain: d", "domain: e"))
    server = mtls_server(make_server, mesh)
    neighbour = channel_of(channels, mesh, server.service.grpc_port, mesh.neighbour)
    request = rls_pb2.RateLimitRequest(domain="e", descriptors=[descriptor([("k", "t")])])
    rls_stub(neighbour).ShouldRateLimit(request, timeout=5)  # no policy: the port is trusted
    config_dir.write("access.yaml", POLICY)
    wait_for("the policy is reloaded", lambda: server.service.access.policy is not None)
    with pytest.raises(grpc.RpcError) as info:
        rls_stub(neighbour).ShouldRateLimit(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stranger = mesh.ca.issue("stranger", uris=("spiffe://elsewhere/x",), client=True)
    error = refusal(channel_of(channels, mesh, server.service.grpc_port, stranger))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


@on_stores("memory", "redis")
def test_a_domain_that_refuses_negative_hits_refuses_them_without_mtls(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """allow_negative_hits: false on the domain: negative hits are refused on a plaintext
    port, and the caller's over-limit counter does not go down."""
    config_dir.write("d.yaml", STRICT)
    server = make_server()
    for _ in range(5):
        assert overall(server.ask("d", [("k", "t")])) == "OK"
    with pytest.raises(grpc.RpcError) as info:
        server.ask("d", descriptor([("k", "t")], hits=3, negative=True))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert overall(server.ask("d", [("k", "t")])) == "OVER_LIMIT"


@on_stores("memory", "redis")
def test_a_domain_that_refuses_overrides_keeps_its_configured_limit(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """allow_overrides: false on the domain: a caller's limit of a million a minute is
    ignored, and the configured 5 a minute answers."""
    config_dir.write("d.yaml", STRICT)
    server = make_server()
    big = descriptor([("k", "t")], limit=(1_000_000, MINUTE))
    answers = [overall(server.ask("d", big)) for _ in range(6)]
    assert answers == ["OK"] * 5 + ["OVER_LIMIT"]
    assert server.stat("ferryman.access.overrides_ignored") == 6


def test_server_capacity_is_refused_to_an_identity_not_allowed_as_a_server(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """GetServerCapacity from an identity without lease_server, and GetCapacity on a
    resource it may not lease, are PERMISSION_DENIED."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("access.yaml", POLICY)
    server = mtls_server(make_server, mesh)
    channel = channel_of(channels, mesh, server.service.grpc_port, mesh.neighbour)
    stub = doorman_pb2_grpc.CapacityStub(channel)  # type: ignore[no-untyped-call]
    band = doorman_pb2.PriorityBandAggregate(priority=1, num_clients=10**9, wants=100)
    asked = doorman_pb2.GetServerCapacityRequest(
        server_id="s", resource=[doorman_pb2.ServerCapacityResourceRequest(
            resource_id="shared", wants=[band])]
    )  # fmt: skip
    with pytest.raises(grpc.RpcError) as info:
        stub.GetServerCapacity(asked, timeout=5)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    other = doorman_pb2.GetCapacityRequest(
        client_id="c",
        resource=[doorman_pb2.ResourceRequest(resource_id="private", priority=1, wants=1)],
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.GetCapacity(other, timeout=5)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_check_names_the_file_and_line_of_a_bad_policy(config_dir: ConfigDir) -> None:
    """``ferryman check`` reports an unknown permission with the file and its line."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write(
        "access.yaml", "access:\n  - identities: [a]\n    allow:\n      everything: true\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "ferryman", "check", str(config_dir.path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert "access.yaml:4" in run.stdout + run.stderr
    assert "everything" in run.stdout + run.stderr


def test_tls_without_a_policy_warns_at_start(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With TLS on and no access.yaml the start warns that every caller may do anything;
    with a policy it does not."""
    config_dir.write("d.yaml", DOMAIN)
    with caplog.at_level(logging.WARNING, logger="ferryman"):
        mtls_server(make_server, mesh)
    assert any("no access policy" in r.getMessage() for r in caplog.records)
    caplog.clear()
    config_dir.write("access.yaml", POLICY)
    with caplog.at_level(logging.WARNING, logger="ferryman"):
        mtls_server(make_server, mesh)
    assert not any("no access policy" in r.getMessage() for r in caplog.records)


class _On:
    """Stands in for a Server where a Holder only needs a channel: its own connection."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel


def holder_on(server: Server, channels: list[grpc.Channel]) -> Holder:
    """A Session on a connection of its own to ``server``."""
    channel = grpc.insecure_channel(
        f"127.0.0.1:{server.service.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )
    channels.append(channel)
    return Holder(cast(Server, _On(channel)))


@pytest.fixture
def plain_channels() -> Iterator[list[grpc.Channel]]:
    opened: list[grpc.Channel] = []
    yield opened
    for channel in opened:
        channel.close()


@on_stores("memory", "redis")
def test_a_session_id_sent_from_another_connection_is_refused(
    make_server: ServerFactory, config_dir: ConfigDir, plain_channels: list[grpc.Channel]
) -> None:
    """Another connection naming a session's id is PERMISSION_DENIED, without a policy:
    the session's copy stays held, and it cannot transfer it either."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    server = make_server()
    victim = holder_on(server, plain_channels)
    assert victim.reserve("acme", 1).granted == 1
    thief = holder_on(server, plain_channels)
    thief.session_id = victim.session_id
    for steal in (
        lambda: thief.release("acme", 1, ["vip", "everyone"]),
        lambda: thief.transfer("acme", 1, ["vip", "everyone"], 30),
    ):
        with pytest.raises(grpc.RpcError) as info:
            steal()
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert server.service.holds.copies_held == 1
    assert server.stat("ratelimit.service.holds.foreign_session") == 2
    victim.release("acme", 1, ["vip", "everyone"])
    victim.close()


@on_stores("memory", "redis")
def test_a_changed_transfer_id_is_refused_and_strands_nothing(
    make_server: ServerFactory, config_dir: ConfigDir, plain_channels: list[grpc.Channel]
) -> None:
    """A transfer id decoded and changed to another tenant is refused (NOT_FOUND); the
    real one still seizes, and once both sessions end no copy is held."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    server = make_server()
    giver, taker = holder_on(server, plain_channels), holder_on(server, plain_channels)
    assert giver.reserve("acme", 2).granted == 2
    transfer_id = giver.transfer("acme", 2, ["vip", "everyone"], 30)
    body, _, tag = transfer_id.partition(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload[1] = [["tenant", "new-co"]]
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    for changed in (f"{forged}.{tag}", forged):
        with pytest.raises(grpc.RpcError) as info:
            taker.seize(changed)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert taker.seize(transfer_id).copies == 2
    giver.close()
    taker.close()
    wait_for("every copy is free", lambda: server.service.holds.copies_held == 0)
    fresh = holder_on(server, plain_channels)
    assert fresh.reserve("acme", 10, min_copies=1).granted == 9  # nothing stranded
    fresh.close()


def capacity_stub(channel: grpc.Channel) -> doorman_pb2_grpc.CapacityStub:
    return doorman_pb2_grpc.CapacityStub(channel)  # type: ignore[no-untyped-call]


def get_capacity(
    stub: doorman_pb2_grpc.CapacityStub, client: str, resource: str, wants: float
) -> doorman_pb2.GetCapacityResponse:
    request = doorman_pb2.GetCapacityRequest(
        client_id=client,
        resource=[doorman_pb2.ResourceRequest(resource_id=resource, priority=1, wants=wants)],
    )
    response: doorman_pb2.GetCapacityResponse = stub.GetCapacity(request, timeout=5)
    return response


def test_a_client_id_belongs_to_the_identity_that_first_used_it(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """A neighbour's ReleaseCapacity, or GetCapacity for nothing, under the edge's client id
    is PERMISSION_DENIED, and the edge's lease stands."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("access.yaml", POLICY)
    config_dir.write("resources.yaml", resources_yaml(capacity=100))
    server = mtls_server(make_server, mesh, doorman_minimum_refresh_interval=0)
    port = server.service.grpc_port
    edge = capacity_stub(channel_of(channels, mesh, port, mesh.edge))
    neighbour = capacity_stub(channel_of(channels, mesh, port, mesh.neighbour))
    assert get_capacity(edge, "victim", "fair", 40).response[0].gets.capacity == 40
    release = doorman_pb2.ReleaseCapacityRequest(client_id="victim", resource_id=["fair"])
    for steal in (
        lambda: neighbour.ReleaseCapacity(release, timeout=5),
        lambda: get_capacity(neighbour, "victim", "fair", 0),
    ):
        with pytest.raises(grpc.RpcError) as info:
            steal()
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert server.stat(f"{DENIED}.by.{NEIGHBOUR}") == 2
    assert get_capacity(neighbour, "mine", "fair", 100).response[0].gets.capacity == 60


def test_one_server_counts_at_most_ten_clients_per_band(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """GetServerCapacity claiming a billion clients under FAIR_SHARE counts as ten: real
    clients still get their share of 100."""
    config_dir.write("resources.yaml", resources_yaml(capacity=100))
    server = make_server(doorman_minimum_refresh_interval=0)
    stub = capacity_stub(server.channel)
    band = doorman_pb2.PriorityBandAggregate(priority=1, num_clients=10**9, wants=100)
    greedy = doorman_pb2.GetServerCapacityRequest(
        server_id="greedy", resource=[doorman_pb2.ServerCapacityResourceRequest(
            resource_id="fair", wants=[band])]
    )  # fmt: skip
    for _ in range(2):
        taken = stub.GetServerCapacity(greedy, timeout=5).response[0].gets.capacity
        real = [get_capacity(stub, f"c{i}", "fair", 100).response[0].gets.capacity for i in (1, 2)]
    assert taken < 100
    assert all(got > 0 for got in real), (taken, real)


def test_overlong_ids_too_many_resources_and_huge_wants_are_bounded(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """A 1 MiB client_id and 2,000 resources in one call are INVALID_ARGUMENT naming the
    field; wants of 1e300 on an unconfigured resource is granted at most the ceiling."""
    config_dir.write("d.yaml", DOMAIN)
    server = make_server(doorman_minimum_refresh_interval=0)
    stub = capacity_stub(server.channel)
    with pytest.raises(grpc.RpcError) as info:
        get_capacity(stub, "x" * (1 << 20), "r", 1)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("client_id")
    many = doorman_pb2.GetCapacityRequest(
        client_id="c",
        resource=[
            doorman_pb2.ResourceRequest(resource_id=f"r{i}", priority=1, wants=1)
            for i in range(2000)
        ],
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.GetCapacity(many, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("resource")
    granted = get_capacity(stub, "c", "unconfigured", 1e300).response[0].gets.capacity
    assert 0 < granted <= 1_000_000


QUOTA = """
namespaces:
  users:
    dynamic_bucket_template: {size: 10, fill_rate: 1}
    max_dynamic_buckets: 5
"""


def allow(channel: grpc.Channel, bucket: str) -> str:
    stub = quota_stub(channel)
    request = quota_service_pb2.AllowRequest(namespace="users", bucket_name=bucket)
    status: int = stub.Allow(request, timeout=10).status
    return quota_service_pb2.AllowResponse.Status.Name(status)


@on_stores("memory", "redis")
def test_one_caller_cannot_take_every_dynamic_bucket(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """With MAX_DYNAMIC_BUCKETS_PER_CALLER a neighbour's junk names make that many buckets,
    the rest are REJECTED_TOO_MANY_BUCKETS and counted; a real new user still gets one; a
    1 MiB name is REJECTED_INVALID_REQUEST."""
    config_dir.write("quota.yaml", QUOTA)
    server = mtls_server(make_server, mesh, max_dynamic_buckets_per_caller=2)
    port = server.service.grpc_port
    neighbour = channel_of(channels, mesh, port, mesh.neighbour)
    answers = [allow(neighbour, f"junk{i}") for i in range(5)]
    assert answers == ["OK"] * 2 + ["REJECTED_TOO_MANY_BUCKETS"] * 3
    assert allow(neighbour, "junk0") == "OK"  # its own buckets stay usable
    assert server.stat("ferryman.access.capped.dynamic_buckets") == 3
    assert allow(channel_of(channels, mesh, port, mesh.edge), "real_user") == "OK"
    assert allow(neighbour, "x" * (1 << 20)) == "REJECTED_INVALID_REQUEST"


def test_one_caller_cannot_hold_every_stream(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """Past MAX_STREAMS_PER_CALLER idle watch streams (QuotaEvents and Health together) a
    caller's next one is RESOURCE_EXHAUSTED and counted; another caller still watches."""
    config_dir.write("quota.yaml", QUOTA)
    server = mtls_server(make_server, mesh, max_streams_per_caller=2)
    port = server.service.grpc_port
    neighbour = channel_of(channels, mesh, port, mesh.neighbour)
    streams = server.service.access.streams
    held = [quota_events_stub(neighbour).Watch(limiter_pb2.WatchQuotaEventsRequest())]
    health = health_pb2_grpc.HealthStub(neighbour)
    held.append(health.Watch(health_pb2.HealthCheckRequest()))
    assert next(held[1]).status == health_pb2.HealthCheckResponse.SERVING
    wait_for("two streams open", lambda: streams.count(NEIGHBOUR) == 2)
    for more in (
        quota_events_stub(neighbour).Watch(limiter_pb2.WatchQuotaEventsRequest()),
        health.Watch(health_pb2.HealthCheckRequest()),
    ):
        with pytest.raises(grpc.RpcError) as info:
            next(more)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.stat("ferryman.access.capped.streams") == 2
    edge = channel_of(channels, mesh, port, mesh.edge)
    other = quota_events_stub(edge).Watch(limiter_pb2.WatchQuotaEventsRequest())
    wait_for("the edge's stream is open", lambda: streams.count(EDGE) == 1)
    for call in (*held, other):
        call.cancel()
    wait_for("every stream ended", lambda: streams.count(NEIGHBOUR) == streams.count(EDGE) == 0)


def test_one_caller_cannot_open_sessions_without_end(
    make_server: ServerFactory, config_dir: ConfigDir, plain_channels: list[grpc.Channel]
) -> None:
    """Past MAX_SESSIONS_PER_CALLER open sessions, a caller's next Session is
    RESOURCE_EXHAUSTED; once one ends, it may open another."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    server = make_server(max_sessions_per_caller=2)
    first, _second = holder_on(server, plain_channels), holder_on(server, plain_channels)
    with pytest.raises(grpc.RpcError) as info:
        holder_on(server, plain_channels)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    first.close()
    wait_for(
        "the session ended",
        lambda: server.service.access.sessions.count("anonymous@127.0.0.1") == 1,
    )
    holder_on(server, plain_channels).close()


WEB = DOMAIN.replace("domain: d", "domain: web")
PAYMENTS = DOMAIN.replace("domain: d", "domain: payments")


def config_call(
    server: Server, method: str, path: str, token: str, body: str = "", **headers: str
) -> tuple[int, Any]:
    """One config API call on the debug port: the status and the JSON answer (or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.service.debug_port, timeout=10)
    sent = {"Authorization": f"Bearer {token}", **headers}
    if body:
        sent.setdefault("Content-Type", "application/json" if method == "POST" else "text/yaml")
    try:
        conn.request(method, "/api/v1" + path, body=body or None, headers=sent)
        response = conn.getresponse()
        raw = response.read()
        kind = response.getheader("Content-Type", "")
        return response.status, json.loads(raw) if kind.startswith("application/json") else raw
    finally:
        conn.close()


def test_a_scoped_write_token_reaches_only_its_domains(
    make_server: ServerFactory, config_dir: ConfigDir, tmp_path: Path
) -> None:
    """A write token scoped to web edits web and resets its counters; editing payments,
    the access policy, resetting payments' counters, rolling back or reading the history
    are PERMISSION_DENIED. History entries carry the identity and address of the writer."""
    config_dir.write("web.yaml", WEB)
    config_dir.write("payments.yaml", PAYMENTS)
    tokens = tmp_path / "tokens"
    tokens.write_text("web-token carol write web\nroot-token root write\n")
    server = make_server(admin_tokens_file=str(tokens))
    version = config_call(server, "GET", "/config", "root-token")[1]["version"]
    match = {"If-Match": f'"{version}"'}
    status, body = config_call(
        server, "PUT", "/config/web.yaml", "web-token", WEB.replace("5}", "7}"), **match
    )
    assert status == 200, body
    match = {"If-Match": f'"{body["version"]}"'}
    refused = [
        ("PUT", "/config/payments.yaml", PAYMENTS.replace("5}", "9}")),
        ("PUT", "/config/web.yaml", PAYMENTS),  # moving web's file to another domain
        ("PUT", "/config/access.yaml", "access: []\n"),
        (
            "POST",
            "/counters/reset",
            '{"domain": "payments", "descriptor": [{"key": "k", "value": "v"}]}',
        ),
        ("POST", "/rollback", '{"version": 1}'),
        ("GET", "/history", ""),
    ]
    for method, path, text in refused:
        status, body = config_call(server, method, path, "web-token", text, **match)
        assert status == 403, (path, status, body)
    reset = '{"domain": "web", "descriptor": [{"key": "k", "value": "v"}]}'
    assert config_call(server, "POST", "/counters/reset", "web-token", reset)[0] == 200
    history = config_call(server, "GET", "/history", "root-token")[1]["history"]
    latest_write = next(e for e in history if e["kind"] == "api")
    assert latest_write["author"] == "carol" and latest_write["identity"] == "anonymous"
    assert latest_write["peer"].startswith("127.0.0.1:")


@on_stores("redis")
def test_a_version_written_to_redis_directly_is_not_put_in_force(
    make_server: ServerFactory, config_dir: ConfigDir, tmp_path: Path, redis_url: str
) -> None:
    """With SIGNING_KEY, a config version forged in Redis (a forged author, a raised limit)
    is refused by the replica and counted; versions written through the API go in force."""
    config_dir.write("web.yaml", WEB)
    tokens = tmp_path / "tokens"
    tokens.write_text("root-token root write\n")
    server = make_server(admin_tokens_file=str(tokens), config_store="redis", signing_key="s3cret")
    version = config_call(server, "GET", "/config", "root-token")[1]["version"]
    status, body = config_call(
        server, "PUT", "/config/web.yaml", "root-token", WEB.replace("5}", "6}"),
        **{"If-Match": f'"{version}"'},
    )  # fmt: skip
    assert status == 200, body

    def limit() -> int:
        return int(server.ask("web", [("k", "v")]).statuses[0].current_limit.requests_per_unit)

    assert limit() == 6
    client = redis.Redis.from_url(redis_url)
    tag = "{" + server.settings.cache_key_prefix + "ferryman_config}"
    forged = body["version"] + 1
    meta = {"version": forged, "author": "alice", "time": 0.0, "summary": "raise", "changed": []}
    client.hset(f"{tag}:v:{forged}", mapping={
        "meta": json.dumps(meta), "d:web.yaml": WEB.replace("5}", "1000000}")})  # fmt: skip
    client.set(f"{tag}:current", forged)
    client.publish(f"{tag}:changes", forged)
    wait_for("the forged version refused", lambda: server.stat(FOLLOW_ERRORS) > 0)
    assert limit() == 6
    client.close()


#: The ACL docs/operators/security.md gives ferryman's Redis user.
ACL_RULES = (
    "on", ">pw", "~*", "&*", "-@all", "+@read", "+@write", "+@scripting", "+@connection",
    "+@pubsub", "+time", "-@dangerous", "+info", "+cluster|slots", "+cluster|shards",
)  # fmt: skip


def test_the_documented_redis_acl_user_serves_every_kind(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    own_redis: RedisProcess,
    clock: ManualClock,
) -> None:
    """With REDIS_USERNAME and the documented ACL, counters, held copies and the Redis
    config store work, and the user may not run what ferryman never needs (FLUSHALL)."""
    client = own_redis.client()
    client.execute_command("ACL", "SETUSER", "ferryman", *ACL_RULES)  # type: ignore[no-untyped-call]
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    settings = Settings(
        backend="redis",
        redis_url=f"127.0.0.1:{own_redis.port}",
        redis_socket_type="tcp",
        redis_username="ferryman",
        redis_auth="pw",
    )
    server = make_server(
        backend=make_backend(settings, clock), config_store="redis", signing_key="k"
    )
    assert overall(server.ask("d", [("k", "v")])) == "OK"
    holder = Holder(server)
    assert holder.reserve("acme", 1).granted == 1
    holder.close()
    wait_for("version 1 in Redis", lambda: client.keys("*ferryman_config*:current"))
    user = redis.Redis(port=own_redis.port, username="ferryman", password="pw")
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.flushall()
    user.close()
    client.close()


def debug_get(
    server: Server,
    path: str,
    host: str | None = None,
    mesh: Mesh | None = None,
    who: Pem | None = None,
) -> int:
    """GET on the debug port (HTTPS with ``mesh``, as ``who``); the status."""
    port = server.service.debug_port
    if mesh is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        context = ssl.create_default_context(cafile=str(mesh.ca.cert))
        if who is not None:
            context.load_cert_chain(who.cert, who.key)
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        conn.request("GET", path, headers={"Host": host} if host else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_the_debug_port_answers_only_to_its_own_names(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """A request whose Host is another site's name (DNS rebinding) is refused and counted;
    IP addresses, localhost and DEBUG_ALLOWED_HOSTS are served."""
    config_dir.write("d.yaml", DOMAIN)
    server = make_server(debug_allowed_hosts=("ferryman.*.svc",))
    assert debug_get(server, "/stats", "attacker.example:6070") == 403
    assert server.stat("ferryman.access.debug_host_refused") == 1
    for host in (None, "localhost:6070", "[::1]:6070", "10.1.2.3", "ferryman.ops.svc:6070"):
        assert debug_get(server, "/stats", host) == 200, host


def test_with_a_policy_the_debug_pages_need_an_allowed_identity(
    make_server: ServerFactory, config_dir: ConfigDir, mesh: Mesh
) -> None:
    """Under a policy the debug pages answer the identity granted debug, and refuse a
    neighbour and a caller without a certificate."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("access.yaml", POLICY.replace("      lease: true\n", "      debug: true\n"))
    server = mtls_server(make_server, mesh)
    assert debug_get(server, "/capacity", mesh=mesh, who=mesh.edge) == 200
    assert debug_get(server, "/capacity", mesh=mesh, who=mesh.neighbour) == 403
    assert debug_get(server, "/stats", mesh=mesh) == 403
    assert server.stat(f"{DENIED}.debug") == 2


def test_the_istio_reference_does_not_expose_the_debug_port() -> None:
    """k8s/istio-reference keeps the debug port on loopback and out of its Service."""
    path = (
        Path(__file__).resolve().parents[1] / "k8s" / "istio-reference" / "rate-limit-service.yaml"
    )
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    ports = named["Service", "ratelimit"]["spec"]["ports"]
    assert all(p["port"] != 6070 for p in ports)
    container = named["Deployment", "ratelimit"]["spec"]["template"]["spec"]["containers"][0]
    assert "DEBUG_HOST" not in {e["name"] for e in container["env"]}
    assert all(p["containerPort"] != 6070 for p in container["ports"])


def test_the_http_port_asks_the_policy_as_a_caller_without_a_certificate(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """On a plaintext HTTP port POST /json is asked as ``anonymous``: refused (403) when the
    policy grants it nothing, answered when it grants rls on the domain."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("access.yaml", POLICY)
    server = make_server()
    body = b'{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}'
    status, text = server.http("POST", "/json", body)
    assert status == 403 and b"rls" in text
    config_dir.write("access.yaml", POLICY + "  - identities: [anonymous]\n    allow: {rls: [d]}\n")
    wait_for("the grant in force", lambda: server.http("POST", "/json", body)[0] == 200)


@on_stores("memory", "redis")
def test_a_reset_frees_copies_whose_sessions_are_gone(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    tmp_path: Path,
    plain_channels: list[grpc.Channel],
) -> None:
    """Copies a session held but could not release when it ended stay held; a counter reset
    of their tenant frees them, and leaves alone what live sessions hold."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    tokens = tmp_path / "tokens"
    tokens.write_text("root-token root write\n")
    server = make_server(admin_tokens_file=str(tokens))
    holds = server.service.holds
    lost, live = holder_on(server, plain_channels), holder_on(server, plain_channels)
    assert lost.reserve("acme", 2).granted == 2
    assert live.reserve("acme", 1).granted == 1

    async def forget_the_tenant() -> None:
        # What a failed release leaves: the session's record no longer names the copies.
        session = holds.sessions[lost.session_id]
        (node, _tenant, groups), copies = session.holds.popitem()
        session.holds[node, "ghost", groups] = copies

    server.run(forget_the_tenant())
    lost.close()
    wait_for("the session ended", lambda: lost.session_id not in holds.sessions)
    probe = holder_on(server, plain_channels)
    assert probe.reserve("acme", 10, min_copies=1).granted == 6  # 9 - 2 stranded - 1 live
    probe.release("acme", 6, ["vip", "everyone"])
    reset = '{"domain": "jobs", "descriptor": [{"key": "tenant", "value": "acme"}]}'
    status, body = config_call(server, "POST", "/counters/reset", "root-token", reset)
    assert status == 200, body
    assert body["history"]["event"]["freed"] == 2
    assert probe.reserve("acme", 10, min_copies=1).granted == 8  # the live copy stays
    for holder in (probe, live):
        holder.close()


@on_stores("memory", "redis")
def test_a_neighbour_cannot_free_the_envoy_holds_of_another_proxy(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    mesh: Mesh,
    channels: dict[tuple[int, str], grpc.Channel],
) -> None:
    """Negative hits on a tenant's held copies from a neighbour the policy does not allow
    them are PERMISSION_DENIED: the edge proxy's holds stay until it reports its streams."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    config_dir.write("access.yaml", POLICY.replace("[d]", "[d, jobs]"))
    server = mtls_server(make_server, mesh)
    port = server.service.grpc_port
    edge = rls_stub(channel_of(channels, mesh, port, mesh.edge))
    neighbour = rls_stub(channel_of(channels, mesh, port, mesh.neighbour))

    def hold(stub: Any, d: Any) -> str:
        request = rls_pb2.RateLimitRequest(domain="jobs", descriptors=[d])
        return overall(stub.ShouldRateLimit(request, timeout=5))

    held = [("upstream", "tenant-1")]
    assert [hold(edge, descriptor(held)) for _ in range(3)] == ["OK", "OK", "OVER_LIMIT"]
    with pytest.raises(grpc.RpcError) as info:
        hold(neighbour, descriptor(held, hits=3, negative=True))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert hold(edge, descriptor(held)) == "OVER_LIMIT"
    hold(edge, descriptor(held, hits=1, negative=True))  # the proxy's own stream ended
    assert hold(edge, descriptor(held)) == "OK"


def test_one_namespace_cannot_take_every_watch_stream(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """Past MAX_WATCHERS_PER_NAMESPACE streams on one namespace the next is
    RESOURCE_EXHAUSTED and counted; another namespace is still watched."""
    config_dir.write("quota.yaml", QUOTA)
    server = make_server(max_streams_per_caller=0)
    stub = quota_events_stub(server.channel)
    watchers = server.service.access.watchers

    def watch(namespace: str) -> Any:
        return stub.Watch(limiter_pb2.WatchQuotaEventsRequest(namespace=namespace))

    held = [watch("users") for _ in range(MAX_WATCHERS_PER_NAMESPACE)]
    wait_for("every stream open", lambda: watchers.count("users") == MAX_WATCHERS_PER_NAMESPACE)
    with pytest.raises(grpc.RpcError) as info:
        next(watch("users"))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.stat("ferryman.access.capped.watchers") == 1
    held.append(watch("other"))
    wait_for("the other namespace watched", lambda: watchers.count("other") == 1)
    for call in held:
        call.cancel()
    wait_for("every stream ended", lambda: watchers.count("users") == 0)
