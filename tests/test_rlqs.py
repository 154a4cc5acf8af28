"""Envoy's rate limit quota service in process: bucket ids walk the domain's tree, shares by
demand are pushed as token buckets, malformed reports are refused, streams are bounded."""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.rate_limit_quota.v3 import rlqs_pb2

from ferryman.access import Access
from ferryman.algorithms.leases.model import Kind
from ferryman.apis.rlqs import (
    Limits,
    QuotaShares,
    bucket_entries,
    resolve,
    resolve_in,
)
from ferryman.apis.rlqs_grpc import RlqsServicer
from ferryman.cli import main
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.config.reloader import ConfigHolder
from ferryman.errors import AccessDeniedError, RequestError, TooManyStreamsError
from ferryman.stats import Stats

from helpers.server import ConfigDir, Server, ServerFactory

CONFIG = """
domain: quota
descriptors:
  - key: tenant
    value: gold
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: tenant
    value: "t*"
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: held
    copies: {limit: 3}
"""

Usage = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage


def holder_of(text: str = CONFIG) -> ConfigHolder:
    holder = ConfigHolder()
    holder.swap(load_sources([("quota.yaml", text)]))
    return holder


def report(domain: str, *usages: tuple[dict[str, str], int, int, int]) -> Any:
    return rlqs_pb2.RateLimitQuotaUsageReports(
        domain=domain,
        bucket_quota_usages=[
            Usage(
                bucket_id=rlqs_pb2.BucketId(bucket=bucket),
                num_requests_allowed=allowed,
                num_requests_denied=denied,
                time_elapsed={"seconds": seconds},
            )
            for bucket, allowed, denied, seconds in usages
        ],
    )


#: Answers the streams' writers took (``settle``) that the test has not read yet, by
#: shares and stream.
WRITTEN: weakref.WeakKeyDictionary[QuotaShares, dict[int, list[Any]]] = weakref.WeakKeyDictionary()


def settle(shares: QuotaShares) -> None:
    """A tick, its answers taken by the streams' writers (the falls written), then the rises
    that waited for them."""
    shares.tick()
    for stream in shares.streams.values():
        response = shares.take(stream)
        if response is not None:
            WRITTEN.setdefault(shares, {}).setdefault(stream.id, []).append(response)
    shares.raise_deferred()


def assigned(shares: QuotaShares, stream: Any) -> dict[str, Any]:
    """The stream's assignments written or queued since the last look, by bucket (k=v,...),
    the latest of each, as Envoy would read them."""
    responses = [*WRITTEN.get(shares, {}).pop(stream.id, []), shares.take(stream)]
    out: dict[str, Any] = {}
    actions = [a for r in responses if r is not None for a in r.bucket_action]
    for action in actions:
        name = ",".join(f"{k}={v}" for k, v in sorted(action.bucket_id.bucket.items()))
        if action.HasField("abandon_action"):
            out[name] = "abandon"
            continue
        assignment = action.quota_assignment_action
        assert assignment.assignment_time_to_live.seconds >= 15
        strategy = assignment.rate_limit_strategy
        if strategy.HasField("token_bucket"):
            tb = strategy.token_bucket
            out[name] = (tb.max_tokens, tb.tokens_per_fill.value, tb.fill_interval.seconds)
        else:
            out[name] = strategy.BlanketRule.Name(strategy.blanket_rule)
    return out


def test_a_bucket_id_walks_the_tree_as_should_rate_limit_matches() -> None:
    """Exact before wildcard before the bare key; every entry of the id must be used; the
    rule reached decides the answer."""
    domain = load_sources([("quota.yaml", CONFIG)]).domains["quota"]
    assert bucket_entries(domain, {"tenant": "gold"}) == [("tenant", "gold")]
    assert bucket_entries(domain, {"path": "/a", "tenant": "x"}) == [
        ("tenant", "x"),
        ("path", "/a"),
    ]
    assert bucket_entries(domain, {"tenant": "gold", "other": "1"}) is None
    answers = {
        "gold": resolve(domain, {"tenant": "gold"}, False),
        "wild": resolve(domain, {"tenant": "tin"}, False),
        "zero": resolve(domain, {"tenant": "x", "path": "/"}, False),
        "free": resolve(domain, {"free": "1"}, False),
        "watch": resolve(domain, {"watch": "1"}, False),
        "held": resolve(domain, {"held": "1"}, False),
        "none": resolve(domain, {"nothing": "1"}, False),
    }
    assert {k: v.answer for k, v in answers.items()} == {
        "gold": "share",
        "wild": "share",
        "zero": "deny",
        "free": "unlimited",
        "watch": "shadow_mode",
        "held": "no_rate",
        "none": "unconfigured",
    }
    assert answers["gold"].rate is not None and answers["gold"].rate.per_second == 20.0
    assert answers["wild"].rate is not None and answers["wild"].rate.per_second == 1.0
    assert resolve(domain, {"tenant": "gold"}, True).answer == "shadow_mode"


def test_two_envoys_share_a_bucket_by_demand_and_the_shares_add_up() -> None:
    """30/s and 10/s against 20/s: 10 each; the other Envoy is pushed its change at the
    next tick, without waiting for its own report."""
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    a, b = shares.open("a"), shares.open("b")
    gold = {"tenant": "gold"}
    shares.report(a, report("quota", (gold, 0, 0, 0)))
    assert assigned(shares, a) == {"tenant=gold": (20, 20, 1)}
    shares.report(b, report("quota", (gold, 0, 0, 0)))
    assert assigned(shares, b) == {}  # a second Envoy waits for the tick
    settle(shares)
    # b's arrival halves a's share: pushed to a without waiting for a's report.
    assert assigned(shares, a) == {"tenant=gold": (10, 10, 1)}
    assert assigned(shares, b) == {"tenant=gold": (10, 10, 1)}
    for _ in range(3):
        shares.report(a, report("quota", (gold, 50, 100, 5)))  # 30/s
        shares.report(b, report("quota", (gold, 10, 10, 5)))  # 4/s
    # Reports are answered at once with what each holds; the division waits for the tick.
    assert assigned(shares, a) == {"tenant=gold": (10, 10, 1)}
    assert assigned(shares, b) == {"tenant=gold": (10, 10, 1)}
    settle(shares)
    assert assigned(shares, a) == {"tenant=gold": (16, 16, 1)}
    assert assigned(shares, b) == {"tenant=gold": (4, 4, 1)}
    status = shares.status()["buckets"][0]
    assert sum(e["share_per_second"] for e in status["envoys"]) == pytest.approx(20.0)
    assert {e["envoy"]: e["allowed"] for e in status["envoys"]} == {"a": 150, "b": 30}


def test_blanket_answers_and_the_counted_unlimited_traffic() -> None:
    """A limit of 0 denies all; unlimited, shadow mode, a kind with no rate and no rule allow
    all, and all but unlimited are counted."""
    stats = Stats()
    shares = QuotaShares(holder_of(), ManualClock(), stats)
    a = shares.open("a")
    ids = [{"tenant": "x", "path": "/"}, {"free": "1"}, {"watch": "1"}, {"held": "1"}, {"n": "1"}]
    shares.report(a, report("quota", *((i, 1, 0, 0) for i in ids)))
    assert assigned(shares, a) == {
        "path=/,tenant=x": "DENY_ALL",
        "free=1": "ALLOW_ALL",
        "watch=1": "ALLOW_ALL",
        "held=1": "ALLOW_ALL",
        "n=1": "ALLOW_ALL",
    }
    counted = ("deny", "unlimited", "shadow_mode", "no_rate", "unconfigured")
    assert [stats.get(f"ratelimit.service.rlqs.assigned.{w}") for w in counted] == [1] * 5


def test_a_config_change_reaches_every_envoy_without_a_report() -> None:
    """The limit raised to 40/s: each Envoy is pushed its new share on the next refresh."""
    holder = holder_of()
    shares = QuotaShares(holder, ManualClock(), Stats())
    a, b = shares.open("a"), shares.open("b")
    for s in (a, b):
        shares.report(s, report("quota", ({"tenant": "gold"}, 1, 0, 0)))
    assigned(shares, a), assigned(shares, b)
    settle(shares)
    assigned(shares, a), assigned(shares, b)
    holder.swap(load_sources([("quota.yaml", CONFIG.replace("20}", "40}"))]))
    settle(shares)
    assert assigned(shares, a) == assigned(shares, b) == {"tenant=gold": (20, 20, 1)}


def test_a_small_increase_is_not_pushed_but_a_decrease_is() -> None:
    """Envoy refills a changed bucket: a share that grows by less than 2% stays as sent (the
    reporter is answered with the same bucket), a smaller one is sent at once."""
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    a, b = shares.open("a"), shares.open("b")
    gold = {"tenant": "gold"}
    shares.report(a, report("quota", (gold, 150, 0, 5)))  # 30/s
    shares.report(b, report("quota", (gold, 25, 0, 5)))  # 5/s
    settle(shares)
    assigned(shares, a), assigned(shares, b)
    shares.report(b, report("quota", (gold, 25, 0, 5)))
    settle(shares)
    assert assigned(shares, a) == {}
    shares.report(b, report("quota", (gold, 50, 0, 5)))  # b's demand steps up to 10/s
    settle(shares)
    assert assigned(shares, a) == {"tenant=gold": (10, 10, 1)}  # a's share down at once


def test_a_closed_streams_share_is_kept_until_its_ttl_then_given_back() -> None:
    """An Envoy whose stream ends enforces its last bucket until the TTL: the others get its
    share only then, so that the sum never passes the limit."""
    clock = ManualClock()
    shares = QuotaShares(holder_of(), clock, Stats())
    a, b = shares.open("a"), shares.open("b")
    for s in (a, b):
        shares.report(s, report("quota", ({"tenant": "gold"}, 100, 0, 5)))
    settle(shares)
    assigned(shares, a)
    shares.close(b)
    settle(shares)
    assert assigned(shares, a) == {}
    shares.report(a, report("quota", ({"tenant": "gold"}, 100, 0, 5)))
    settle(shares)
    assert assigned(shares, a) == {"tenant=gold": (10, 10, 1)}
    clock.advance(14.9)
    settle(shares)
    assert assigned(shares, a) == {}
    clock.advance(0.1)
    settle(shares)
    assert assigned(shares, a) == {"tenant=gold": (20, 20, 1)}
    assert len(shares.buckets) == 1 and len(shares.streams) == 1


def test_an_idle_bucket_is_abandoned_a_busy_one_never() -> None:
    """After 12 reports without a request the bucket is abandoned; one request resets it."""
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    a = shares.open("a")
    gold, tin = {"tenant": "gold"}, {"tenant": "tin"}
    for _ in range(11):
        shares.report(a, report("quota", (gold, 0, 0, 5), (tin, 1, 0, 5)))
    assigned(shares, a)
    shares.report(a, report("quota", (gold, 0, 0, 5), (tin, 1, 0, 5)))
    assert assigned(shares, a) == {"tenant=gold": "abandon", "tenant=tin": (1, 1, 1)}
    assert [dict(b.key[1]) for b in shares.buckets.values()] == [tin]


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (report("", ({"k": "v"}, 1, 0, 0)), "domain"),
        (report("quota", ({}, 1, 0, 0)), "bucket_quota_usages[0].bucket_id"),
        (report("quota", ({"k": "v" * 300}, 1, 0, 0)), "bucket_quota_usages[0].bucket_id"),
        (
            report("quota", ({f"k{i}": "v" for i in range(17)}, 1, 0, 0)),
            "bucket_quota_usages[0].bucket_id",
        ),
        (
            report("quota", ({"a": "1"}, 0, 0, 0), ({"k": "v"}, 2**62, 1, 5)),
            "bucket_quota_usages[1]",
        ),
        (report("quota", ({"k": "v"}, 1, 0, -5)), "bucket_quota_usages[0].time_elapsed"),
        (report("quota", *(({"k": str(i)}, 1, 0, 0) for i in range(1001))), "bucket_quota_usages"),
    ],
)
def test_malformed_reports_are_refused_naming_the_field(message: Any, field: str) -> None:
    """Empty ids, long ids, absurd counts or times, too many buckets: INVALID_ARGUMENT with
    the field, nothing kept."""
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    stream = shares.open("a")
    with pytest.raises(RequestError) as refused:
        shares.report(stream, message)
    assert refused.value.field == field
    assert not shares.buckets


def test_a_stream_keeps_its_domain() -> None:
    """A report for another domain on the same stream is refused."""
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    stream = shares.open("a")
    shares.report(stream, report("quota", ({"k": "v"}, 1, 0, 0)))
    with pytest.raises(RequestError, match="domain"):
        shares.report(stream, report("other", ({"k": "v"}, 1, 0, 0)))


def test_streams_and_buckets_are_bounded() -> None:
    """A stream beyond the cap is refused; buckets beyond a stream's cap get no answer."""
    shares = QuotaShares(
        holder_of(), ManualClock(), Stats(), limits=Limits(streams=1, buckets_per_stream=2)
    )
    stream = shares.open("a")
    with pytest.raises(TooManyStreamsError):
        shares.open("b")
    shares.report(stream, report("quota", *(({"k": str(i)}, 1, 0, 0) for i in range(5))))
    assert len(assigned(shares, stream)) == 2 and len(shares.buckets) == 2


class FakeContext:
    """What the servicer reads of a gRPC context: the Envoy's metadata and peer."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("ferryman-envoy", "envoy-1"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}  # no client certificate: the anonymous caller


def test_the_servicer_answers_reports_on_the_stream() -> None:
    """Reports in, assignments out on the same stream; the stream's end frees its buckets;
    a malformed report ends the stream with the field's error."""
    asyncio.run(servicer_stream())


async def servicer_stream() -> None:
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    servicer = RlqsServicer(shares, Access(lambda: None, Stats()))
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    async def requests() -> AsyncIterator[Any]:
        while (message := await inbox.get()) is not None:
            yield message

    context: Any = FakeContext()
    responses = servicer.StreamRateLimitQuotas(requests(), context)
    await inbox.put(report("quota", ({"tenant": "gold"}, 1, 0, 0)))
    first = await anext(responses)
    assert [dict(a.bucket_id.bucket) for a in first.bucket_action] == [{"tenant": "gold"}]
    assert shares.status()["streams"] == [{"envoy": "envoy-1", "domain": "quota", "buckets": 1}]
    await inbox.put(report("quota", ({}, 1, 0, 0)))
    with pytest.raises(RequestError, match=r"bucket_quota_usages\[0\]\.bucket_id"):
        await anext(responses)
    assert not shares.streams
    assert [e["connected"] for e in shares.status()["buckets"][0]["envoys"]] == [False]


def test_a_policy_decides_which_domains_a_caller_may_report_on() -> None:
    """Under an access policy that grants the anonymous caller ``rlqs`` on another domain
    only, a report on this one ends the stream with the permission named."""
    policy = load_sources(
        [("access.yaml", "access:\n  - identities: [anonymous]\n    allow: {rlqs: [other]}\n")]
    )
    asyncio.run(refused_stream(Access(lambda: policy, Stats())))


async def refused_stream(access: Access) -> None:
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    servicer = RlqsServicer(shares, access)

    async def requests() -> AsyncIterator[Any]:
        yield report("quota", ({"tenant": "gold"}, 1, 0, 0))

    context: Any = FakeContext()
    with pytest.raises(AccessDeniedError, match="rlqs"):
        await anext(servicer.StreamRateLimitQuotas(requests(), context))
    assert not shares.buckets


def test_a_stream_that_never_reads_holds_one_action_per_bucket() -> None:
    """Pushes to a stream whose Envoy does not read are coalesced by bucket: bounded."""
    shares = QuotaShares(holder_of(), ManualClock(), Stats())
    quiet, busy = shares.open("quiet"), shares.open("busy")
    shares.report(quiet, report("quota", ({"tenant": "gold"}, 1, 0, 0)))
    for n in range(200):
        shares.report(busy, report("quota", ({"tenant": "gold"}, 5 * (n % 40), 0, 5)))
    assert len(quiet.pending) == 1


STREAM = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"


def metrics(server: Server) -> list[str]:
    port = server.service.prometheus_port
    assert port is not None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", server.settings.prometheus_path)
        return conn.getresponse().read().decode().splitlines()
    finally:
        conn.close()


def test_the_grpc_port_serves_the_stream_and_the_debug_port_shows_it(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Over gRPC: a report is answered with the bucket's assignment; /rlqs, /rlqs/explain and
    the metrics show it; a malformed report ends the stream with INVALID_ARGUMENT naming the
    field."""
    config_dir.write("quota.yaml", CONFIG)
    server = make_server(use_prometheus=True, prometheus_addr="127.0.0.1:0")
    call = server.channel.stream_stream(
        STREAM,
        rlqs_pb2.RateLimitQuotaUsageReports.SerializeToString,
        rlqs_pb2.RateLimitQuotaResponse.FromString,
    )
    inbox: queue.Queue[Any] = queue.Queue()
    responses: Iterator[Any] = iter(
        call(iter(inbox.get, None), metadata=(("ferryman-envoy", "edge-1"),), timeout=10)
    )
    inbox.put(report("quota", ({"tenant": "gold"}, 1, 0, 0)))
    first = next(responses)
    assert first.bucket_action[0].quota_assignment_action.rate_limit_strategy.HasField(
        "token_bucket"
    )
    status, body = server.http("GET", "/rlqs", debug=True)
    assert status == 200
    assert json.loads(body)["streams"] == [{"envoy": "edge-1", "domain": "quota", "buckets": 1}]
    status, body = server.http("GET", "/rlqs/explain?domain=quota&bucket=tenant=gold", debug=True)
    explained = json.loads(body)
    assert (explained["answer"], explained["rate_per_second"]) == ("share", 20.0)
    assert [e["envoy"] for e in explained["envoys"]] == ["edge-1"]
    lines = set(metrics(server))
    assert "ratelimit_service_rlqs_reports 1" in lines
    assert 'ratelimit_service_rlqs_assignments{answer="share"} 1' in lines
    assert 'ratelimit_service_rlqs_open{what="streams"} 1' in lines
    inbox.put(report("quota", ({}, 1, 0, 0)))
    with pytest.raises(grpc.RpcError) as ended:
        next(responses)
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bucket_quota_usages[0].bucket_id" in str(ended.value.details())
    inbox.put(None)


def test_explain_names_the_rule_a_bucket_id_reaches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ferryman explain --bucket`` walks the id (any order) and says what Envoys get;
    an id that reaches no rule exits 1."""
    (tmp_path / "quota.yaml").write_text(CONFIG)
    base = ["explain", "--config", str(tmp_path), "--domain", "quota"]
    assert main([*base, "--bucket", "path=/a,tenant=x"]) == 0
    out = capsys.readouterr().out
    assert "walk: tenant=x -> path=/a" in out and "DENY_ALL" in out
    assert main([*base, "--bucket", "nothing=1", "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["answer"] == "unconfigured"


def test_a_resources_template_names_how_a_bucket_is_divided() -> None:
    """A template whose glob starts rlqs/ names the division (PROPORTIONAL_SHARE here); a
    catch-all glob or a division that does not bound the sum (STATIC) is not taken."""
    resources = """
resources:
  - identifier_glob: "rlqs/quota/tenant=g*"
    capacity: 1
    algorithm: {kind: PROPORTIONAL_SHARE, lease_length: 10, refresh_interval: 2}
  - identifier_glob: "rlqs/quota/tenant=t*"
    capacity: 1
    algorithm: {kind: STATIC, lease_length: 10, refresh_interval: 2}
  - identifier_glob: "*"
    capacity: 1
    algorithm: {kind: NO_ALGORITHM, lease_length: 10, refresh_interval: 2}
"""
    config = load_sources([("quota.yaml", CONFIG), ("resources.yaml", resources)])
    kinds = [resolve_in(config, "quota", {"tenant": t}, False).kind for t in ("gold", "tin", "x")]
    assert kinds == [Kind.PROPORTIONAL_SHARE, Kind.FAIR_SHARE, Kind.FAIR_SHARE]
    holder = ConfigHolder()
    holder.swap(config)
    shares = QuotaShares(holder, ManualClock(), Stats())
    shares.report(shares.open("a"), report("quota", ({"tenant": "gold"}, 1, 0, 0)))
    assert shares.status()["buckets"][0]["algorithm"] == "PROPORTIONAL_SHARE"
