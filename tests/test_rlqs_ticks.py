"""Envoy's quota service divides each bucket once per tick, not once per report: reports are
answered at once with what their Envoy holds, and a tick re-divides only the buckets that
changed, pushing only the assignments that changed. Pure: no server, a manual clock."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from test_rlqs import STREAM, FakeContext, assigned, holder_of, report

from ferryman.access import Access
from ferryman.algorithms.leases.algorithms import allocate
from ferryman.algorithms.leases.model import Demand, Kind
from ferryman.apis import rlqs_shares
from ferryman.apis.rlqs import Limits, QuotaShares
from ferryman.apis.rlqs_grpc import RlqsServicer
from ferryman.apis.rlqs_shares import Bucket
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.errors import AccessDeniedError, TooManyStreamsError
from ferryman.stats import Stats

from helpers.server import ConfigDir, ServerFactory

LIMIT = 1000.0
CONFIG = """
domain: mesh
descriptors:
  - key: route
    rate_limit: {unit: second, requests_per_unit: 1000}
"""


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real: Callable[..., Any] = rlqs_shares.split

    def split(kind: Kind, per_second: float, demands: Any) -> Any:
        calls.append(len(demands))
        return real(kind, per_second, demands)

    monkeypatch.setattr("ferryman.apis.rlqs_shares.split", split)
    return calls


def test_reports_only_record_demand_and_a_tick_divides_each_bucket_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 Envoys report one bucket 5 times each: no division on a report (but the bucket's
    first Envoy), one per tick for the bucket, and every report answered with what its
    Envoy holds."""
    shares = QuotaShares(holder_of(CONFIG), ManualClock(), Stats())
    streams = [shares.open(f"envoy-{i}") for i in range(200)]
    route = {"route": "r"}
    for s in streams:
        shares.report(s, report("mesh", (route, 0, 0, 0)))
    calls = _counting(monkeypatch)
    shares.tick()
    assert calls == [200]
    for _ in range(5):
        for i, s in enumerate(streams):
            shares.report(s, report("mesh", (route, 5 * (i % 7), 0, 5)))
            assert list(assigned(shares, s)) == ["route=r"]  # answered at once
    assert calls == [200]
    shares.tick()
    shares.tick()  # nothing changed since the last one: no division
    assert calls == [200, 200]


def _assigned_sum(shares: QuotaShares) -> float:
    """What every Envoy of the one bucket enforces now, those whose streams ended included."""
    [bucket] = shares.buckets.values()
    return sum(u.sent.per_second for u in bucket.users.values() if isinstance(u.sent, Bucket))


@pytest.mark.parametrize("seed", range(4))
def test_shares_stay_within_the_limit_and_follow_demand_as_envoys_come_and_go(
    seed: int,
) -> None:
    """Random demand steps, Envoys joining and leaving: after every tick the shares assigned
    (ended streams' included until their TTL) add up to at most the limit plus 2%, and the
    connected Envoys' shares are the max-min fair division of what is left."""
    rng = random.Random(seed)
    clock = ManualClock()
    shares = QuotaShares(holder_of(CONFIG), clock, Stats())
    route = {"route": "r"}
    live = {shares.open(f"e{i}"): rng.uniform(0, 40) for i in range(60)}
    for _ in range(30):
        for stream, demand in list(live.items()):
            if rng.random() < 0.05:
                shares.close(stream)
                del live[stream]
                continue
            shares.report(stream, report("mesh", (route, round(demand * 5), 0, 5)))
        for _ in range(rng.randrange(4)):
            live[shares.open(f"n{rng.random()}")] = rng.uniform(0, 40)
        for stream in rng.sample(list(live), k=min(10, len(live))):
            live[stream] = rng.choice((0.0, 2.0, 30.0, 200.0))
        clock.advance(1)
        shares.tick()
        for stream in live:
            shares.take(stream)
        assert _assigned_sum(shares) <= LIMIT * 1.02
    [bucket] = shares.buckets.values()
    users = {sid: u for sid, u in bucket.users.items() if not u.gone}
    reserved = sum(
        u.sent.per_second for u in bucket.users.values() if u.gone and isinstance(u.sent, Bucket)
    )
    wants = [Demand(LIMIT if u.meter.rate is None else u.meter.rate) for u in users.values()]
    fair = allocate(Kind.FAIR_SHARE, LIMIT - reserved, wants)
    spread = (LIMIT - reserved - sum(fair)) / len(fair)
    for user, expected in zip(users.values(), fair, strict=True):
        assert user.share == pytest.approx(expected + spread)


def test_a_stream_holds_no_place_before_its_first_report_is_allowed() -> None:
    """With room for one stream: callers the policy refuses, and streams that never report,
    leave that room to the Envoy that may report."""
    policy = load_sources(
        [("access.yaml", "access:\n  - identities: [anonymous]\n    allow: {rlqs: [mesh]}\n")]
    )
    asyncio.run(_one_place(Access(lambda: policy, Stats())))


async def _one_place(access: Access) -> None:
    shares = QuotaShares(holder_of(CONFIG), ManualClock(), Stats(), limits=Limits(streams=1))
    servicer = RlqsServicer(shares, access)
    context: Any = FakeContext()

    async def reports(domain: str) -> AsyncIterator[Any]:
        yield report(domain, ({"route": "r"}, 1, 0, 0))
        await asyncio.Event().wait()  # the Envoy keeps its stream open

    async def silent() -> AsyncIterator[Any]:
        await asyncio.Event().wait()
        yield None

    async def hold() -> None:
        await anext(servicer.StreamRateLimitQuotas(silent(), context))

    idle = asyncio.create_task(hold())
    for _ in range(3):
        with pytest.raises(AccessDeniedError):
            await anext(servicer.StreamRateLimitQuotas(reports("other"), context))
    await asyncio.sleep(0)
    assert not shares.streams
    allowed: Any = servicer.StreamRateLimitQuotas(reports("mesh"), context)
    first = await anext(allowed)
    assert [dict(a.bucket_id.bucket) for a in first.bucket_action] == [{"route": "r"}]
    with pytest.raises(TooManyStreamsError):
        await anext(servicer.StreamRateLimitQuotas(reports("mesh"), context))
    await allowed.aclose()
    idle.cancel()


MESH_ENVOYS = 300
MESH_CONFIG = """
domain: mesh
descriptors:
  - key: route
    rate_limit: {unit: second, requests_per_unit: 600}
"""


def test_a_mesh_of_streams_over_grpc_each_holds_its_share(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """300 Envoys over real gRPC, each reporting two of three shared buckets: every stream
    is accepted, every Envoy holds an assignment for each of its buckets, and the rates
    assigned per bucket add up to 95-102% of its limit."""
    config_dir.write("mesh.yaml", MESH_CONFIG)
    server = make_server(rlqs_tick=0.1)
    held = asyncio.run(_mesh(server.service.grpc_port))
    assert len(held) == MESH_ENVOYS
    per_bucket: dict[str, float] = {}
    for i, buckets in enumerate(held):
        assert sorted(buckets) == sorted(_routes_of(i))
        for route, rate in buckets.items():
            per_bucket[route] = per_bucket.get(route, 0.0) + rate
    assert set(per_bucket) == {"r0", "r1", "r2"}
    for route, total in per_bucket.items():
        assert 0.95 * 600 <= total <= 1.02 * 600, (route, total)


def _routes_of(i: int) -> list[str]:
    return [f"r{i % 3}", f"r{(i + 1) % 3}"]


async def _mesh(port: int) -> list[dict[str, float]]:
    """Every simulated Envoy's assignments (route: rate per second), read as they come,
    once each has reported twice (a 0 s first report, then 5 s of demand, twice) and the
    server has ticked on the new demand."""
    channels: list[Any] = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(10)]
    envoys = [_Envoy(channels[i % len(channels)], i) for i in range(MESH_ENVOYS)]
    try:
        await asyncio.gather(*(e.send(0, 0) for e in envoys))
        await asyncio.gather(*(e.holds_all.wait() for e in envoys))
        for _ in range(2):
            await asyncio.gather(*(e.send(10 + e.i % 5, 5) for e in envoys))
            await asyncio.sleep(0.5)  # several ticks: every bucket divided on the new demand
        return [dict(e.held) for e in envoys]
    finally:
        for e in envoys:
            e.call.cancel()
        await asyncio.gather(*(e.reader for e in envoys), return_exceptions=True)
        for channel in channels:
            await channel.close()


class _Envoy:
    """One simulated Envoy: a stream, its two routes and the latest assignment of each."""

    def __init__(self, channel: Any, i: int) -> None:
        self.i = i
        self.routes = _routes_of(i)
        self.held: dict[str, float] = {}
        self.holds_all = asyncio.Event()
        self.call: Any = channel.stream_stream(
            STREAM,
            rlqs_pb2.RateLimitQuotaUsageReports.SerializeToString,
            rlqs_pb2.RateLimitQuotaResponse.FromString,
        )(metadata=(("ferryman-envoy", f"envoy-{i}"),), timeout=60)
        self.reader = asyncio.create_task(self._read())

    async def send(self, hits: int, seconds: int) -> None:
        await self.call.write(
            report("mesh", *(({"route": r}, hits, 0, seconds) for r in self.routes))
        )

    async def _read(self) -> None:
        eof: Any = grpc.aio.EOF  # type: ignore[attr-defined]
        while (response := await self.call.read()) is not eof:
            for action in response.bucket_action:
                bucket = action.quota_assignment_action.rate_limit_strategy.token_bucket
                self.held[action.bucket_id.bucket["route"]] = (
                    bucket.tokens_per_fill.value / bucket.fill_interval.seconds
                )
            if set(self.held) == set(self.routes):
                self.holds_all.set()


def test_a_callers_streams_are_one_claimant_however_many_it_opens() -> None:
    """Against 100/s: one caller's 31 streams each claiming 10^9 requests are one claimant,
    so another caller's Envoy wanting 80/s keeps half the rate (not 100/32); the 31 split
    their half among themselves."""
    shares = QuotaShares(holder_of(CONFIG.replace("1000}", "100}")), ManualClock(), Stats())
    route = {"route": "r"}
    real = shares.open("real", "spiffe://mesh/real")
    hostile = [shares.open(f"h{i}", "anonymous@10.0.0.9") for i in range(31)]
    for _ in range(3):
        shares.report(real, report("mesh", (route, 400, 0, 5)))
        for stream in hostile:
            shares.report(stream, report("mesh", (route, 10**9, 0, 5)))
    shares.tick()
    [bucket] = shares.buckets.values()
    share = {u.envoy: u.share for u in bucket.users.values()}
    assert share["real"] == pytest.approx(50.0)
    assert sum(share[f"h{i}"] or 0 for i in range(31)) == pytest.approx(50.0)


def test_streams_and_pairs_are_capped_per_caller() -> None:
    """With caps per caller, a caller past its streams or pairs is refused; another caller
    still opens streams and gets its buckets assigned."""
    limits = Limits(streams_per_caller=2, pairs_per_caller=3)
    shares = QuotaShares(holder_of(CONFIG), ManualClock(), Stats(), limits=limits)
    a1, a2 = shares.open("a1", "a"), shares.open("a2", "a")
    with pytest.raises(TooManyStreamsError, match="per caller"):
        shares.open("a3", "a")
    b = shares.open("b", "b")
    shares.report(a1, report("mesh", *(({"route": str(i)}, 1, 0, 0) for i in range(2))))
    shares.report(a2, report("mesh", *(({"route": str(i)}, 1, 0, 0) for i in range(2, 4))))
    shares.report(b, report("mesh", *(({"route": str(i)}, 1, 0, 0) for i in range(3))))
    assert len(assigned(shares, a1)) + len(assigned(shares, a2)) == 3
    shares.tick()  # b's buckets already had an Envoy: b is assigned at the tick
    assert len(assigned(shares, b)) == 3
    shares.close(a1)
    assert shares.open("a3", "a").claimant == "a"


def test_after_a_restart_envoys_get_no_more_than_they_were_allowed_until_learning_ends() -> None:
    """Learning for 10 s after the start: the first Envoy back is not handed the whole
    limit but what its report says it let through (10/s of 100/s), an Envoy that has not
    reported time yet is assigned nothing; at the end, the usual division."""
    clock = ManualClock()
    limits = Limits(learning_seconds=10)
    shares = QuotaShares(holder_of(CONFIG.replace("1000}", "100}")), clock, Stats(), limits=limits)
    route = {"route": "r"}
    first, fresh = shares.open("first"), shares.open("fresh")
    shares.report(first, report("mesh", (route, 50, 30, 5)))  # 10/s allowed, 16/s wanted
    shares.report(fresh, report("mesh", (route, 0, 0, 0)))
    shares.tick()
    assert assigned(shares, first) == {"route=r": (10, 10, 1)}
    assert assigned(shares, fresh) == {}
    clock.advance(10)
    shares.tick()
    assert not shares.learning
    assert assigned(shares, first) == {"route=r": (16, 16, 1)}  # its demand
    assert assigned(shares, fresh) == {"route=r": (84, 84, 1)}  # not known: the rest
