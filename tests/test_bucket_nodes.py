"""``token_bucket`` on descriptor nodes: smooth limits for ShouldRateLimit over the real gRPC
server on memory, Redis and a Redis Cluster; the node YAML and its errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.algorithms.token_bucket import NodeBucket
from ferryman.algorithms.token_bucket.model import BucketSpec
from ferryman.clock import ManualClock
from ferryman.config import load_sources
from ferryman.errors import ConfigError

from helpers.server import EPOCH, ConfigDir, ServerFactory, codes, descriptor

CONFIG = """
domain: smooth
descriptors:
  - key: user
    token_bucket: {size: 3, fill_rate: 2}
  - key: debtor
    token_bucket: {size: 2, fill_rate: 1, max_debt_millis: 1000}
  - key: tenant
    descriptors:
      - key: route
        token_bucket: {size: 1, fill_rate: 0.5}
        shadow_mode: true
"""

RateLimit = rls_pb2.RateLimitResponse.RateLimit


@pytest.mark.parametrize(
    "store_kind",
    [
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
    ],
    indirect=True,
)
def test_a_bucket_drains_refills_and_reports_the_next_token(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """3 tokens, 2 per second: three pass, the fourth is over; half a second later one more
    token is there; the status shows the size, the whole tokens left and the next token."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 0.25)
    answers = [server.ask("smooth", [("user", "a")]) for _ in range(4)]
    assert [codes(r)[0] for r in answers] == ["OK", "OK", "OK", "OVER_LIMIT"]
    first = answers[0].statuses[0]
    assert first.current_limit.requests_per_unit == 2  # the fill rate: 2 per second
    assert first.current_limit.unit == RateLimit.SECOND
    assert [r.statuses[0].limit_remaining for r in answers] == [2, 1, 0, 0]
    assert first.duration_until_reset.seconds == 1  # the next token in 0.5 s, rounded up
    # Another user has its own bucket.
    assert codes(server.ask("smooth", [("user", "b")])) == ["OK"]
    clock.set(EPOCH + 0.75)
    assert codes(server.ask("smooth", [("user", "a")])) == ["OK"]
    assert codes(server.ask("smooth", [("user", "a")])) == ["OVER_LIMIT"]
    clock.set(EPOCH + 10)
    full = server.ask("smooth", descriptor([("user", "a")], hits=0))
    assert codes(full) == ["OK"] and full.statuses[0].limit_remaining == 3
    # A request larger than the bucket can never pass.
    assert codes(server.ask("smooth", descriptor([("user", "a")], hits=4))) == ["OVER_LIMIT"]
    assert server.stat("ratelimit.service.rate_limit.smooth.user.over_limit") == 6
    assert server.stat("ratelimit.service.rate_limit.smooth.user.within_limit") == 5


@pytest.mark.parametrize(
    "store_kind",
    ["memory", pytest.param("redis", marks=pytest.mark.redis)],
    indirect=True,
)
def test_debt_lets_one_request_borrow_and_then_the_next_ones_wait_it_out(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """Envoy cannot wait: a borrowing request passes, later ones are over until the debt is
    repaid."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    r = server.ask("smooth", descriptor([("debtor", "x")], hits=3))  # 2 held, 1 borrowed
    assert codes(r) == ["OK"]
    assert r.statuses[0].limit_remaining == 0
    assert r.statuses[0].duration_until_reset.seconds == 2  # 1 s of debt, then 1 s a token
    assert codes(server.ask("smooth", [("debtor", "x")])) == ["OVER_LIMIT"]
    clock.set(EPOCH + 1.0)
    assert codes(server.ask("smooth", [("debtor", "x")])) == ["OK"]  # borrows again


def test_shadow_mode_headers_and_nested_nodes(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """A nested bucket in shadow mode answers OK when empty; the RateLimit-* headers give
    the size over the time to fill it."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server(limit_response_headers_enabled=True)
    clock.set(EPOCH)
    path = [("tenant", "t"), ("route", "/r")]
    assert codes(server.ask("smooth", path)) == ["OK"]
    r = server.ask("smooth", path)
    assert codes(r) == ["OK"]
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers == {
        "RateLimit-Limit": "1, 1;w=2",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "2",
    }
    assert server.stat("ratelimit.service.rate_limit.smooth.tenant.route.shadow_mode") == 1


def test_node_yaml_reads_the_quota_keys_with_node_defaults() -> None:
    config = load_sources([("s.yaml", CONFIG)])
    rule = config.domains["smooth"].root.rules[1]
    assert rule.limit == NodeBucket(
        BucketSpec(
            size=2,
            fill_rate=1.0,
            wait_timeout_millis=0,
            max_debt_millis=1000,
            max_tokens_per_request=2.0,
        )
    )


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ("    token_bucket: {size: 2}\n", "descriptors[0].token_bucket", "needs 'fill_rate'"),
        (
            "    token_bucket: {size: 2, fill_rate: 0}\n",
            "descriptors[0].token_bucket.fill_rate",
            "must be positive",
        ),
        (
            "    token_bucket: {size: -1, fill_rate: 1}\n",
            "descriptors[0].token_bucket.size",
            "out of range",
        ),
        (
            "    token_bucket: {size: 1, fill_rate: 1, burst: 3}\n",
            "descriptors[0].token_bucket.burst",
            "unknown key",
        ),
        (
            "    token_bucket: {size: 1, fill_rate: 1}\n"
            "    rate_limit: {unit: second, requests_per_unit: 1}\n",
            "descriptors[0].token_bucket",
            "one of rate_limit, burst_tiers, copies, token_bucket",
        ),
    ],
)
def test_bad_buckets_are_config_errors_with_file_line_and_path(
    body: str, path: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_sources([("b.yaml", "domain: d\ndescriptors:\n  - key: k\n" + body)])
    text = str(err.value)
    assert "b.yaml:4" in text or "b.yaml:5" in text
    assert path in text
    assert message in text


def test_check_describes_smooth_nodes(tmp_path: Path) -> None:
    """``ferryman check`` lists token-bucket and sliding-window nodes with their numbers."""
    (tmp_path / "s.yaml").write_text(
        CONFIG + "  - key: ip\n    sliding_window: {unit: minute, requests_per_unit: 9}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "ferryman", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "token bucket size 3, 2 per second, debt up to 0ms, waits up to 0ms" in done.stdout
    assert "sliding window 9 per minute" in done.stdout
