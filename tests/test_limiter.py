"""Burst tiers through the real server: ferryman.v1.Limiter/Request and ShouldRateLimit."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.clock import ManualClock

from helpers.server import (
    ConfigDir,
    Server,
    ServerFactory,
    codes,
    descriptor,
    limiter_stub,
    overall,
)
from helpers.stores import on_stores

pytestmark = on_stores("memory", "redis", "cluster")

COOKBOOK = (Path(__file__).resolve().parents[1] / "descriptors" / "burst-cookbook.yaml").read_text()

EXTRA = """
domain: extra
descriptors:
  - key: fixed
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plain
  - key: shadowed
    shadow_mode: true
    burst_tiers:
      - {limit: 1, window: 1s, active: 1h}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 1, name: strict}
  - key: vip
    name: vip_tiers
    replaces: [{name: strict}]
    burst_tiers:
      - {limit: 100, window: 1s, active: 1h}
  - key: quiet
    name: quiet_tiers
    burst_tiers:
      - {limit: 1, window: 1h, active: 1h}
  - key: loud
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: quiet_tiers}]}
  - key: quota_a
    quota_mode: true
    burst_tiers:
      - {limit: 1, window: 1h, active: 1h}
  - key: quota_b
    quota_mode: true
    burst_tiers:
      - {limit: 2, window: 1h, active: 1h}
"""


def ask(
    server: Server, domain: str, entries: list[tuple[str, str]], copies: int = 1,
    min_copies: int | None = None,
) -> limiter_pb2.RateResponse:  # fmt: skip
    stub = limiter_stub(server.channel)
    request = limiter_pb2.RateRequest(
        domain=domain,
        descriptor=[limiter_pb2.Entry(key=k, value=v) for k, v in entries],
        copies=copies,
    )
    if min_copies is not None:
        request.min_copies = min_copies
    reply: limiter_pb2.RateResponse = stub.Request(request, timeout=10)
    return reply


@pytest.fixture
def server(config_dir: ConfigDir, make_server: ServerFactory) -> Server:
    config_dir.write("cookbook.yaml", COOKBOOK)
    config_dir.write("extra.yaml", EXTRA)
    return make_server(limit_response_headers_enabled=True)


def test_simple_tier_grants_five_per_second_then_says_when_to_retry(
    server: Server, clock: ManualClock
) -> None:
    """Five grants, then granted=0 with retry_after until the first hit leaves the window."""
    user = [("simple_user", "alice")]
    assert [ask(server, "cookbook", user).granted for _ in range(5)] == [1] * 5
    clock.advance(0.25)
    refused = ask(server, "cookbook", user)
    assert refused.granted == 0
    assert refused.active_tier_index == 1
    assert refused.active_tier_limit == 5
    assert refused.active_tier_hits == 5
    assert refused.tenant_hits_last_second == 5
    assert refused.retry_after.ToMilliseconds() == 750
    assert not refused.HasField("hard_limit")
    clock.advance(0.75)
    assert ask(server, "cookbook", user).granted == 1
    # Another tenant has its own tiers.
    assert ask(server, "cookbook", [("simple_user", "bob")]).granted == 1


def test_penalty_tier_bursts_and_reports_context(server: Server, clock: ManualClock) -> None:
    """The sixth hit bursts into the 50/s tier; limits and burst flag come back."""
    user = [("penalty_user", "carol")]
    ask(server, "cookbook", user, copies=5)
    burst = ask(server, "cookbook", user)
    assert burst.granted == 1
    assert burst.burst
    assert burst.active_tier_index == 2
    assert burst.active_tier_limit == 50
    assert burst.hard_limit == 50
    assert burst.global_limit == 1000
    assert burst.active_tier_window.ToSeconds() == 1
    bulk = ask(server, "cookbook", user, copies=60, min_copies=1)
    assert bulk.granted == 44  # hard limit: 50 per second per user, 6 already this second
    assert bulk.limited_by_hard_limit
    assert bulk.global_hits_last_second == 50


def test_prison_tier_through_the_api(server: Server, clock: ManualClock) -> None:
    """Past five per second a user gets one more hit, then nothing for fifteen seconds."""
    user = [("prison_user", "mallory")]
    assert ask(server, "cookbook", user, copies=6).granted == 6
    clock.advance(2)
    jailed = ask(server, "cookbook", user)
    assert jailed.granted == 0
    assert jailed.retry_after.ToSeconds() == 13
    clock.advance(13)
    assert ask(server, "cookbook", user).granted == 1


def test_batch_job_gets_5000_then_waits_for_the_next_day(
    server: Server, clock: ManualClock
) -> None:
    """A 5000-hit run is granted whole; after its five minutes the node is closed for a day."""
    job = [("batch_job", "nightly")]
    assert ask(server, "cookbook", job, copies=5000).granted == 5000
    assert ask(server, "cookbook", job).granted == 0
    clock.advance(301)
    closed = ask(server, "cookbook", job)
    assert closed.granted == 0
    assert closed.retry_after.ToSeconds() == 86099
    clock.advance(86099)
    assert ask(server, "cookbook", job, copies=10).granted == 10


def test_min_copies_not_reachable_grants_nothing(server: Server) -> None:
    """copies=8, min_copies=6 on a 5/s tier: rejected, and the five are still available."""
    user = [("simple_user", "dave")]
    assert ask(server, "cookbook", user, copies=8, min_copies=6).granted == 0
    assert ask(server, "cookbook", user, copies=5).granted == 5


@pytest.mark.parametrize(
    ("domain", "entries", "status", "text"),
    [
        ("nope", [("simple_user", "a")], grpc.StatusCode.NOT_FOUND, "domain"),
        ("cookbook", [("unknown", "a")], grpc.StatusCode.NOT_FOUND, "descriptor"),
        ("extra", [("plain", "a")], grpc.StatusCode.NOT_FOUND, "no burst tiers"),
        ("extra", [("fixed", "a")], grpc.StatusCode.INVALID_ARGUMENT, "rate_limit"),
        ("", [("simple_user", "a")], grpc.StatusCode.INVALID_ARGUMENT, "domain"),
        ("cookbook", [], grpc.StatusCode.INVALID_ARGUMENT, "descriptor"),
    ],
)
def test_request_errors_name_the_problem(
    server: Server,
    domain: str,
    entries: list[tuple[str, str]],
    status: grpc.StatusCode,
    text: str,
) -> None:
    """Unknown or non-burst nodes and malformed requests are client errors with a message."""
    with pytest.raises(grpc.RpcError) as info:
        ask(server, domain, entries)
    assert info.value.code() == status
    assert text in (info.value.details() or "")


def test_min_copies_above_copies_is_invalid(server: Server) -> None:
    """min_copies greater than copies is INVALID_ARGUMENT naming min_copies."""
    with pytest.raises(grpc.RpcError) as info:
        ask(server, "cookbook", [("simple_user", "e")], copies=2, min_copies=3)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_copies" in (info.value.details() or "")


def test_should_rate_limit_on_a_burst_node_reports_the_active_tier(
    server: Server, clock: ManualClock
) -> None:
    """Envoy's API: current_limit is the active tier, OVER_LIMIT when nothing is granted."""
    d = [("simple_user", "erin")]
    first = server.ask("cookbook", d)
    status = first.statuses[0]
    assert codes(first) == ["OK"]
    assert status.current_limit.requests_per_unit == 5
    assert status.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.SECOND
    assert status.limit_remaining == 4
    headers = {h.key: h.value for h in first.response_headers_to_add}
    assert headers["RateLimit-Limit"] == "5, 5;w=1"
    server.ask("cookbook", d, hits=4)
    over = server.ask("cookbook", d)
    assert overall(over) == "OVER_LIMIT"
    assert over.statuses[0].duration_until_reset.seconds == 1
    assert server.stat("ratelimit.service.rate_limit.cookbook.simple_user.over_limit") == 1
    assert server.stat("ratelimit.service.rate_limit.cookbook.simple_user.total_hits") == 6


def test_should_rate_limit_bursts_and_honours_shadow_mode(server: Server) -> None:
    """A hits_addend bulk bursts through tiers; a shadow-mode burst node never blocks."""
    d = descriptor([("penalty_user", "frank")], hits=8)
    assert codes(server.ask("cookbook", d)) == ["OK"]
    shadow = [("shadowed", "x")]
    server.ask("extra", shadow)
    refused = server.ask("extra", shadow)
    assert overall(refused) == "OK"
    assert refused.statuses[0].limit_remaining == 0
    assert server.stat("ratelimit.service.rate_limit.extra.shadowed.shadow_mode") == 1


def test_replaces_works_between_burst_and_fixed_window_rules(server: Server) -> None:
    """A named burst node can drop a fixed-window rule, and a fixed-window rule a burst node."""
    for _ in range(3):
        r = server.ask("extra", [("strict", "s")], [("vip", "v")])
        assert codes(r) == ["OK", "OK"]
        assert not r.statuses[0].HasField("current_limit")
        assert r.statuses[1].current_limit.name == "vip_tiers"
    for _ in range(3):
        r = server.ask("extra", [("quiet", "q")], [("loud", "l")])
        assert codes(r) == ["OK", "OK"]
        assert not r.statuses[0].HasField("current_limit")
    # Alone, the replaced burst node still has its single hit.
    assert codes(server.ask("extra", [("quiet", "q")])) == ["OK"]
    assert codes(server.ask("extra", [("quiet", "q")])) == ["OVER_LIMIT"]


def test_quota_mode_burst_nodes_block_only_when_all_are_over(server: Server) -> None:
    """Two quota-mode burst nodes: one exhausted is OK overall, both exhausted is over."""
    a, b = [("quota_a", "t")], [("quota_b", "t")]
    assert overall(server.ask("extra", a, b)) == "OK"
    r = server.ask("extra", a, b)
    assert codes(r) == ["OVER_LIMIT", "OK"]
    assert overall(r) == "OK"
    assert overall(server.ask("extra", a, b)) == "OVER_LIMIT"
