"""GCRA (``gcra`` nodes): every store against a textbook GCRA on a manual clock (memory,
Redis, a Redis Cluster); ShouldRateLimit's statuses, headers, shadow and quota modes;
ferryman.v1's Request as a shaper; the YAML and ``ferryman check`` errors; explain and the
config API's reset."""

from __future__ import annotations

import http.client
import json
import math
import subprocess
import sys
import uuid
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.algorithms.gcra import Gcra
from ferryman.algorithms.gcra.memory import MemoryGcra
from ferryman.algorithms.gcra.model import GcraParams
from ferryman.backends.base import Backend
from ferryman.clock import ManualClock
from ferryman.config import load_sources
from ferryman.engine.explain import render
from ferryman.errors import ConfigError

from helpers.redis_procs import RedisProcess
from helpers.server import (
    EPOCH,
    ConfigDir,
    Server,
    ServerFactory,
    codes,
    descriptor,
    limiter_stub,
    overall,
)
from helpers.stores import Store, on_stores

EXAMPLES = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
RateLimit = rls_pb2.RateLimitResponse.RateLimit


class Textbook:
    """GCRA by virtual scheduling, cell by cell, in exact fractions of a microsecond: a
    cell conforms when TAT <= now + tau, and moves TAT to max(TAT, now) + T. A request of
    n cells passes when all of them conform (none is kept otherwise); a shaper's request
    is served at the first moment it would, if that is within its wait."""

    def __init__(self, rate: int, per_us: int, burst: int) -> None:
        self.t = Fraction(per_us, rate)
        self.tau = (burst - 1) * self.t
        self.burst = burst
        self.tat: dict[str, Fraction] = {}

    def _cells(self, tat: Fraction, now: Fraction, n: int) -> Fraction | None:
        for _ in range(n):
            if tat > now + self.tau:
                return None
            tat = max(tat, now) + self.t
        return tat

    def take(self, key: str, cost: int, now_us: int, wait_us: int) -> tuple[Any, ...]:
        now = Fraction(now_us)
        tat = self.tat.get(key, now)
        at = max(now, tat + (cost - 1) * self.t - self.tau) if cost else now
        waited = math.ceil(at - now)
        after = self._cells(tat, at, cost) if cost <= self.burst and waited <= wait_us else None
        if after is not None and cost:
            self.tat[key] = after
        return (after is not None, waited if after is not None else 0, *self.look(key, now_us))

    def look(self, key: str, now_us: int) -> tuple[int, int]:
        """(cells that would conform now, µs until TAT)."""
        now = Fraction(now_us)
        tat = self.tat.get(key, now)
        left, probe = 0, tat
        while left <= self.burst:
            moved = self._cells(probe, now, 1)
            if moved is None:
                break
            left, probe = left + 1, moved
        return left, math.ceil(max(tat - now, Fraction(0)))


# Per: minutes and more on Redis, whose keys expire in real time while the test's clock is
# manual (every write keeps its key for one emission interval at least).
PERS = {"memory": (1_000, 1_000_000, 60_000_000), "redis": (60_000_000, 3_600_000_000)}
steps = st.lists(
    st.tuples(
        st.sampled_from(
            [0, 0, 0, 1, 1, 2, 3, 5, 40]
        ),  # quarters to move on: of an interval, or (< 0)
        st.sampled_from([1, 1, -1]),  # of ``per``, which land exactly on its boundaries
        st.integers(-2, 2),  # and a few microseconds either side of that
        st.sampled_from("ab"),
        st.sampled_from([0, 1, 1, 1, 2, 3, 7]),  # the cost
        st.sampled_from([0, 0, 1, 3, 8]),  # the wait offered, in halves of an interval
    ),
    min_size=10,
    max_size=30,
)


async def _replay(
    store: Store, trace: list[tuple[int, int, int, str, int, int]], params: tuple[int, int, int]
) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    rate, per_us, burst = params
    gcra, book = store.backend.store("gcra"), Textbook(*params)
    limit = GcraParams.of(rate, per_us, burst)
    prefix = f"{store.prefix}{uuid.uuid4().hex[:8]}ferryman_gcra_{{g|"
    now_us = round(EPOCH * 1e6) + 5
    out: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
    for quarters, of, jitter, key, cost, halves in trace:
        step = per_us * quarters // (4 * rate) if of > 0 else per_us * quarters // 4
        now_us = max(now_us, now_us + step + jitter)
        wait_us = per_us * halves // (2 * rate)
        r = await gcra.take(prefix + key + "}", limit, cost, wait_us, now_us / 1e6)
        got = (r.allowed, r.wait_us, r.remaining, r.full_us)
        out.append((got, book.take(key, cost, now_us, wait_us)))
        other = "b" if key == "a" else "a"
        p = await gcra.peek(prefix + other + "}", limit, now_us / 1e6)
        out.append(((p.remaining, p.full_us), book.look(other, now_us)))
    return out


@on_stores()
@settings(EXAMPLES, max_examples=100)
@example(  # a look right after a wait pushed the debt past the burst
    trace=[(0, 1, 0, "a", 1, 0), (0, 1, 0, "a", 1, 3), (0, 1, 0, "a", 0, 0)], rate=1, burst=1, per=1
)
@given(
    trace=steps, rate=st.integers(1, 9), burst=st.sampled_from([1, 2, 3, 8]), per=st.integers(0, 2)
)
def test_every_store_decides_as_the_textbook_gcra(
    store: Store, trace: list[tuple[int, int, int, str, int, int]], rate: int, burst: int, per: int
) -> None:
    """Random costs, waits offered and clock moves (often right at an emission boundary):
    each store accepts and refuses exactly as virtual scheduling does, with the same wait,
    burst left and time until the bucket is full, and reads the same without writing."""
    pers = PERS["memory" if store.kind == "memory" else "redis"]
    params = (rate, pers[per % len(pers)], burst)
    for got, want in store.run(_replay(store, trace, params)):
        assert got == want


@on_stores()
def test_a_changed_limit_rounds_a_kept_time_up_to_its_microsecond(store: Store) -> None:
    """A TAT kept under 7 per second (a seventh of a microsecond past a whole one) is read
    under 2 per second as the next whole microsecond: a little stricter, never lost."""
    key = f"{store.prefix}ferryman_gcra_{{g|t}}"
    gcra, now = store.backend.store("gcra"), round(EPOCH * 1e6)
    assert store.run(gcra.take(key, GcraParams.of(7, 1_000_000, 1), 1, 0, now / 1e6)).allowed
    slower = GcraParams.of(2, 1_000_000, 1)
    assert store.run(gcra.peek(key, slower, now / 1e6)).full_us == 142_858
    assert not store.run(gcra.take(key, slower, 1, 0, (now + 142_857) / 1e6)).allowed
    assert store.run(gcra.take(key, slower, 1, 0, (now + 142_858) / 1e6)).full_us == 500_000


@on_stores("redis")
def test_one_redis_string_per_tenant_kept_until_the_bucket_is_full(store: Store) -> None:
    """A tenant is one string (its TAT), which expires when its bucket is full again."""
    limit = GcraParams.of(1, 3_600_000_000, 2)  # one an hour, two at once
    key = f"{store.prefix}ferryman_gcra_{{g|t}}"
    gcra = store.backend.store("gcra")
    assert store.run(gcra.take(key, limit, 2, 0, EPOCH)).allowed
    client = store.redis()
    assert client.type(key) == b"string"
    assert len(client.keys(f"{store.prefix}*")) == 1
    pttl = int(client.pttl(key))
    assert 7_200_000 - 60_000 < pttl <= 7_200_000
    assert store.run(gcra.reset(key)) == 1 and not client.exists(key)


@on_stores("redis")
def test_on_server_time_redis_decides_on_its_own_clock(
    make_store: Callable[..., Backend], clock: ManualClock, redis_server: RedisProcess
) -> None:
    """By default the TAT is Redis's TIME plus the interval, not the caller's time (here
    a day in 2023, long before the Redis clock)."""
    with Store("redis", make_store(), clock, redis_server.port) as store:
        key = f"{store.prefix}ferryman_gcra_{{g|t}}"
        gcra = store.backend.store("gcra")
        assert store.run(gcra.take(key, GcraParams.of(1, 1_000_000, 1), 1, 0, EPOCH)).allowed
        kept = store.redis().get(key)
        assert kept is not None
        assert int(kept.split()[0]) > (EPOCH + 30 * 86400) * 1e6


def test_the_memory_store_is_capped_and_never_forgets_a_spent_tenant() -> None:
    """With max_keys 2 a new tenant makes room by forgetting one with room left; when
    every kept tenant has spent its burst the new one is refused and not stored; tenants
    whose bucket is full again are dropped as they are met."""
    store = MemoryGcra(max_keys=2)
    limit = GcraParams.of(1, 60_000_000, 2)  # one a minute, two at once
    now = round(EPOCH * 1e6)
    assert store.take_at("a", limit, 2, 0, now).allowed  # spent
    assert store.take_at("b", limit, 1, 0, now).allowed  # one left
    assert store.take_at("c", limit, 2, 0, now).allowed  # b is forgotten for it
    assert (len(store), store.evicted) == (2, 1)
    refused = store.take_at("d", limit, 1, 0, now)
    assert not refused.allowed and (len(store), store.refused) == (2, 1)
    assert not store.take_at("a", limit, 1, 0, now).allowed  # a is still held, spent
    assert store.take_at("d", limit, 1, 0, now + 120_000_000).allowed
    assert len(store) == 1  # a and c were full again


CONFIG = """
domain: g
descriptors:
  - key: user
    gcra: {rate: 10, per: 1s, burst: 3}
  - key: report
    gcra: {rate: 2, per: 30s, name: reports}
    shadow_mode: true
  - key: plan
    gcra: {rate: 1, per: 1m}
    quota_mode: true
  - key: job
    gcra: {rate: 10, per: 1s, burst: 2}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: admin
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: reports}]}
"""


def test_should_rate_limit_answers_with_the_burst_left_and_the_time_to_full(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """10 per second, burst 3: three pass at once (2, 1, 0 left), the fourth is over; a
    tenth of a second later one more passes; hits_addend is the cost, more than the burst
    never passes; the limit is reported as 10 per second."""
    config_dir.write("g.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    answers = [server.ask("g", [("user", "a")]) for _ in range(4)]
    assert [codes(r)[0] for r in answers] == ["OK", "OK", "OK", "OVER_LIMIT"]
    assert [r.statuses[0].limit_remaining for r in answers] == [2, 1, 0, 0]
    assert [r.statuses[0].duration_until_reset.seconds for r in answers] == [1, 1, 1, 1]
    first = answers[0].statuses[0]
    assert (first.current_limit.requests_per_unit, first.current_limit.unit) == (
        10,
        RateLimit.SECOND,
    )
    assert codes(server.ask("g", [("user", "b")])) == ["OK"]  # its own bucket
    clock.set(EPOCH + 0.1)
    assert codes(server.ask("g", [("user", "a")])) == ["OK"]
    assert codes(server.ask("g", [("user", "a")])) == ["OVER_LIMIT"]
    clock.set(EPOCH + 10)
    full = server.ask("g", descriptor([("user", "a")], hits=0))
    assert codes(full) == ["OK"] and full.statuses[0].limit_remaining == 3
    assert full.statuses[0].duration_until_reset.seconds == 0
    two = server.ask("g", descriptor([("user", "a")], hits=2))
    assert codes(two) == ["OK"] and two.statuses[0].limit_remaining == 1
    assert codes(server.ask("g", descriptor([("user", "c")], hits=4))) == ["OVER_LIMIT"]
    assert server.stat("ratelimit.service.rate_limit.g.user.within_limit") == 7
    assert server.stat("ratelimit.service.rate_limit.g.user.over_limit") == 6


def test_shadow_mode_quota_mode_and_the_headers(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """2 per 30 s is reported per minute; in shadow mode the second request is OK and the
    headers give the burst over the time it takes to come back; in quota mode one tenant
    over its limit beside another within it leaves the request OK."""
    config_dir.write("g.yaml", CONFIG)
    server = make_server(limit_response_headers_enabled=True)
    clock.set(EPOCH)
    assert codes(server.ask("g", [("report", "r")])) == ["OK"]
    r = server.ask("g", [("report", "r")])
    assert codes(r) == ["OK"] and r.statuses[0].current_limit.unit == RateLimit.MINUTE
    assert r.statuses[0].current_limit.name == "reports"
    headers = {h.key: h.value for h in r.response_headers_to_add}
    assert headers == {
        "RateLimit-Limit": "1, 1;w=15",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "15",
    }
    assert server.stat("ratelimit.service.rate_limit.g.report.shadow_mode") == 1
    # A rule that replaces the GCRA node by its name leaves it OK, counting nothing.
    replaced = server.ask("g", [("report", "r")], [("admin", "a")])
    assert codes(replaced) == ["OK", "OK"]
    assert server.stat("ratelimit.service.rate_limit.g.report.total_hits") == 2
    assert codes(server.ask("g", [("plan", "p")])) == ["OK"]
    both = server.ask("g", [("plan", "p")], [("plan", "q")])
    assert codes(both) == ["OVER_LIMIT", "OK"] and overall(both) == "OK"


def request(
    server: Server, key: str, copies: int = 1, max_wait_ms: int = 0, min_copies: int | None = None
) -> limiter_pb2.RateResponse:
    ask = limiter_pb2.RateRequest(
        domain="g", descriptor=[limiter_pb2.Entry(key=key, value="t")], copies=copies
    )
    if min_copies is not None:
        ask.min_copies = min_copies
    if max_wait_ms:
        ask.max_wait.FromMilliseconds(max_wait_ms)
    reply: limiter_pb2.RateResponse = limiter_stub(server.channel).Request(ask, timeout=10)
    return reply


def test_a_request_that_offers_to_wait_is_shaped(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """Burst 2 at 10 per second: two at once; the next is refused with retry_after 100 ms
    unless it may wait, then each waiting caller is told to wait its turn (100 ms, 200 ms)
    and one that may not wait that long is refused; more than the burst never passes."""
    config_dir.write("g.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    first = request(server, "job", copies=2)
    assert first.granted == 2 and not first.HasField("wait") and first.tokens_remaining == 0
    refused = request(server, "job")
    assert refused.granted == 0 and refused.retry_after.ToMilliseconds() == 100
    assert request(server, "job", max_wait_ms=1000).wait.ToMilliseconds() == 100
    assert request(server, "job", max_wait_ms=1000).wait.ToMilliseconds() == 200
    late = request(server, "job", max_wait_ms=250)
    assert late.granted == 0 and late.retry_after.ToMilliseconds() == 300
    never = request(server, "user", copies=4)
    assert never.granted == 0 and not never.HasField("retry_after")
    assert request(server, "user", copies=4, min_copies=3).granted == 3
    assert server.stat("ratelimit.service.rate_limit.g.job.served_with_wait") == 2
    with pytest.raises(grpc.RpcError) as err:
        request(server, "window")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "gcra" in (err.value.details() or "")


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ("gcra: {per: 1s}", "", "needs 'rate'"),
        ("gcra: {rate: 5}", "", "needs 'per'"),
        ("gcra: {rate: 0, per: 1s}", ".rate", "rate must be positive"),
        ("gcra: {rate: 1, per: 0s}", ".per", "per must be positive"),
        ("gcra: {rate: 1, per: soon}", ".per", "expected a duration"),
        ("gcra: {rate: 1, per: 1s, burst: 0}", ".burst", "burst must be at least 1"),
        ("gcra: {rate: 1, per: 1s, limit: 3}", ".limit", "unknown key"),
        ("gcra: {rate: 7, per: 1d, burst: 4000000000}", "", "too large to decide exactly"),
        ("gcra: {rate: 1, per: 1s}\n    token_bucket: {size: 1, fill_rate: 1}", "", "one of"),
    ],
)
def test_bad_gcra_nodes_are_errors_with_file_line_and_path(
    body: str, path: str, message: str
) -> None:
    """Each problem names the file, the line of the node and its YAML path."""
    with pytest.raises(ConfigError) as err:
        load_sources([("b.yaml", "domain: d\ndescriptors:\n  - key: k\n    " + body + "\n")])
    text = str(err.value)
    assert "b.yaml:4" in text or "b.yaml:5" in text, text
    assert f"descriptors[0].gcra{path}" in text or "token_bucket" in text, text
    assert message in text, text


def test_gcra_yaml_defaults_and_ferryman_check(tmp_path: Path) -> None:
    """burst defaults to 1 and per reads any duration; ``ferryman check`` lists a GCRA
    node with its numbers and refuses a bad one with its file and line."""
    limit = load_sources([("g.yaml", CONFIG)]).domains["g"].root.rules[2].limit
    assert limit == Gcra(1, 60.0, 1)
    (tmp_path / "g.yaml").write_text(CONFIG)
    run = [sys.executable, "-m", "ferryman", "check", str(tmp_path)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "GCRA 10 per 1s, burst 3" in done.stdout
    (tmp_path / "g.yaml").write_text(CONFIG.replace("burst: 3", "burst: -3"))
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "g.yaml:5:" in done.stdout + done.stderr


TOKEN = "gcra-write-token"


def reset(server: Server, key: str) -> dict[str, Any]:
    body = json.dumps({"domain": "g", "descriptor": [{"key": key, "value": "t"}]})
    conn = http.client.HTTPConnection("127.0.0.1", server.service.debug_port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        conn.request("POST", "/api/v1/counters/reset", body, headers)
        response = conn.getresponse()
        assert response.status == 200, response.read()
        answer: dict[str, Any] = json.loads(response.read())
        return answer
    finally:
        conn.close()


@on_stores("memory", "redis")
def test_explain_reads_the_bucket_and_the_config_api_resets_it(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock, tmp_path: Path
) -> None:
    """/explain shows the burst left and when the bucket is full, changing nothing; the
    config API's reset fills the bucket again."""
    (tmp_path / "tokens").write_text(f"{TOKEN} alice write\n")
    config_dir.write("g.yaml", CONFIG)
    server = make_server(admin_tokens_file=str(tmp_path / "tokens"))
    clock.set(EPOCH)

    def explained() -> dict[str, Any]:
        status, body = server.http("GET", "/explain?domain=g&descriptor=user=t", debug=True)
        assert status == 200, body
        answer: dict[str, Any] = json.loads(body)
        return answer

    assert explained()["descriptors"][0]["remaining"] == 3
    server.ask("g", descriptor([("user", "t")], hits=3))
    for _ in range(2):
        answer = explained()
        d = answer["descriptors"][0]
        assert (d["remaining"], d["full_in"]) == (0, 0.3)
        assert d["counter_key"].endswith("ferryman_gcra_{g.user|t}")
    assert "now: 0 left, bucket full again in 0.3s" in render(answer)
    assert "GCRA 10 per 1s, burst 3" in render(answer)
    done = reset(server, "user")
    assert done["kind"] == "gcra" and done["held"] is True
    assert explained()["descriptors"][0]["remaining"] == 3
    assert codes(server.ask("g", descriptor([("user", "t")], hits=3))) == ["OK"]
