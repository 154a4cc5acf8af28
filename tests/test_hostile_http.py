"""A hostile caller on the HTTP ports: every route that reaches an API asks the access
policy as its gRPC method does (one test per route, generated from the routing table), the
same per-caller caps hold on both doors, bodies are bounded in depth, and open connections,
buffered bodies and slow clients are bounded too."""

from __future__ import annotations

import http.client
import json
import logging
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.edge.http import BAD_INPUT

from helpers.fuzz import http_case, http_failed, http_routes, http_send
from helpers.holds import JOBS_CONFIG
from helpers.server import (
    MIXED,
    ConfigDir,
    Server,
    ServerFactory,
    descriptor,
    quota_stub,
    rls_stub,
    wait_for,
)

DOMAIN = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


def _domains(config_dir: ConfigDir) -> None:
    """The domain "d", and "open" (the one a neighbour is granted) alike."""
    config_dir.write("d.yaml", DOMAIN)
    config_dir.write("open.yaml", DOMAIN.replace("domain: d", "domain: open"))


QUOTA = """
namespaces:
  api:
    buckets:
      one: {size: 5, fill_rate: 1}
  free:
    buckets:
      one: {size: 5, fill_rate: 1}
  users:
    dynamic_bucket_template: {size: 10, fill_rate: 1, max_idle_millis: 600000}
    max_dynamic_buckets: 100
"""
# A neighbour without a certificate may ask the domain "open" and the namespaces "free"
# and "users" only; it is granted no debug page.
POLICY = """
access:
  - identities: [anonymous]
    allow:
      rls: [open]
      quota: [free, users]
"""


def _json_body(domain: str) -> bytes:
    request = {"domain": domain, "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}
    return json.dumps(request).encode()


def _quota_body(namespace: str, bucket: str = "one") -> bytes:
    return json.dumps({"namespace": namespace, "bucket_name": bucket}).encode()


def _rls_twin(server: Server) -> None:
    server.ask("d", [("k", "v")])


def _quota_twin(server: Server) -> None:
    request = quota_service_pb2.AllowRequest(namespace="api", bucket_name="one")
    quota_stub(server.channel).Allow(request, timeout=5)


@dataclass(frozen=True)
class Door:
    """How one route is asked for a scope the policy denies and for one it grants, and the
    call of its gRPC twin on the denied scope (None: the route has no gRPC method)."""

    denied: bytes
    allowed: bytes
    twin: Callable[[Server], None] | None


#: A route of the HTTP port that reaches an API: its door case. A new route needs one here.
DOORS = {
    ("POST", "/json"): Door(_json_body("d"), _json_body("open"), _rls_twin),
    ("POST", "/quota/allow"): Door(_quota_body("api"), _quota_body("free"), _quota_twin),
}
#: Routes that reach no API and answer anyone: the liveness probe.
OPEN = {("GET", "/healthcheck"), ("HEAD", "/healthcheck")}


ROUTES = [(r.port, r.method, r.path) for r in http_routes()]


@pytest.fixture
def guarded(config_dir: ConfigDir, make_server: ServerFactory) -> Server:
    _domains(config_dir)
    config_dir.write("quota.yaml", QUOTA)
    config_dir.write("access.yaml", POLICY)
    return make_server(max_dynamic_buckets_per_caller=3)


def _call(
    server: Server,
    method: str,
    path: str,
    body: bytes | None = None,
    debug: bool = False,
    source: str = "127.0.0.1",
) -> tuple[int, bytes]:
    port = server.service.debug_port if debug else server.service.http_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request(method, path.replace("*", "x"), body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(("port", "method", "path"), ROUTES, ids=[" ".join(r) for r in ROUTES])
def test_every_route_refuses_a_caller_the_policy_denies_as_its_grpc_twin(
    guarded: Server, port: str, method: str, path: str
) -> None:
    """Each routed path of the HTTP and debug ports refuses (403) a caller the access
    policy does not grant, and the same caller is PERMISSION_DENIED on its gRPC method."""
    if port == "debug":
        status, text = _call(guarded, method, path, debug=True)
        assert status == 403 and b"debug" in text, (status, text[:200])
        return
    if (method, path) in OPEN:
        assert _call(guarded, method, path)[0] == 200
        return
    door = DOORS.get((method, path))
    assert door is not None, f"{method} {path} has no door case: add one to DOORS"
    status, text = _call(guarded, method, path, door.denied)
    assert status == 403, (status, text)
    assert _call(guarded, method, path, door.allowed)[0] != 403
    if door.twin is not None:
        with pytest.raises(grpc.RpcError) as info:
            door.twin(guarded)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_quota_allow_is_refused_on_a_namespace_the_policy_denies(guarded: Server) -> None:
    """POST /quota/allow on a namespace without the ``quota`` grant is 403 every time,
    naming the permission, and takes no token."""
    answers = [_call(guarded, "POST", "/quota/allow", _quota_body("api")) for _ in range(12)]
    assert {status for status, _ in answers} == {403}
    assert "quota" in json.loads(answers[0][1])["error"]
    assert guarded.stat("ferryman.access.denied.quota") == 12


def _make(server: Server, name: str, source: str = "127.0.0.1") -> str:
    status, text = _call(server, "POST", "/quota/allow", _quota_body("users", name), source=source)
    answer: str = json.loads(text)["status"]
    assert (status == 200) == (answer == "OK"), (status, answer)
    return answer


def test_dynamic_buckets_made_over_http_count_against_the_callers_cap(guarded: Server) -> None:
    """With MAX_DYNAMIC_BUCKETS_PER_CALLER=3 one address makes three buckets, over HTTP and
    gRPC together, and is refused a fourth on either door; another address makes its own."""
    assert [_make(guarded, f"b{n}") for n in range(2)] == ["OK", "OK"]
    request = quota_service_pb2.AllowRequest(namespace="users", bucket_name="g1")
    assert quota_stub(guarded.channel).Allow(request, timeout=5).status == 0  # OK
    assert [_make(guarded, f"junk{n}") for n in range(20)] == ["REJECTED_TOO_MANY_BUCKETS"] * 20
    request = quota_service_pb2.AllowRequest(namespace="users", bucket_name="g2")
    refused = quota_stub(guarded.channel).Allow(request, timeout=5).status
    assert quota_service_pb2.AllowResponse.Status.Name(refused) == "REJECTED_TOO_MANY_BUCKETS"
    assert _make(guarded, "b0") == "OK"  # its own buckets stay usable
    assert _make(guarded, "other", source="127.0.0.2") == "OK"


DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("path", ["/quota/allow", "/json"])
def test_a_deeply_nested_body_is_400_logged_once_without_a_traceback(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    """200,000 nested arrays, or 40 (past HTTP_MAX_JSON_DEPTH=32), are answered 400 naming
    the depth, never 500; twenty of them are counted and logged as one line at most, and
    nothing is logged at ERROR or with a traceback."""
    _domains(config_dir)
    config_dir.write("quota.yaml", QUOTA)
    server = make_server()
    caplog.set_level(logging.INFO)
    before = BAD_INPUT.total
    for n in range(20):
        body = DEEP if n % 2 else b'{"domain": ' + b"[" * 40 + b"]" * 40 + b"}"
        status, text = _call(server, "POST", path, body)
        assert status == 400 and b"nested deeper than 32" in text, (status, text[:200])
    assert BAD_INPUT.total - before == 20
    logged = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(logged) <= 1
    assert all(r.levelno < logging.ERROR and r.exc_info is None for r in logged), logged
    assert _call(server, "POST", "/json", _json_body("open"))[0] == 200  # it serves on


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


STALLED = b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"


def test_connections_past_the_cap_are_answered_503_and_closed(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With HTTP_MAX_CONNECTIONS=4, four stalled connections are held and a fifth is
    answered 503 and closed; once one closes, a new connection is served."""
    _domains(config_dir)
    server = make_server(http_max_connections=4, http_read_timeout=60.0)
    port, http_server = server.service.http_port, server.service.http_servers["http"]
    held = [_connect(port) for _ in range(4)]
    for sock in held:
        sock.sendall(STALLED[:-2])
    wait_for("four connections open", lambda: http_server.connections == 4)
    with _connect(port) as fifth:
        answer = _read_all(fifth)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"more than 4 open connections" in answer
    held.pop().close()
    wait_for("three connections open", lambda: http_server.connections == 3)
    assert server.http("GET", "/healthcheck") == (200, b"OK")
    for sock in held:
        sock.close()


def test_a_stalled_body_is_cut_by_the_read_timeout(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A request that declares a 1 MiB body and sends part of it is answered 408 and its
    connection closed once HTTP_READ_TIMEOUT passes, freeing the bytes it reserved; a
    connection that sends nothing at all is closed."""
    _domains(config_dir)
    server = make_server(http_read_timeout=0.3)
    port, http_server = server.service.http_port, server.service.http_servers["http"]
    with _connect(port) as sock:
        sock.sendall(STALLED + b"[" * 1000)
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"not sent within 0.3s" in answer
    assert http_server.buffered == 0
    with _connect(port) as idle:
        assert _read_all(idle) == b""


def test_bodies_past_the_buffered_bytes_cap_are_answered_503(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With HTTP_MAX_BUFFERED_BYTES at 1 MiB, a stalled 1 MiB body holds it all: a second
    body is answered 503 and closed, and is read again once the first is cut."""
    _domains(config_dir)
    server = make_server(http_max_buffered_bytes=1 << 20, http_read_timeout=60.0)
    port, http_server = server.service.http_port, server.service.http_servers["http"]
    first = _connect(port)
    first.sendall(STALLED)
    wait_for("the first body reserved", lambda: http_server.buffered == 1 << 20)
    body = _json_body("open")
    head = f"POST /json HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    with _connect(port) as second:
        second.sendall(head + body)
        answer = _read_all(second)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"body bytes in flight" in answer
    first.close()
    wait_for("the first body freed", lambda: http_server.buffered == 0)
    assert server.http("POST", "/json", body)[0] == 200


def test_a_descriptor_on_a_granted_domain_is_answered_on_both_doors(guarded: Server) -> None:
    """The granted domain is answered alike over HTTP and gRPC (the door refuses only what
    the policy denies)."""
    status, text = _call(guarded, "POST", "/json", _json_body("open"))
    assert status == 200 and json.loads(text)["overallCode"] == "OK"
    request = rls_pb2.RateLimitRequest(domain="open", descriptors=[descriptor([("k", "v")])])
    assert rls_stub(guarded.channel).ShouldRateLimit(request, timeout=5).overall_code == 1


def test_a_lone_surrogate_quoted_back_in_an_error_is_answered_400(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A /json body whose bad field holds a lone surrogate ("\\ud800") is answered 400
    with the value escaped, not 500."""
    _domains(config_dir)
    server = make_server()
    status, text = _call(server, "POST", "/json", b'{"domain": "d", "descriptors": "\\ud800"}')
    assert status == 400 and b"\\ud800" in text, (status, text)


def test_random_and_mutated_http_requests_never_fail_inside_the_server(
    config_dir: ConfigDir, make_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """300 random, mutated, odd-valued and deeply nested requests over every route of the
    HTTP and debug ports: none is answered 500 (or drops its connection), none logs a
    traceback."""
    config_dir.write("mixed.yaml", MIXED)
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    config_dir.write("quota.yaml", QUOTA)
    server = make_server()
    ports = {"http": server.service.http_port, "debug": server.service.debug_port}
    conns = {
        name: http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for name, port in ports.items()
    }
    rng = random.Random(7)
    routes = http_routes()
    failed = []
    for _ in range(300):
        route = rng.choice(routes)
        target, body = http_case(route, rng)
        status = http_send(conns[route.port], route, target, body)
        if http_failed(status):
            failed.append((route.method, target[:100], body[:100], status))
    for conn in conns.values():
        conn.close()
    assert failed == []
    assert [r for r in caplog.records if r.exc_info is not None] == []
