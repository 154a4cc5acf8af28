"""ShouldRateLimit over a real gRPC socket: matching, rule options, hits, overrides, modes."""

from __future__ import annotations

import time
from typing import Any, cast

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.clock import ManualClock

from helpers.server import EPOCH, ConfigDir, ServerFactory, codes, descriptor, overall
from helpers.stores import on_stores

MESSAGING = """
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: path
    value: /api/v1/*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*/admin
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/exact
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: whitelisted
  - key: parent
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: child
        rate_limit: {unit: second, requests_per_unit: 10}
"""

# Every behaviour here holds on each backend: memory, one Redis, and a 3-node Redis Cluster.
pytestmark = on_stores("memory", "redis", "cluster")


def limit_of(response: rls_pb2.RateLimitResponse, i: int = 0) -> int:
    return response.statuses[i].current_limit.requests_per_unit


def test_exact_value_is_matched_before_wildcards_and_bare_key(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """An exact value wins over a wildcard listed before it, and over the bare key."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    assert limit_of(server.ask("messaging", [("path", "/api/exact")])) == 4


def test_wildcards_match_in_config_order_anywhere_in_the_value(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """The first wildcard in config order wins; '*' may stand in the middle of a value."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    assert limit_of(server.ask("messaging", [("path", "/api/v1/users")])) == 1
    assert limit_of(server.ask("messaging", [("path", "/api/v2/admin")])) == 5
    assert limit_of(server.ask("messaging", [("path", "/api/v2/users")])) == 2
    # No wildcard matches: the bare key applies.
    assert limit_of(server.ask("messaging", [("path", "/other")])) == 7


def test_nested_descriptor_uses_the_limit_of_the_last_entry(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A two-entry descriptor lands on the child node; a shorter one on the parent."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    both = server.ask("messaging", [("message_type", "marketing"), ("to_number", "1")])
    assert limit_of(both) == 2
    assert limit_of(server.ask("messaging", [("parent", "x")])) == 1
    assert limit_of(server.ask("messaging", [("parent", "x"), ("child", "y")])) == 10


def test_no_match_deeper_descriptor_whitelist_and_unknown_domain_answer_ok_without_limit(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Unmatched, too deep, whitelisted and unknown-domain descriptors are OK with no limit."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    for domain, entries in [
        ("messaging", [("nope", "x")]),
        ("messaging", [("message_type", "marketing")]),
        ("messaging", [("to_number", "1"), ("deeper", "x")]),
        ("messaging", [("whitelisted", "anything")]),
        ("unknown-domain", [("to_number", "1")]),
    ]:
        response = server.ask(domain, entries)
        assert overall(response) == "OK"
        assert not response.statuses[0].HasField("current_limit")
    assert server.stat("ratelimit.service.rate_limit.unknown-domain.domain_not_found") == 1


def test_bare_key_gives_every_value_its_own_counter(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Two values of a bare key count separately; the fourth hit of one value is over."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    for _ in range(3):
        assert codes(server.ask("messaging", [("to_number", "a")])) == ["OK"]
    assert codes(server.ask("messaging", [("to_number", "a")])) == ["OVER_LIMIT"]
    assert codes(server.ask("messaging", [("to_number", "b")])) == ["OK"]


def test_fixed_window_status_fields_and_epoch_aligned_reset(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """current_limit, limit_remaining and duration_until_reset follow the epoch window."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    clock.set(EPOCH + 2.5)  # EPOCH is a multiple of 60, so 57 s remain in the minute
    first = server.ask("messaging", [("path", "/api/v2/x")])
    status = first.statuses[0]
    assert status.code == rls_pb2.RateLimitResponse.OK
    assert status.current_limit.requests_per_unit == 2
    assert status.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.MINUTE
    assert status.limit_remaining == 1
    assert status.duration_until_reset.seconds == 58
    server.ask("messaging", [("path", "/api/v2/x")])
    over = server.ask("messaging", [("path", "/api/v2/x")])
    assert overall(over) == "OVER_LIMIT"
    assert over.statuses[0].limit_remaining == 0
    # The next window starts fresh.
    clock.set(EPOCH + 60)
    assert codes(server.ask("messaging", [("path", "/api/v2/x")])) == ["OK"]


def test_request_hits_addend_and_descriptor_hits_addend(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """The descriptor's own hits_addend overrides the request's; 0 there only checks."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    r = server.ask("messaging", [("to_number", "h")], hits=2)
    assert r.statuses[0].limit_remaining == 1
    # The descriptor-level value wins over the request-level one.
    r = server.ask("messaging", descriptor([("to_number", "h")], hits=0), hits=5)
    assert codes(r) == ["OK"] and r.statuses[0].limit_remaining == 1
    r = server.ask("messaging", descriptor([("to_number", "h")], hits=2), hits=1)
    assert codes(r) == ["OVER_LIMIT"]


def test_negative_hits_give_quota_back(config_dir: ConfigDir, make_server: ServerFactory) -> None:
    """A descriptor with is_negative_hits subtracts its hits from the counter (floor 0)."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    server.ask("messaging", [("to_number", "n")], hits=3)
    assert codes(server.ask("messaging", [("to_number", "n")])) == ["OVER_LIMIT"]
    back = server.ask("messaging", descriptor([("to_number", "n")], hits=3, negative=True))
    assert codes(back) == ["OK"]
    assert back.statuses[0].limit_remaining == 2
    assert codes(server.ask("messaging", [("to_number", "n")])) == ["OK"]


def test_limit_override_applies_in_a_known_domain_even_without_a_match(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A descriptor's own limit is used (and counted) when the domain is known."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    minute = rls_pb2.RateLimitResponse.RateLimit.MINUTE
    d = descriptor([("unconfigured", "x")], limit=(1, minute))
    first = server.ask("messaging", d)
    assert codes(first) == ["OK"]
    assert first.statuses[0].current_limit.requests_per_unit == 1
    assert codes(server.ask("messaging", d)) == ["OVER_LIMIT"]
    # The override also replaces a configured limit (to_number is 3/day in config).
    d2 = descriptor([("to_number", "o")], limit=(1, minute))
    server.ask("messaging", d2)
    assert codes(server.ask("messaging", d2)) == ["OVER_LIMIT"]
    assert server.stat("ratelimit.service.rate_limit.messaging.unconfigured_x.over_limit") == 1
    # In an unknown domain it does not apply.
    assert codes(server.ask("nodomain", d)) == ["OK"]


OPTIONS = """
domain: opts
descriptors:
  - key: free
    rate_limit: {unlimited: true}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 1, name: strict_rule}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: vip_rule
      replaces: [{name: strict_rule}]
  - key: shared
    value: tenant-*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: each
    value: tenant-*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: meta
    metadata: {team: payments, tier: 2}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: meta2
    metadata: {team: search, extra: true}
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


def test_unlimited_rule_answers_max_remaining_and_counts_nothing(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """An unlimited rule is OK with limit_remaining 2^32-1 and emits no stats."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server()
    for _ in range(5):
        r = server.ask("opts", [("free", "x")])
        assert codes(r) == ["OK"]
        assert r.statuses[0].limit_remaining == 4294967295
    assert not [k for k in server.stats if ".free" in k]


def test_shadow_mode_rule_counts_but_never_blocks(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Over a shadow-mode limit the status is OK with remaining 0, and shadow_mode counts."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server()
    server.ask("opts", [("shadowed", "x")])
    r = server.ask("opts", [("shadowed", "x")], hits=2)
    assert overall(r) == "OK" and codes(r) == ["OK"]
    assert r.statuses[0].limit_remaining == 0
    assert server.stat("ratelimit.service.rate_limit.opts.shadowed.shadow_mode") == 2
    assert server.stat("ratelimit.service.rate_limit.opts.shadowed.over_limit") == 2


def test_quota_mode_is_over_only_when_every_quota_descriptor_is_over(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With two quota descriptors, one over leaves the request OK; both over blocks it."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server()
    a, b = [("quota_a", "t")], [("quota_b", "t")]
    assert overall(server.ask("opts", a, b)) == "OK"  # a=1/1, b=1/2
    r = server.ask("opts", a, b)  # a over (2/1), b=2/2 still within
    assert codes(r) == ["OVER_LIMIT", "OK"] and overall(r) == "OK"
    r = server.ask("opts", a, b)  # both over
    assert codes(r) == ["OVER_LIMIT", "OVER_LIMIT"] and overall(r) == "OVER_LIMIT"
    # A non-quota descriptor over the limit still blocks on its own.
    server.ask("opts", [("strict", "s")])
    r = server.ask("opts", [("strict", "s")], [("quota_b", "fresh")])
    assert overall(r) == "OVER_LIMIT"


def test_global_quota_mode_makes_every_rule_a_quota_rule(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """QUOTA_MODE=true: one of two over-limit rules alone does not block."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server(quota_mode=True)
    server.ask("opts", [("strict", "s")])
    r = server.ask("opts", [("strict", "s")], [("detailed", "d")])
    assert codes(r) == ["OVER_LIMIT", "OK"] and overall(r) == "OK"


def test_global_shadow_mode_keeps_statuses_but_answers_ok(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """SHADOW_MODE=true: the status says OVER_LIMIT, the overall code OK, and it is counted."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server(shadow_mode=True)
    server.ask("opts", [("strict", "s")])
    r = server.ask("opts", [("strict", "s")])
    assert codes(r) == ["OVER_LIMIT"] and overall(r) == "OK"
    assert server.stat("ratelimit.service.global_shadow_mode") == 1


def test_replaces_drops_the_named_limit_for_matching_requests(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """When vip matches, strict_rule is dropped (OK, no limit, counter untouched)."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server()
    for _ in range(3):
        r = server.ask("opts", [("strict", "s")], [("vip", "v")])
        assert codes(r) == ["OK", "OK"]
        assert not r.statuses[0].HasField("current_limit")
        assert r.statuses[1].current_limit.name == "vip_rule"
    # The replaced rule's counter was never touched: alone it still allows one hit.
    alone = server.ask("opts", [("strict", "s")])
    assert codes(alone) == ["OK"]
    assert alone.statuses[0].current_limit.name == "strict_rule"
    assert codes(server.ask("opts", [("strict", "s")])) == ["OVER_LIMIT"]


def test_share_threshold_makes_matching_values_share_one_counter(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With share_threshold, tenant-a and tenant-b use one counter; without, one each."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server()
    assert codes(server.ask("opts", [("shared", "tenant-a")])) == ["OK"]
    assert codes(server.ask("opts", [("shared", "tenant-b")])) == ["OK"]
    assert codes(server.ask("opts", [("shared", "tenant-c")])) == ["OVER_LIMIT"]
    for tenant in ("tenant-a", "tenant-b", "tenant-c"):
        assert codes(server.ask("opts", [("each", tenant)])) == ["OK"]
    assert server.stat("ratelimit.service.rate_limit.opts.shared_tenant-*.total_hits") == 3


def test_detailed_metric_and_value_to_metric_put_request_values_in_stat_keys(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """detailed_metric keys stats by every request value; value_to_metric by that level's."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server()
    server.ask("opts", [("detailed", "alice")])
    server.ask("opts", [("route", "/users"), ("method", "GET")])
    assert server.stat("ratelimit.service.rate_limit.opts.detailed_alice.total_hits") == 1
    assert server.stat("ratelimit.service.rate_limit.opts.route_/users.method.total_hits") == 1


def test_response_headers_come_from_the_descriptor_with_least_remaining(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """RateLimit-* headers: a 10/minute limit over at t=2222 gives 10, 0, 58."""
    config_dir.write(
        "h.yaml",
        """
domain: h
descriptors:
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: hundred
    rate_limit: {unit: hour, requests_per_unit: 100}
""",
    )
    server = make_server(limit_response_headers_enabled=True)
    clock.set(2222.0)
    server.ask("h", [("ten", "x")], hits=10)
    r = server.ask("h", [("hundred", "y")], [("ten", "x")])
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers == {"RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "58"}
    # On an OK answer the tightest descriptor is reported.
    r = server.ask("h", [("hundred", "z")], [("ten", "other")], hits=5)
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers["RateLimit-Limit"] == "10" and headers["RateLimit-Remaining"] == "5"


def test_response_header_names_are_configurable(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """LIMIT_*_HEADER rename the three headers; without the switch there are none."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server(
        limit_response_headers_enabled=True,
        limit_limit_header="X-Limit",
        limit_remaining_header="X-Left",
        limit_reset_header="X-Reset",
    )
    r = server.ask("opts", [("strict", "a")])
    assert sorted(h.key for h in r.response_headers_to_add) == ["X-Left", "X-Limit", "X-Reset"]
    plain = make_server()
    assert not plain.ask("opts", [("strict", "a")]).response_headers_to_add


def test_dynamic_metadata_merges_rule_metadata_first_value_wins(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """RESPONSE_DYNAMIC_METADATA, in the reference's shape: the request echoed (entries as
    key=value), and the passed rules' metadata merged in request order under ``metadata``."""
    config_dir.write("o.yaml", OPTIONS)
    server = make_server(response_dynamic_metadata=True)
    r = server.ask("opts", [("meta2", "2")], [("meta", "1")], hits=1)
    md = cast(Any, r.dynamic_metadata)
    assert md["domain"] == "opts"
    assert md["hitsAddend"] == 1
    assert list(md["descriptors"][1]["entries"]) == ["meta=1"]
    assert dict(md["metadata"]) == {"team": "search", "extra": True, "tier": 2}
    assert "team" not in md  # never merged into the top level
    plain = server.ask("opts", [("strict", "a")]).dynamic_metadata
    assert "hitsAddend" not in plain and "metadata" not in plain  # 0 and none: left out


NESTED = """
domain: nest
descriptors:
  - key: a
    metadata: {route: {cluster: one, weight: 1}, tag: first}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    metadata: {route: {cluster: two, zone: z}, tag: second}
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


def test_dynamic_metadata_merges_maps_level_by_level_and_skips_over_limit_rules(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Nested maps merge key by key (first value wins); an over-limit rule adds nothing."""
    config_dir.write("n.yaml", NESTED)
    server = make_server(response_dynamic_metadata=True)
    md = cast(Any, server.ask("nest", [("a", "x")], [("b", "y")]).dynamic_metadata)
    assert dict(md["metadata"]["route"]) == {"cluster": "one", "weight": 1, "zone": "z"}
    assert md["metadata"]["tag"] == "first"
    md = cast(Any, server.ask("nest", [("a", "x")], [("b", "y")]).dynamic_metadata)  # a: over
    assert dict(md["metadata"]["route"]) == {"cluster": "two", "zone": "z"}
    assert md["metadata"]["tag"] == "second"


def test_near_and_over_limit_stats_follow_the_reference_arithmetic(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Limit 10, ratio 0.8 (N=8): hits of 7, 3, 2 give exact within/near/over counts."""
    config_dir.write(
        "s.yaml",
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: "
        "{unit: hour, requests_per_unit: 10}\n",
    )
    server = make_server()
    base = "ratelimit.service.rate_limit.s.k."
    server.ask("s", [("k", "v")], hits=7)  # 0 -> 7: within 7, near 0
    server.ask("s", [("k", "v")], hits=3)  # 7 -> 10: within 3, near 10-8 = 2
    server.ask("s", [("k", "v")], hits=2)  # 10 -> 12: over 2 (b >= L)
    assert server.stat(base + "within_limit") == 10
    assert server.stat(base + "near_limit") == 2
    assert server.stat(base + "over_limit") == 2
    assert server.stat(base + "total_hits") == 12
    # A request that crosses the limit splits: 0 -> 6, then 6 -> 13 with L=10, N=8:
    # over += 13-10 = 3, near += 10 - max(8, 6) = 2.
    server.ask("s", [("k", "w")], hits=6)
    server.ask("s", [("k", "w")], hits=7)
    assert server.stat(base + "over_limit") == 5
    assert server.stat(base + "near_limit") == 4
    assert server.stat(base + "within_limit") == 16


def test_stop_cache_key_increment_when_overlimit_spares_other_quotas(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With the switch on, a blocked request increments only its over-limit descriptors."""
    config_dir.write(
        "s.yaml",
        """
domain: s
descriptors:
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: broad
    rate_limit: {unit: hour, requests_per_unit: 3}
""",
    )
    for flag, broad_left in ((True, 2), (False, 0)):
        server = make_server(stop_cache_key_increment_when_overlimit=flag)
        tag = str(flag)
        server.ask("s", [("tight", tag)], [("broad", tag)])
        server.ask("s", [("tight", tag)], [("broad", tag)])
        server.ask("s", [("tight", tag)], [("broad", tag)])
        r = server.ask("s", descriptor([("broad", tag)], hits=0))
        assert r.statuses[0].limit_remaining == broad_left
        server.stop()


def test_zero_requests_per_unit_blocks_everything(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """requests_per_unit: 0 is legal and blocks every hit."""
    config_dir.write(
        "z.yaml",
        "domain: z\ndescriptors:\n  - key: k\n    rate_limit: "
        "{unit: second, requests_per_unit: 0}\n",
    )
    server = make_server()
    assert codes(server.ask("z", [("k", "v")])) == ["OVER_LIMIT"]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (rls_pb2.RateLimitRequest(domain="", descriptors=[descriptor([("k", "v")])]), "domain"),
        (rls_pb2.RateLimitRequest(domain="d"), "descriptors"),
        (
            rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "v"), ("", "x")])]),
            "descriptors[0].entries[1].key",
        ),
        (
            rls_pb2.RateLimitRequest(
                domain="d", descriptors=[descriptor([("k", "v")], limit=(5, 99))]
            ),
            "descriptors[0].limit.unit",
        ),
    ],
)
def test_malformed_requests_get_invalid_argument_naming_the_field(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    request_: rls_pb2.RateLimitRequest,
    field: str,
) -> None:
    """Each malformed request is INVALID_ARGUMENT with the field in the message; serving goes on."""
    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    with pytest.raises(grpc.RpcError) as info:
        server.stub.ShouldRateLimit(request_, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (info.value.details() or "")
    assert codes(server.ask("messaging", [("to_number", "1")])) == ["OK"]


def test_grpc_health_service_reports_serving(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """grpc.health.v1 answers SERVING for '' and 'ratelimit'."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    config_dir.write("m.yaml", MESSAGING)
    server = make_server()
    stub = health_pb2_grpc.HealthStub(server.channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for name in ("", "ratelimit"):
        deadline = time.monotonic() + 5
        status = None
        while time.monotonic() < deadline and status != serving:
            status = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
            time.sleep(0.02)
        assert status == serving
