"""Envoy's quota service divides each bucket once per tick, not once per report: reports are
answered at once with what their Envoy holds, and a tick re-divides only the buckets that
changed, pushing only the assignments that changed. Pure: no server, a manual clock."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from test_rlqs import FakeContext, assigned, holder_of, report, settle

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
    settle(shares)  # a division, then one more for the rises that waited for the falls
    assert calls == [200, 200]
    for s in streams:
        assert list(assigned(shares, s)) == ["route=r"]
    for _ in range(5):
        for i, s in enumerate(streams):
            shares.report(s, report("mesh", (route, 5 * (i % 7), 0, 5)))
            assert list(assigned(shares, s)) == ["route=r"]  # answered at once
    assert calls == [200, 200]
    settle(shares)
    assert 3 <= len(calls) <= 4
    settle(shares)  # nothing changed since the last one: no division
    assert 3 <= len(calls) <= 4


def _assigned_sum(shares: QuotaShares) -> float:
    """What every Envoy of the one bucket enforces now, those whose streams ended included."""
    [bucket] = shares.buckets.values()
    return sum(u.sent.per_second for u in bucket.users.values() if isinstance(u.sent, Bucket))


@pytest.mark.parametrize("seed", range(4))
def test_shares_stay_within_the_limit_and_follow_demand_as_envoys_come_and_go(
    seed: int,
) -> None:
    """Random demand steps, Envoys joining and leaving: after every tick, and after the rises
    that waited for its falls, the shares assigned (ended streams' included until their
    TTL) add up to at most the limit, and the connected Envoys' shares are the max-min fair
    division of what is left."""
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
        assert _assigned_sum(shares) <= LIMIT + 1e-6  # the falls sent, some rises waiting
        shares.raise_deferred()
        for stream in live:
            assigned(shares, stream)
        assert _assigned_sum(shares) <= LIMIT + 1e-6
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
    settle(shares)  # b's buckets already had an Envoy: b is assigned at the tick
    assert len(assigned(shares, b)) == 3
    shares.close(a1)
    assert shares.open("a3", "a").claimant == "a"


def test_after_a_start_demand_is_learnt_and_nothing_assigned_until_learning_ends() -> None:
    """Learning for 10 s after the start: the first Envoy back is not handed the whole
    limit (nor anything: it still enforces what it held), its report answered with nothing;
    at the end, every bucket is divided among every Envoy heard from."""
    clock = ManualClock()
    limits = Limits(learning_seconds=10)
    shares = QuotaShares(holder_of(CONFIG.replace("1000}", "100}")), clock, Stats(), limits=limits)
    route = {"route": "r"}
    first, fresh = shares.open("first"), shares.open("fresh")
    shares.report(first, report("mesh", (route, 50, 30, 5)))  # 16/s wanted
    shares.tick()
    shares.report(fresh, report("mesh", (route, 0, 0, 0)))
    clock.advance(9.9)
    shares.tick()
    assert assigned(shares, first) == assigned(shares, fresh) == {}
    assert shares.learning
    clock.advance(0.1)
    shares.tick()
    assert not shares.learning
    assert assigned(shares, first) == {"route=r": (16, 16, 1)}  # its demand
    assert assigned(shares, fresh) == {"route=r": (84, 84, 1)}  # not known: the rest


def test_a_stream_whose_envoy_goes_away_while_an_answer_is_being_written_is_released() -> None:
    """The Envoy ends its stream while ferryman is writing it an answer (the answers' side
    never resumes, as when gRPC cancels the write): the stream and its pairs are released
    as soon as the reports' side ends, not when the answers' side is collected."""
    asyncio.run(_gone_while_written())


async def _gone_while_written() -> None:
    shares = QuotaShares(holder_of(CONFIG), ManualClock(), Stats())
    servicer = RlqsServicer(shares, Access(lambda: None, Stats()))
    gone = asyncio.Event()

    async def reports() -> AsyncIterator[Any]:
        yield report("mesh", ({"route": "r"}, 1, 0, 0))
        await gone.wait()  # then the Envoy goes away: its side of the stream ends

    context: Any = FakeContext()
    answers: Any = servicer.StreamRateLimitQuotas(reports(), context)
    first = await anext(answers)  # the answers' side stays suspended at this answer
    assert [dict(a.bucket_id.bucket) for a in first.bucket_action] == [{"route": "r"}]
    assert len(shares.streams) == 1 and shares.pairs == 1
    gone.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not shares.streams
    await answers.aclose()


def test_rises_wait_for_the_falls_before_them_so_the_envoys_never_hold_more_than_the_limit() -> (
    None
):
    """The first Envoy holds the whole 100/s; nine more join: the tick sends the first its
    fall to 10/s and the nine nothing yet (the first still enforces 100/s until that fall
    is written); the rises follow once it has been, 10/s each."""
    shares = QuotaShares(holder_of(CONFIG.replace("1000}", "100}")), ManualClock(), Stats())
    route = {"route": "r"}
    first = shares.open("first")
    shares.report(first, report("mesh", (route, 0, 0, 0)))
    assert assigned(shares, first) == {"route=r": (100, 100, 1)}
    others = [shares.open(f"e{i}") for i in range(9)]
    for stream in others:
        shares.report(stream, report("mesh", (route, 0, 0, 0)))
    shares.tick()
    assert assigned(shares, first) == {"route=r": (10, 10, 1)}
    assert [assigned(shares, s) for s in others] == [{}] * 9
    shares.raise_deferred()
    assert [assigned(shares, s) for s in others] == [{"route=r": (10, 10, 1)}] * 9


def test_a_full_table_makes_room_among_the_idle_buckets_of_the_caller_holding_most() -> None:
    """Room for 4 buckets: a caller fills them, two of them idle (no request in their last
    report); another caller's new bucket takes an idle one's place, abandoned to its Envoy,
    and the caller's busy buckets stay; with no idle bucket left, a new one is refused."""
    limits = Limits(buckets=4)
    shares = QuotaShares(holder_of(CONFIG), ManualClock(), Stats(), limits=limits)
    hog, real = shares.open("hog", "anonymous@10.0.0.9"), shares.open("real", "spiffe://real")
    busy = [({"route": f"b{i}"}, 1, 0, 5) for i in range(2)]
    idle = [({"route": f"i{i}"}, 0, 0, 5) for i in range(2)]
    shares.report(hog, report("mesh", *busy, *idle))
    assert len(shares.buckets) == 4
    assigned(shares, hog)
    shares.report(real, report("mesh", ({"route": "mine"}, 1, 0, 0)))
    assert assigned(shares, real) == {"route=mine": (1000, 1000, 1)}
    assert assigned(shares, hog) == {"route=i0": "abandon"}
    shares.report(real, report("mesh", ({"route": "mine"}, 1, 0, 5), ({"route": "m2"}, 1, 0, 0)))
    assert "route=m2" in assigned(shares, real)
    shares.report(real, report("mesh", ({"route": "m3"}, 1, 0, 0)))
    assert "route=m3" not in assigned(shares, real)  # the hog's buckets are all busy
    assert sorted(dict(k[1])["route"] for k in shares.buckets) == ["b0", "b1", "m2", "mine"]
