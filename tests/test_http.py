"""The HTTP endpoints: /healthcheck and /json on PORT, /rlconfig and /stats on DEBUG_PORT."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from helpers.server import ConfigDir, ServerFactory

CONFIG = """
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    value: "app-*"
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 10, name: apps}
  - key: free
    rate_limit: {unlimited: true}
"""


def body(domain: str, user: str) -> bytes:
    request = {"domain": domain, "descriptors": [{"entries": [{"key": "user", "value": user}]}]}
    return json.dumps(request).encode()


def test_healthcheck_answers_ok_while_serving(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """GET /healthcheck is 200 'OK' while the service is up."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    assert server.http("GET", "/healthcheck") == (200, b"OK")


def test_json_endpoint_answers_200_then_429(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """POST /json: 200 under the limit, 429 over it, with the protojson response as body."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    status, raw = server.http("POST", "/json", body("web", "u1"))
    assert status == 200
    reply = json.loads(raw)
    assert reply["overallCode"] == "OK"
    assert reply["statuses"][0]["currentLimit"]["requestsPerUnit"] == 1
    status, raw = server.http("POST", "/json", body("web", "u1"))
    assert status == 429
    assert json.loads(raw)["overallCode"] == "OVER_LIMIT"


def test_json_endpoint_rejects_bad_bodies_with_400(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Not JSON, a wrong field, a key given twice, or an empty domain give 400 with a
    reason."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    twice = body("web", "u").replace(b'"domain": "web"', b'"domain": "x", "domain": "web"')
    for bad in (b"{not json", b'{"domian": "web"}', twice, body("", "u")):
        status, raw = server.http("POST", "/json", bad)
        assert status == 400, bad
        assert raw.startswith(b"bad request")
    assert server.http("GET", "/json")[0] == 405
    assert server.http("GET", "/nope")[0] == 404


def test_rlconfig_lists_every_limit_in_the_reference_format(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/rlconfig prints one line per limit with unit, requests_per_unit and modes."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    status, raw = server.http("GET", "/rlconfig", debug=True)
    assert status == 200
    lines = raw.decode().splitlines()
    assert (
        "web.user: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false" in lines
    )
    assert (
        "web.client_app-*: unit=HOUR requests_per_unit=10, shadow_mode: true, quota_mode: false"
        in lines
    )
    assert len(lines) == 3


def test_stats_page_shows_counters_after_traffic(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/stats lists counters by their reference names with current values."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    server.ask("web", [("user", "a")])
    server.ask("web", [("user", "a")])
    raw = server.http("GET", "/stats", debug=True)[1].decode()
    assert "ratelimit.service.rate_limit.web.user.total_hits: 2\n" in raw
    assert "ratelimit.service.rate_limit.web.user.over_limit: 1\n" in raw
    assert "ratelimit.service.config_load_success: 1\n" in raw


def raw_exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send ``data`` on a fresh connection; the whole answer and whether the server closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks: list[bytes] = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in b"".join(chunks):
                return b"".join(chunks), False


MALFORMED = [
    pytest.param(
        b"POST /json HTTP/1.1\r\nContent-Length: -5\r\n\r\n{}",
        400,
        b"Content-Length '-5'",
        id="negative-length",
    ),
    pytest.param(
        b"POST /json HTTP/1.1\r\nContent-Length: ten\r\n\r\n{}",
        400,
        b"Content-Length 'ten'",
        id="text-length",
    ),
    pytest.param(
        b"POST /json HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n{}",
        400,
        b"Content-Length '1e3'",
        id="float-length",
    ),
    pytest.param(
        b"GET /healthcheck HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
        431,
        b"header line longer than 65536 bytes",
        id="long-header",
    ),
    pytest.param(
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
        414,
        b"request line longer than 65536 bytes",
        id="long-target",
    ),
    pytest.param(
        b"GET /healthcheck HTTP/1.1\r\nno colon here\r\n\r\n",
        400,
        b"malformed header line",
        id="no-colon",
    ),
    pytest.param(
        b"POST /json HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        411,
        b"Content-Length",
        id="chunked",
    ),
    pytest.param(
        b"GET /healthcheck HTTP/1.1\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n",
        431,
        b"more than 100 header lines",
        id="many-headers",
    ),
]


@pytest.mark.parametrize(("request_bytes", "status", "says"), MALFORMED)
@pytest.mark.parametrize("debug", [False, True], ids=["http", "debug"])
def test_malformed_requests_get_an_answer_then_the_connection_closes(
    request_bytes: bytes,
    status: int,
    says: bytes,
    debug: bool,
    config_dir: ConfigDir,
    make_server: ServerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bad Content-Length, an oversized line, a header without a colon or a chunked body
    is answered with its 4xx status and the connection is closed; it is logged as one line
    at most (bad input is throttled), never at ERROR and never with a traceback."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    caplog.set_level(logging.INFO)
    port = server.service.debug_port if debug else server.service.http_port
    answer, closed = raw_exchange(port, request_bytes)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b"Connection: close" in answer
    assert says in answer
    assert closed
    assert server.http("GET", "/healthcheck") == (200, b"OK")  # the server serves on
    logged = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(logged) <= 1
    assert all(r.levelno < logging.ERROR and r.exc_info is None for r in logged), logged


def test_json_calls_count_in_total_requests_with_the_grpc_ones(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/stats total_requests counts ShouldRateLimit calls on both ports; a bad /json body
    counts as a service error too."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    server.ask("web", [("user", "g")])
    server.http("POST", "/json", body("web", "j1"))
    server.http("POST", "/json", body("web", "j2"))
    server.http("POST", "/json", b"{not json")
    raw = server.http("GET", "/stats", debug=True)[1].decode()
    assert "ratelimit_server.ShouldRateLimit.total_requests: 4\n" in raw
    assert "ratelimit.service.call.should_rate_limit.service_error: 1\n" in raw


def test_json_leaves_out_limit_remaining_when_it_is_zero_as_the_reference(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """The reference writes its answer with protojson, which leaves out zero values: the
    over-limit status has currentLimit and durationUntilReset but no limitRemaining."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    first = json.loads(server.http("POST", "/json", body("web", "z"))[1])
    assert "limitRemaining" not in first["statuses"][0]  # 1 per minute: 0 left after it
    status, raw = server.http("POST", "/json", body("web", "z"))
    assert status == 429
    over = json.loads(raw)["statuses"][0]
    assert over["code"] == "OVER_LIMIT"
    assert "limitRemaining" not in over
    assert over["currentLimit"] == {"requestsPerUnit": 1, "unit": "MINUTE"}
    assert over["durationUntilReset"].endswith("s")
    request = {
        "domain": "web",
        "descriptors": [{"entries": [{"key": "client", "value": "app-1"}]}],
    }
    within = json.loads(server.http("POST", "/json", json.dumps(request).encode())[1])
    assert within["statuses"][0]["limitRemaining"] == 9
