"""The HTTP endpoints: /healthcheck and /json on PORT, /rlconfig and /stats on DEBUG_PORT."""

from __future__ import annotations

import json

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
    """Not JSON, a wrong field, or an empty domain give 400 with a reason."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    for bad in (b"{not json", b'{"domian": "web"}', body("", "u")):
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
