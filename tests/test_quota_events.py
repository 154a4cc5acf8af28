"""Quota events on /metrics, and Allow when the Redis behind the buckets is gone."""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.backends.redis import RedisBackend, parse_backend_url

from helpers.redis_procs import RedisProcess
from helpers.server import ConfigDir, Server, ServerFactory, quota_stub, wait_for

QUOTA = """
namespaces:
  ips:
    dynamic_bucket_template: {size: 1, fill_rate: 1, max_idle_millis: 0}
    max_dynamic_buckets: 1
"""


def allow(server: Server, ns: str, bucket: str, tokens: int = 1) -> str:
    stub = quota_stub(server.channel)
    request = quota_service_pb2.AllowRequest(
        namespace=ns, bucket_name=bucket, tokens_requested=tokens
    )
    status = stub.Allow(request, timeout=10).status
    return quota_service_pb2.AllowResponse.Status.Name(status)


def metrics(server: Server) -> list[str]:
    port = server.service.prometheus_port
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", server.settings.prometheus_path)
        return conn.getresponse().read().decode().splitlines()
    finally:
        conn.close()


def test_events_are_counted_on_metrics(config_dir: ConfigDir, make_server: ServerFactory) -> None:
    """Each event kind is a series of ratelimit_service_quota_events on /metrics."""
    config_dir.write("quota.yaml", QUOTA)
    server = make_server(use_prometheus=True, prometheus_addr="127.0.0.1:0")
    assert allow(server, "ips", "a") == "OK"
    assert allow(server, "ips", "a", 5) == "REJECTED_TOO_MANY_TOKENS_REQUESTED"
    assert allow(server, "ips", "b") == "REJECTED_TOO_MANY_BUCKETS"
    assert allow(server, "nowhere", "x") == "REJECTED_NO_BUCKET"
    server.clock.advance(0.002)
    assert allow(server, "ips", "b") == "OK"  # a is removed, b made
    assert allow(server, "ips", "b") == "OK"  # borrows a token: the next caller waits
    assert allow(server, "ips", "b") == "OK"  # after a wait of 1 s
    lines = set(metrics(server))
    for event, count in [
        ("tokens_served", 3),
        ("tokens_served_with_wait", 1),
        ("too_many_tokens_requested", 1),
        ("too_many_buckets", 1),
        ("bucket_miss", 1),
        ("bucket_created", 2),
        ("bucket_removed", 1),
    ]:
        assert f'ratelimit_service_quota_events{{event="{event}"}} {count}' in lines, event


@pytest.mark.parametrize("fail_open", [True, False])
def test_redis_gone_fails_open_or_closed(
    tmp_path: Path, config_dir: ConfigDir, make_server: ServerFactory, fail_open: bool
) -> None:
    """With Redis down, Allow answers OK (FAIL_OPEN) or REJECTED_SERVER_ERROR, promptly."""
    config_dir.write("quota.yaml", QUOTA)
    redis = RedisProcess(tmp_path / "redis").start()
    backend = RedisBackend(parse_backend_url(redis.url, pool_size=2, timeout=0.5))
    server = make_server(backend=backend, fail_open=fail_open)
    wait_for("redis healthy", lambda: allow(server, "ips", "a") == "OK")
    redis.kill()
    expected = "OK" if fail_open else "REJECTED_SERVER_ERROR"
    assert allow(server, "ips", "a") == expected
    assert server.stat("ratelimit.service.quota.store_error") >= 1
