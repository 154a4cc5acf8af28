"""The console's data: the bounded sampler, the top-K, and the debug port's JSON endpoints."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from importlib import resources
from typing import Any

import pytest

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2
from ferryman.algorithms.token_bucket.memory import MemoryNodeBuckets, MemoryTokenBucketStore
from ferryman.algorithms.token_bucket.model import BucketRef, BucketSpec, Recent
from ferryman.apis.console import Console
from ferryman.apis.console.buckets import BucketTable
from ferryman.apis.console.sampler import LatencyRecorder, Sampler, SpaceSaving
from ferryman.clock import ManualClock
from ferryman.stats import CALL, Stats

from helpers.capacity import resources_yaml
from helpers.server import (
    EPOCH,
    MIXED,
    MIXED_REQUEST,
    ConfigDir,
    Server,
    ServerFactory,
    quota_stub,
    wait_for,
)
from helpers.stores import on_stores

CONFIG = """
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: bulk
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    burst_tiers:
      - {limit: 2, window: 1s, active: 1h}
      - {limit: 10, window: 1s, active: 5s, cooldown: 15s}
"""


def get_json(server: Server, path: str) -> tuple[int, Any]:
    status, body = server.http("GET", path, debug=True)
    return status, json.loads(body)


def sample(server: Server) -> dict[str, Any] | None:
    """Take a sample now, on the server's loop (as the background task would)."""

    async def take() -> dict[str, Any] | None:
        return server.service.console.sampler.sample()

    return server.run(take())


def test_space_saving_keeps_the_heavy_keys_in_bounded_space() -> None:
    """A stream of many light keys and a few heavy ones: the table never grows past its
    capacity and ranks the heavy keys first, their counts bounding their true weight."""
    top = SpaceSaving(8)
    for i in range(1000):
        top.offer(f"light{i}", 1)
        if i % 4 == 0:
            top.offer("heavy", 5)
        if i % 10 == 0:
            top.offer("medium", 5)
    assert len(top) == 8
    ranked = top.top(2)
    assert [key for key, _, _ in ranked] == ["heavy", "medium"]
    for key, count, error in ranked:
        true = 1250 if key == "heavy" else 500
        assert count - error <= true <= count


def test_space_saving_decay_follows_what_is_heavy_now() -> None:
    """With decay, a key that stopped sinking below one that is still arriving, then fades."""
    top = SpaceSaving(4, decay=0.5)
    top.offer("old", 100)
    for _ in range(6):
        top.age()
        top.offer("new", 10)
    assert [key for key, _, _ in top.top(2)] == ["new", "old"]
    for _ in range(20):
        top.age()
        top.offer("new", 1)
    assert [key for key, _, _ in top.top(2)] == ["new"]


def test_latency_recorder_reports_mean_p99_and_failures_per_read() -> None:
    """Each take() covers the calls since the previous one, failures counted, in ms."""
    recorder = LatencyRecorder()
    for _ in range(99):
        recorder.record(0.001)
    recorder.record(0.2, failed=True)
    taken = recorder.take()
    assert taken["calls"] == 100 and taken["errors"] == 1
    assert taken["mean_ms"] == pytest.approx((99 * 1 + 200) / 100)
    assert taken["p99_ms"] == pytest.approx(1.0)
    assert taken["max_ms"] == pytest.approx(200)
    assert recorder.take()["calls"] == 0


def test_latency_recorder_times_a_call_and_counts_a_failing_one() -> None:
    """``around`` times the call, hands its result on, and a raising call counts as failed."""
    recorder = LatencyRecorder()

    def timed(_kind: str, _items: int, call: Awaitable[int]) -> Awaitable[int]:
        return recorder.around(call)

    async def ok() -> int:
        return 7

    async def broken() -> int:
        raise RuntimeError("down")

    async def run() -> None:
        assert await timed("fixed_window", 1, ok()) == 7
        with pytest.raises(RuntimeError):
            await timed("fixed_window", 1, broken())

    asyncio.run(run())
    taken = recorder.take()
    assert taken["calls"] == 2 and taken["errors"] == 1


def test_sampler_turns_counter_deltas_into_rates_in_a_bounded_ring() -> None:
    """Samples are per-second rates of what changed since the previous reading; the ring
    keeps span / interval samples and drops the oldest."""
    now = [1000.0]
    stats = Stats()
    sampler = Sampler(
        stats, LatencyRecorder(), lambda: {"sessions": 1}, interval=2, span=10, wall=lambda: now[0]
    )
    assert sampler.sample() is None  # the baseline
    stats.rule("web.user", "total_hits", 10, ("web", "user"))
    stats.rule("web.user", "over_limit", 4, ("web", "user"))
    stats.rule("web.bulk", "total_hits", 6, ("web", "bulk"))
    stats.rule("web.bulk", "over_limit", 2, ("web", "bulk"))
    stats.rule("web.bulk", "shadow_mode", 2, ("web", "bulk"))
    stats.rule("web.tenant", "tier_hits", 4, ("web", "tenant"), (("tier", "2"),))
    stats.rule("web.tenant", "burst", 1, ("web", "tenant"))
    stats.inc(f"{CALL}.redis_error", 2)
    now[0] += 2
    got = sampler.sample()
    assert got is not None
    assert got["decisions"] == 8 and got["ok"] == 5 and got["over_limit"] == 2
    assert got["shadow"] == 1
    assert got["domains"] == {"web": 8}
    assert got["rules"] == {"web: user": 5, "web: bulk": 3}
    assert got["tiers"] == {"web: tenant": {"2": 2}}
    assert got["bursts"] == {"web: tenant": 1}
    assert got["errors"]["backend"] == 1
    assert got["holds"] == {"sessions": 1}
    assert [key for key, _, _ in sampler.top.top(2)] == ["web: user", "web: bulk"]
    for _ in range(8):
        now[0] += 2
        quiet = sampler.sample()
        assert quiet is not None and quiet["decisions"] == 0
    assert len(sampler.samples) == 5
    assert sampler.since(now[0] - 1) == [sampler.samples[-1]]


def test_a_sample_keeps_only_the_busiest_series_and_the_top_k_its_capacity() -> None:
    """However many domains, rules, burst nodes and over-limit series change, a sample keeps
    the 10 busiest of each and the top-K no more than its capacity."""
    now = [0.0]
    stats = Stats()
    sampler = Sampler(stats, LatencyRecorder(), interval=1, top_capacity=16, wall=lambda: now[0])
    sampler.sample()
    for i in range(200):
        path = (f"d{i}", "k")
        stats.rule(f"d{i}.k", "total_hits", i + 1, path)
        stats.rule(f"d{i}.k", "over_limit", i + 1, path)
        stats.rule(f"d{i}.k", "tier_hits", i + 1, path, (("tier", "1"),))
        stats.rule(f"d{i}.k", "burst", i + 1, path)
    now[0] += 1
    got = sampler.sample()
    assert got is not None
    busiest = {f"d{i}" for i in range(190, 200)}
    assert set(got["domains"]) == busiest
    assert set(got["rules"]) == {f"{d}: k" for d in busiest}
    assert set(got["tiers"]) == set(got["bursts"]) == {f"{d}: k" for d in busiest}
    assert got["decisions"] == sum(range(1, 201))
    assert len(sampler.top) == 16
    assert [key for key, _, _ in sampler.top.top(1)] == ["d199: k"]


def test_the_page_and_its_files_are_served_from_the_package(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/ is the console page; the script and stylesheet it names are package data; the
    former index stays readable at /help."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    status, page = server.http("GET", "/", debug=True)
    assert status == 200 and b"<title>ferryman console</title>" in page
    for path, name in (
        ("/console/console.js", "console.js"),
        ("/console/console.css", "console.css"),
    ):
        assert path.encode() in page
        shipped = resources.files("ferryman.apis.console").joinpath(name).read_bytes()
        assert server.http("GET", path, debug=True) == (200, shipped)
    # Offline: nothing is fetched from another host.
    assert b"http://" not in page.replace(b"http://www.w3.org", b"")
    assert b"https://" not in page
    status, text = server.http("GET", "/help", debug=True)
    assert status == 200
    assert b"/rlconfig: the limits in force" in text and b"/explain?domain=D" in text


def test_config_endpoint_draws_domains_as_trees_and_keeps_the_last_error(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/console/config: every node with its kind and numbers; a rejected reload shows its
    error (the good configuration staying in force) until a load succeeds."""
    config_dir.write("web.yaml", CONFIG)
    config_dir.write("mx.yaml", MIXED)
    server = make_server()
    status, cfg = get_json(server, "/console/config")
    assert status == 200
    assert cfg["version"] == 1 and cfg["last_error"] is None and cfg["loaded_at"]
    web = {d["name"]: d for d in cfg["domains"]}["web"]
    nodes = {n["key"]: n for n in web["nodes"]}
    assert nodes["user"]["kind"] == "fixed_window"
    assert nodes["user"]["numbers"] == "fixed window 2 per minute"
    assert nodes["bulk"]["shadow_mode"] is True
    assert nodes["tenant"]["kind"] == "burst_tiers"
    assert [t["cooldown"] for t in nodes["tenant"]["tiers"]] == [0, 15]
    kinds = {n["key"]: n["kind"] for d in cfg["domains"] for n in d["nodes"] if d["name"] == "mx"}
    assert kinds == {"fixed": "fixed_window", "tiers": "burst_tiers", "seats": "copies"}

    config_dir.write("web.yaml", CONFIG + "  - key: broken\n    rate_limit: {unit: fortnight}\n")
    wait_for("the reload error", lambda: get_json(server, "/console/config")[1]["last_error"])
    status, cfg = get_json(server, "/console/config")
    assert "fortnight" in cfg["last_error"] and cfg["version"] == 1
    assert {d["name"] for d in cfg["domains"]} == {"web", "mx"}
    config_dir.write("web.yaml", CONFIG)
    wait_for("a good reload", lambda: get_json(server, "/console/config")[1]["version"] == 2)
    assert get_json(server, "/console/config")[1]["last_error"] is None


def test_data_endpoint_reports_traffic_of_every_kind(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/console/data after traffic: decisions by domain and rule, outcomes, backend calls,
    burst tiers, the top over-limit series; ``since`` returns only newer samples."""
    config_dir.write("web.yaml", CONFIG)
    config_dir.write("mx.yaml", MIXED)
    server = make_server()
    # Only the sample taken below: a background one (every 3 s of real time) taken while a
    # slow machine sends the traffic would split it between two samples.
    server.run(server.service.console.sampler.stop())
    for _ in range(5):
        server.ask("web", [("user", "alice")])
        server.ask("web", [("bulk", "b")])
        server.ask("web", [("tenant", "t")])
    server.ask("mx", *MIXED_REQUEST)
    # A sample gives rates per second and its span in whole milliseconds: over a span of a
    # few milliseconds that rounding alone could move a count by one.
    time.sleep(0.25)
    taken = sample(server)
    assert taken is not None
    status, data = get_json(server, "/console/data?since=0")
    assert status == 200
    last = data["samples"][-1]
    assert last == taken
    dt = last["dt"]
    assert round(last["decisions"] * dt) == 18
    assert round(last["over_limit"] * dt) == 3  # user: 5 asked, 2 allowed
    assert round(last["shadow"] * dt) == 4  # bulk: over the limit but let through
    assert set(last["domains"]) == {"web", "mx"}
    assert {"web: user", "web: bulk", "web: tenant", "mx: seats"} <= set(last["rules"])
    assert last["backend"]["calls"] > 0 and last["backend"]["mean_ms"] > 0
    assert set(last["tiers"]["web: tenant"]) == {"1", "2"}
    assert last["bursts"] == {"web: tenant": 2, "mx: tiers": 1}  # entering tier 1 is one
    assert [row["series"] for row in data["top_over_limit"]][:2] == ["web: bulk", "web: user"]
    assert data["holds"]["sessions"] == 0 and data["holds"]["transfers"]["staged"] == 0
    assert get_json(server, f"/console/data?since={last['t']}")[1]["samples"] == []
    status, error = get_json(server, "/console/data?since=soon")
    assert status == 400 and "since" in error["error"]


def test_panels_are_listed_and_served_as_tables(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/console/panels lists the registered panels; /console/panel?id= serves one as a
    table, and a panel added at run time appears in the list."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()
    assert get_json(server, "/console/panels")[1] == {
        "panels": [
            {"id": "sessions", "title": "Sessions"},
            {"id": "capacity", "title": "Capacity leases"},
            {"id": "leases", "title": "Capacity clients"},
            {"id": "buckets", "title": "Token buckets"},
            {"id": "rlqs", "title": "Envoy quota buckets"},
            {"id": "domains", "title": "Domain switches and unconfigured traffic"},
        ]
    }
    status, quota = get_json(server, "/console/panel?id=rlqs")
    assert status == 200 and quota["columns"][:3] == ["bucket", "envoy", "answer"]
    status, leases = get_json(server, "/console/panel?id=capacity")
    assert status == 200 and leases["columns"][0] == "resource"
    assert leases["rows"] == [] and leases["note"] == "this server: master"
    status, panel = get_json(server, "/console/panel?id=sessions")
    assert status == 200 and panel["columns"] == ["session", "client", "copies held"]
    assert panel["rows"] == [] and panel["note"] == "0 open"
    console: Console = server.service.console
    console.add_panel("extra", "Extra", lambda: {"columns": ["client"], "rows": [["a"]]})
    assert [p["id"] for p in get_json(server, "/console/panels")[1]["panels"]] == [
        "sessions",
        "capacity",
        "leases",
        "buckets",
        "rlqs",
        "domains",
        "extra",
    ]
    assert get_json(server, "/console/panel?id=extra")[1]["rows"] == [["a"]]
    status, missing = get_json(server, "/console/panel?id=nope")
    listed = "sessions, capacity, leases, buckets, rlqs, domains, extra"
    assert status == 404 and listed in missing["error"]


@on_stores("memory", "redis")
def test_tenant_endpoint_reads_a_tenants_tiers_without_counting(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """/console/tenant: the current tier, each tier's phase, hits in its window and when its
    active period and cooldown end, the same on both backends; reading counts nothing."""
    config_dir.write("web.yaml", CONFIG)
    server = make_server()

    def tenant(descriptor: str = "tenant=t") -> dict[str, Any]:
        status, body = get_json(server, f"/console/tenant?domain=web&descriptor={descriptor}")
        assert status == 200, body
        return dict(body)

    idle = tenant()
    assert idle["current"] == 0 and [t["phase"] for t in idle["tiers"]] == ["inactive"] * 2
    for _ in range(3):
        server.ask("web", [("tenant", "t")])
    seen = tenant()
    assert seen["current"] == 2 and seen["last_second"] == 3
    assert [(t["phase"], t["hits"]) for t in seen["tiers"]] == [("active", 2), ("active", 1)]
    assert seen["tiers"][1]["active_until"] == pytest.approx(EPOCH + 5)
    assert seen["tiers"][1]["cooldown_until"] == pytest.approx(EPOCH + 20)
    assert tenant() == seen  # nothing was counted by reading
    clock.advance(6)
    later = tenant()
    assert later["current"] == 1 and later["last_second"] == 0
    assert [(t["phase"], t["hits"]) for t in later["tiers"]] == [("active", 0), ("cooldown", 0)]
    clock.advance(15)
    assert tenant()["tiers"][1]["phase"] == "inactive"

    status, body = get_json(server, "/console/tenant?domain=web&descriptor=user=u")
    assert status == 400 and "burst" in body["error"]
    status, body = get_json(server, "/console/tenant?domain=nope&descriptor=tenant=t")
    assert status == 404
    assert get_json(server, "/console/tenant?domain=web")[0] == 400


QUOTA = """
namespaces:
  pay:
    buckets:
      card: {size: 10, fill_rate: 10, max_debt_millis: 2000}
  ips:
    dynamic_bucket_template: {size: 2, fill_rate: 1, max_idle_millis: 60000}
"""
SMOOTH = """
domain: smooth
descriptors:
  - key: user
    token_bucket: {size: 3, fill_rate: 2}
"""


def test_recent_buckets_are_bounded_and_the_table_shows_the_emptiest() -> None:
    """The stores remember the last buckets taken from (at most their limit); the table
    reads them without taking anything, the emptiest first, at most ``top`` rows; a dynamic
    bucket removed while idle leaves it."""
    recent: Recent[str] = Recent(3)
    for key in "abcde":
        recent.add(key, BucketSpec())
    recent.add("c", BucketSpec())
    assert [k for k, _ in recent.items()] == ["d", "e", "c"]

    clock = ManualClock(EPOCH)
    quota, nodes = MemoryTokenBucketStore(clock), MemoryNodeBuckets(clock)
    table = BucketTable(quota, nodes, clock, top=2)
    full, debt = BucketSpec(size=4, fill_rate=2), BucketSpec(size=2, fill_rate=1)
    idle = BucketSpec(size=5, fill_rate=1, max_idle_millis=1000)
    quota.take_at(BucketRef("ns", "full"), full, 1, 0, int(EPOCH * 1e6))
    quota.take_at(BucketRef("ns", "gone", True), idle, 1, 0, int(EPOCH * 1e6))
    nodes.take_at("ferryman_bucket_{d.k|v}", debt, 3, 2000, int(EPOCH * 1e6))
    clock.advance(0.5)
    answer = asyncio.run(table.read())
    assert answer["rows"] == [
        ["d.k|v", "descriptor", -0.5, 2, 1.0, 500],  # 2 taken, 1 borrowed, half repaid
        ["ns/gone", "quota, dynamic", 4.5, 5, 1.0, 0],
    ]
    assert answer["note"].startswith("3 bucket(s) taken from lately on this server, the 2 ")
    assert len(quota.recent) == 2 and len(nodes.recent) == 1  # reading took nothing
    clock.advance(2)
    quota.take_at(BucketRef("ns", "other", True), idle, 1, 0, int(clock.now() * 1e6))
    rows = asyncio.run(BucketTable(quota, nodes, clock, top=9).read())["rows"]
    assert [r[0] for r in rows] == ["d.k|v", "ns/other", "ns/full"]  # "gone" was removed


@on_stores("memory", "redis")
def test_bucket_panel_shows_quota_and_node_buckets_with_their_debt(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """After quota Allow calls and token-bucket descriptors, the panel lists each bucket
    with its tokens now (negative in debt), capacity, fill rate and the wait its debt
    makes, read from the store the server uses, the same on memory and Redis."""
    config_dir.write("quota.yaml", QUOTA)
    config_dir.write("smooth.yaml", SMOOTH)
    server = make_server()
    stub = quota_stub(server.channel)
    for ns, bucket, tokens in (("pay", "card", 10), ("pay", "card", 5), ("ips", "ip_1", 1)):
        request = quota_service_pb2.AllowRequest(
            namespace=ns, bucket_name=bucket, tokens_requested=tokens
        )
        assert stub.Allow(request, timeout=10).status == 0
    for _ in range(2):
        server.ask("smooth", [("user", "alice")])
    status, panel = get_json(server, "/console/panel?id=buckets")
    assert status == 200 and panel["title"] == "Token buckets"
    assert panel["columns"] == [
        "bucket",
        "kind",
        "tokens",
        "capacity",
        "fill rate /s",
        "debt wait ms",
    ]
    assert panel["rows"] == [
        ["pay/card", "quota", -5.0, 10, 10.0, 500],
        ["smooth.user|alice", "descriptor", 1.0, 3, 2.0, 0],
        ["ips/ip_1", "quota, dynamic", 1.0, 2, 1.0, 0],
    ]
    clock.advance(0.25)
    rows = get_json(server, "/console/panel?id=buckets")[1]["rows"]
    assert rows[0] == ["pay/card", "quota", -2.5, 10, 10.0, 250]
    assert rows[1][2] == 1.5


def test_capacity_clients_panel_lists_each_clients_lease(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Clients holding capacity leases: each client's resource, priority, wants, lease and
    expiry, the biggest leases first."""
    config_dir.write("resources.yaml", resources_yaml(capacity=120, lease=30))
    server = make_server()
    stub = doorman_pb2_grpc.CapacityStub(server.channel)  # type: ignore[no-untyped-call]
    for client, resource, wants in (("a", "fair", 100), ("b", "fair", 10), ("c", "prop", 5)):
        request = doorman_pb2.GetCapacityRequest(client_id=client)
        request.resource.add(resource_id=resource, priority=1, wants=wants)
        stub.GetCapacity(request, timeout=10)
    status, panel = get_json(server, "/console/panel?id=leases")
    assert status == 200
    assert panel["columns"] == ["resource", "client", "priority", "wants", "has", "expires in s"]
    assert panel["rows"] == [
        ["fair", "a", 1, 100, 100, 30],
        ["fair", "b", 1, 10, 10, 30],
        ["prop", "c", 1, 5, 5, 30],
    ]
    assert panel["note"] == "3 lease(s)"
