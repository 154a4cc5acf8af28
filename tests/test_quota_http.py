"""POST /quota/allow: the quota service's Allow as JSON on the HTTP port of a real server."""

from __future__ import annotations

import json

import pytest

from helpers.server import ConfigDir, Server, ServerFactory

QUOTA = """
namespaces:
  api:
    buckets:
      one: {size: 1, fill_rate: 0.001, wait_timeout_millis: 0, max_tokens_per_request: 1}
      slow: {size: 1, fill_rate: 10, wait_timeout_millis: 1000}
"""


@pytest.fixture
def server(config_dir: ConfigDir, make_server: ServerFactory) -> Server:
    config_dir.write("quota.yaml", QUOTA)
    return make_server()


def _allow(server: Server, body: object) -> tuple[int, dict[str, object]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, answer = server.http("POST", "/quota/allow", raw)
    return status, json.loads(answer)


def test_allow_grants_then_refuses_with_the_grpc_statuses_as_json(server: Server) -> None:
    """A granted token is 200 OK; the next one of an empty bucket is 429 REJECTED_TIMEOUT."""
    request = {"namespace": "api", "bucket_name": "one", "tokens_requested": 1}
    assert _allow(server, request) == (
        200,
        {"status": "OK", "tokens_granted": 1, "wait_millis": 0},
    )
    status, body = _allow(server, request)
    assert status == 429 and body["status"] == "REJECTED_TIMEOUT" and body["tokens_granted"] == 0


def test_a_wait_is_granted_as_a_number_and_the_override_lowers_it(server: Server) -> None:
    """After a 10/s bucket's token and one borrowed, the next waits 100 ms; an override of
    50 ms refuses it."""
    request: dict[str, object] = {"namespace": "api", "bucket_name": "slow"}
    assert [_allow(server, request)[1]["wait_millis"] for _ in range(2)] == [0, 0]
    refused = _allow(server, {**request, "max_wait_millis_override": 50})
    assert refused == (429, {"status": "REJECTED_TIMEOUT", "tokens_granted": 0, "wait_millis": 0})
    status, body = _allow(server, request)
    assert status == 200 and body["wait_millis"] == 100 and isinstance(body["wait_millis"], int)


@pytest.mark.parametrize(
    ("body", "code", "status", "named"),
    [
        ({"namespace": "api", "bucket_name": "none"}, 404, "REJECTED_NO_BUCKET", ""),
        ({"namespace": "api", "bucket_name": "one", "tokens_requested": -1}, 400, "", "tokens"),
        ({"namespace": 3, "bucket_name": "one"}, 400, "", "namespace"),
        (b"not json", 400, "", "body"),
    ],
)
def test_bad_requests_and_missing_buckets_are_answered_in_json(
    server: Server, body: object, code: int, status: str, named: str
) -> None:
    """A missing bucket is 404; a bad field is 400 REJECTED_INVALID_REQUEST naming it."""
    got, answer = _allow(server, body)
    assert got == code
    assert answer["status"] == (status or "REJECTED_INVALID_REQUEST")
    assert named in str(answer.get("error", ""))
