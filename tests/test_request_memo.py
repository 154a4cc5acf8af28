"""ShouldRateLimit remembers each distinct request's conversion and matches (by its serialized
bytes): the answers are those of a request worked out afresh, the memory is bounded in entries
and in bytes, and a new configuration is matched anew."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.config.reloader import ConfigHolder
from ferryman.engine import RateLimitEngine
from ferryman.engine.engine import PLANS
from ferryman.server.rls import SEEN, SEEN_BYTES, RateLimitServicer
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
"""

Req = rls_pb2.RateLimitRequest
NONE: Any = None  # the servicer does not use its context


def servicer(config: str = CONFIG) -> tuple[RateLimitServicer, ConfigHolder, Stats, ManualClock]:
    clock = ManualClock(EPOCH)
    holder = ConfigHolder(config=load_sources([("d.yaml", config)]))
    stats = Stats()
    engine = RateLimitEngine(holder, MemoryBackend(clock), clock, stats)
    return RateLimitServicer(engine), holder, stats, clock


def call(s: RateLimitServicer, request: Req) -> rls_pb2.RateLimitResponse:
    return asyncio.run(s.ShouldRateLimit(request, NONE))


def random_request(rng: random.Random) -> Req:
    users = [("user", f"u{rng.randrange(4)}")]
    choices = [
        users,
        [("route", f"r{rng.randrange(2)}"), *users],
        [("vip", rng.choice(["gold", "silver"]))],
        [("nothing", "x")],
    ]
    picked = [descriptor(rng.choice(choices)) for _ in range(rng.randrange(1, 4))]
    return Req(domain="d", descriptors=picked, hits_addend=rng.choice([0, 0, 1, 2]))


def test_remembered_requests_are_answered_as_fresh_ones() -> None:
    """The same random stream (repeats included) through ShouldRateLimit, which remembers,
    and through respond, which works each request out afresh: equal answers and stats."""
    remembering, _, stats_a, clock_a = servicer()
    fresh, _, stats_b, clock_b = servicer()
    rng = random.Random(7)
    repeats = 0
    for step in range(600):
        request = random_request(rng)
        repeats += request.SerializeToString() in cast(dict[bytes, Any], remembering._seen)
        got = call(remembering, request)
        want = asyncio.run(fresh.respond(request))
        assert got == want, f"step {step}: {request}"
        if step % 50 == 49:
            clock_a.advance(61.0)
            clock_b.advance(61.0)
    assert repeats > 200  # the stream did exercise remembered requests
    assert stats_a.snapshot() == stats_b.snapshot()


def test_memory_is_bounded_in_entries_and_bytes() -> None:
    s, _, _, _ = servicer()
    for i in range(SEEN + 500):
        call(s, Req(domain="d", descriptors=[descriptor([("user", f"u{i}")])]))
    assert len(s._seen) == SEEN
    assert len(s._engine._plans) == PLANS
    large = Req(domain="d", descriptors=[descriptor([("user", "x" * (SEEN_BYTES + 1))])])
    answer = call(s, large)
    assert answer.overall_code == rls_pb2.RateLimitResponse.OK
    assert large.SerializeToString() not in s._seen
    assert large.SerializeToString() not in s._engine._plans


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
