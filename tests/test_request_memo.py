"""ShouldRateLimit remembers each distinct request's conversion and matches (by its serialized
bytes), and answers a request of plain fixed windows from counters compiled once: the answers
and stats are those of a request worked out afresh (whatever the engine's switches), the memory
is bounded in entries and in bytes, and a new configuration is matched anew."""

from __future__ import annotations

import asyncio
import functools
import random
from typing import Any

import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.apis.rls import SEEN_BYTES, RateLimitServicer
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.config.reloader import ConfigHolder
from ferryman.engine import EngineOptions, RateLimitEngine
from ferryman.engine.engine import PLANS
from ferryman.errors import BackendError
from ferryman.stats import Stats

from helpers.server import EPOCH, descriptor

CONFIG = """
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: route
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: vip
    value: gold
    rate_limit: {unlimited: true}
  - key: quiet
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: share
    quota_mode: true
    metadata: {team: payments}
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 10, name: big}
  - key: bigger
    rate_limit:
      unit: hour
      requests_per_unit: 20
      replaces: [{name: big}]
"""

#: Engine switches the compiled answers must agree with the fresh ones under.
OPTIONS = {
    "defaults": EngineOptions(),
    "stop-when-over": EngineOptions(stop_when_over=True, near_limit_ratio=0.5),
    "headers-metadata-shadow": EngineOptions(headers=True, dynamic_metadata=True, shadow_mode=True),
    "quota-mode": EngineOptions(quota_mode=True),
    # The local over-limit cache: nothing is compiled, everything is remembered.
    "local-cache": EngineOptions(local_cache_bytes=1 << 20),
}

Req = rls_pb2.RateLimitRequest
NONE: Any = None  # the servicer does not use its context


def servicer(
    config: str = CONFIG, options: EngineOptions | None = None
) -> tuple[RateLimitServicer, ConfigHolder, Stats, ManualClock]:
    clock = ManualClock(EPOCH)
    holder = ConfigHolder(config=load_sources([("d.yaml", config)]))
    stats = Stats()
    engine = RateLimitEngine(holder, MemoryBackend(clock), clock, stats, options)
    return RateLimitServicer(engine), holder, stats, clock


def call(s: RateLimitServicer, request: Req) -> rls_pb2.RateLimitResponse:
    return rls_pb2.RateLimitResponse.FromString(asyncio.run(s.ShouldRateLimit(request, NONE)))


def random_request(rng: random.Random) -> Req:
    def user() -> tuple[str, str]:
        return ("user", f"u{rng.randrange(4)}")

    def pick() -> Any:
        kind = rng.randrange(9)
        if kind == 0:
            return descriptor([("route", f"r{rng.randrange(2)}"), user()])
        if kind == 1:
            return descriptor([("vip", rng.choice(["gold", "silver"]))])
        if kind == 2:
            return descriptor([("nothing", "x")])
        if kind == 3:
            return descriptor([(rng.choice(["quiet", "share", "big", "bigger"]), "v")])
        if kind == 4:
            return descriptor([user()], hits=rng.choice([0, 1, 3]))
        if kind == 5:
            return descriptor([user()], hits=1, negative=True)
        if kind == 6:
            return descriptor([user()], limit=(2, rls_pb2.RateLimitResponse.RateLimit.MINUTE))
        return descriptor([user()])

    picked = [pick() for _ in range(rng.randrange(1, 4))]
    return Req(domain="d", descriptors=picked, hits_addend=rng.choice([0, 0, 1, 2]))


@pytest.mark.parametrize("name", OPTIONS)
def test_remembered_requests_are_answered_as_fresh_ones(name: str) -> None:
    """The same random stream (repeats included) through ShouldRateLimit, which remembers
    (and compiles the requests of plain windows), and through respond, which works each
    request out afresh: equal answers and stats, under each set of engine switches."""
    remembering, _, stats_a, clock_a = servicer(options=OPTIONS[name])
    fresh, _, stats_b, clock_b = servicer(options=OPTIONS[name])
    kept = remembering._engine._prepared
    rng = random.Random(7)
    repeats = compiled = 0
    for step in range(1500):
        request = random_request(rng)
        key = request.SerializeToString()
        repeats += key in kept
        got = call(remembering, request)
        compiled += kept[key].compiled is not None if key in kept else 0
        want = asyncio.run(fresh.respond(request))
        assert got == want, f"step {step}: {request}"
        if step % 40 == 39:
            clock_a.advance(rng.choice([1.0, 61.0]))
            clock_b.advance(clock_a.now() - clock_b.now())
    assert repeats > 300  # the stream did exercise remembered requests
    if OPTIONS[name].local_cache_bytes:
        assert compiled == 0
    else:
        assert 200 < compiled < 1400  # and compiled ones, beside others
    assert stats_a.snapshot() == stats_b.snapshot()


class _Failing:
    """Fixed-window counters in memory whose every fifth apply fails, as a backend outage."""

    # Every call goes through apply: a remote store, never answered at once.
    at_once = False

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls = 0

    async def apply(self, ops: Any, *, stop_when_over: bool) -> Any:
        self.calls += 1
        if self.calls % 5 == 0:
            raise BackendError("the counters are out of reach")
        return await self._inner.apply(ops, stop_when_over=stop_when_over)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _outcome(answer: Any) -> rls_pb2.RateLimitResponse | str:
    """The answer, or the message of the BackendError raised instead."""
    try:
        response: rls_pb2.RateLimitResponse = answer()
        return response
    except BackendError as error:
        return str(error)


@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
def test_remembered_requests_fail_as_fresh_ones(fail_open: bool) -> None:
    """A backend outage on every fifth counter call: the compiled and the fresh path answer
    it alike (OK and counted as degraded with FAIL_OPEN, the error without), with equal
    stats."""
    options = EngineOptions(fail_open=fail_open)
    remembering, _, stats_a, _ = servicer(options=options)
    fresh, _, stats_b, _ = servicer(options=options)
    stores = []
    for s in (remembering, fresh):
        backend: Any = s._engine._backend
        backend._stores["fixed_window"] = _Failing(backend.store("fixed_window"))
        stores.append(backend.store("fixed_window"))
    rng = random.Random(11)
    outcomes: dict[str, int] = {}
    for step in range(600):
        request = random_request(rng)
        answers = [
            _outcome(functools.partial(call, remembering, request)),
            _outcome(lambda r=request: asyncio.run(fresh.respond(r))),
        ]
        assert answers[0] == answers[1], f"step {step}: {request}"
        kind = "error" if isinstance(answers[0], str) else "answer"
        outcomes[kind] = outcomes.get(kind, 0) + 1
    assert stores[0].calls == stores[1].calls > 100
    assert ("error" in outcomes) is not fail_open
    assert stats_a.snapshot() == stats_b.snapshot()
    degraded = stats_a.snapshot().get("ratelimit.service.call.should_rate_limit.degraded", 0)
    assert (degraded >= stores[0].calls // 5) if fail_open else degraded == 0


def test_memory_is_bounded_in_entries_and_bytes() -> None:
    s, _, _, _ = servicer()
    for i in range(PLANS + 500):
        call(s, Req(domain="d", descriptors=[descriptor([("user", f"u{i}")])]))
    assert len(s._engine._prepared) == PLANS
    large = Req(domain="d", descriptors=[descriptor([("user", "x" * (SEEN_BYTES + 1))])])
    answer = call(s, large)
    assert answer.overall_code == rls_pb2.RateLimitResponse.OK
    assert large.SerializeToString() not in s._engine._prepared


def test_a_new_configuration_is_matched_anew() -> None:
    s, holder, _, _ = servicer()
    request = Req(domain="d", descriptors=[descriptor([("user", "ann")])])
    assert call(s, request).statuses[0].current_limit.requests_per_unit == 3
    holder.swap(
        load_sources([("d.yaml", CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 9"))])
    )
    assert call(s, request).statuses[0].current_limit.requests_per_unit == 9
    holder.swap(
        load_sources(
            [
                (
                    "d.yaml",
                    "domain: d\ndescriptors:\n  - key: other\n"
                    "    rate_limit: {unit: second, requests_per_unit: 1}\n",
                )
            ]
        )
    )
    assert not call(s, request).statuses[0].HasField("current_limit")
