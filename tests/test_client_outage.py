"""The client during a real outage: the fallback limiter and the circuit breaker.

The server is a real one in process, stopped and started again on the same port; the
client's fallback buckets and breaker read a clock the test moves, so nothing sleeps out a
back-off and no assertion depends on timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import ferryman
from ferryman.client._guard import Breaker, FallbackLimiter

from helpers.client_domain import CLIENT_CONFIG
from helpers.ports import free_port, refused_port, silent_listener
from helpers.server import ConfigDir, Server, ServerFactory


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _serve(make_server: ServerFactory, config_dir: ConfigDir, port: int) -> Server:
    config_dir.write("client.yaml", CLIENT_CONFIG)
    return make_server(real_clock=True, grpc_port=port)


def _ask(client: ferryman.Client, value: str = "a") -> ferryman.RateLimitResult:
    return client.should_rate_limit("client", [{"fixed": value}])


def test_fallback_bucket_refills_at_its_rate_and_keeps_each_key_apart() -> None:
    """A fallback bucket grants its burst, then its rate per second, per key."""
    clock = Clock()
    limiter = FallbackLimiter(2.0, burst=1.0, clock=clock)
    assert [limiter.take("allow", "a", 1) for _ in range(3)] == [True, True, False]
    assert limiter.take("allow", "b", 1)
    clock.now += 0.5
    assert limiter.take("allow", "a", 1)
    assert not limiter.take("allow", "a", 1)
    assert not FallbackLimiter({"allow": 1.0}, clock=clock).covers("request_rate")
    assert not FallbackLimiter(0.0, clock=clock).take("allow", "a", 1)  # 0: closed


def test_breaker_opens_after_n_failures_probes_once_and_backs_off_to_its_cap() -> None:
    """N outages open the breaker; one probe at a time; failed probes double the back-off."""
    clock = Clock()
    breaker = Breaker(3, backoff=1.0, max_backoff=3.0, clock=clock)
    for _ in range(3):
        assert breaker.admit() is None
        breaker.record(outage=True)
    assert breaker.is_open and breaker.admit() == clock.now + 1.0
    clock.now += 1.0
    assert breaker.admit() is None  # the probe
    assert breaker.admit() is not None  # the others wait for it
    breaker.record(outage=True)
    assert breaker.admit() == clock.now + 2.0
    clock.now += 2.0
    assert breaker.admit() is None
    breaker.record(outage=True)
    assert breaker.admit() == clock.now + 3.0  # capped
    clock.now += 3.0
    assert breaker.admit() is None
    breaker.record(outage=False)
    assert not breaker.is_open and breaker.admit() is None
    assert breaker.opened == 3


def test_outage_is_answered_by_the_fallback_and_the_breaker_stops_calling(
    make_server: ServerFactory, config_dir: ConfigDir
) -> None:
    """Server stopped: fallback answers at its rate, the open breaker sends nothing; server
    back: one probe closes the breaker and the server answers again."""
    port = free_port()
    server = _serve(make_server, config_dir, port)
    clock = Clock()
    client = ferryman.Client(
        f"127.0.0.1:{port}", timeout=5, fallback_rate=3, breaker_failures=2, clock=clock
    )
    with client:
        assert _ask(client).ok and not _ask(client).fallback
        server.stop()
        answers = [_ask(client) for _ in range(6)]
        stats = client.stats()
        # Two calls reached the dead port; the breaker answered the other four at once.
        assert stats.calls == 4 and stats.short_circuited == 4 and stats.breaker_open
        assert [a.ok for a in answers] == [True, True, True, False, False, False]
        assert all(a.fallback and not a.degraded for a in answers)
        assert stats.fallback == 6 and stats.fallback_rejected == 3
        assert _ask(client, "b").ok  # each descriptor has its own bucket
        clock.now += 1.0  # a second of fallback rate, and the back-off is over
        assert [_ask(client).ok for _ in range(4)] == [True, True, True, False]
        assert client.stats().calls == 5  # one probe, which failed: open again
        _serve(make_server, config_dir, port)
        skipped = client.stats().short_circuited
        for _ in range(100):  # the channel reconnects on its own schedule
            clock.now += 30.0
            if _ask(client, "c").ok and not client.stats().breaker_open:
                break
            time.sleep(0.05)
        stats = client.stats()
        # Each look after a back-off was one probe; none was answered without being sent.
        assert not stats.breaker_open and stats.short_circuited == skipped
        after = _ask(client, "c")
        assert not after.fallback and client.stats().fallback == stats.fallback


def test_a_server_that_never_answers_is_no_longer_called_once_the_breaker_opens() -> None:
    """Against a port that accepts and never answers, only the first N calls are sent (each
    waits out its timeout); every later one is answered by the fallback without a call."""
    clock = Clock()
    with silent_listener() as port:
        client = ferryman.Client(
            f"127.0.0.1:{port}", timeout=0.2, fallback_rate=5, breaker_failures=2, clock=clock
        )
        with client:
            answers = [client.allow("ns", "b").granted for _ in range(8)]
            stats = client.stats()
    assert answers == [True] * 5 + [False] * 3
    assert stats.calls == 2 and stats.short_circuited == 6 and stats.breaker_opened == 1


def test_without_a_fallback_rate_the_open_breaker_gives_degraded_grants_at_once() -> None:
    """All-allow degraded mode stays the choice without a fallback rate, breaker or not."""
    clock = Clock()
    with ferryman.Client(f"127.0.0.1:{refused_port()}", breaker_failures=1, clock=clock) as c:
        results = [c.allow("ns", "bucket", 5) for _ in range(3)]
        assert all(r.granted and r.degraded and not r.fallback for r in results)
        stats = c.stats()
        assert stats.calls == 1 and stats.short_circuited == 2 and stats.degraded == 3


def test_fallback_refusals_keep_the_shape_of_each_call_kind() -> None:
    """Allow is refused with REJECTED_TIMEOUT, Request with success False, unless the kill
    switch overrides the refusal."""
    clock = Clock()
    rates: dict[str, float] = {"allow": 4, "request_rate": 1}
    with ferryman.Client(f"127.0.0.1:{refused_port()}", fallback_rate=rates, clock=clock) as c:
        assert c.allow("ns", "b", 3).granted
        refused = c.allow("ns", "b", 3)
        assert refused.status == "REJECTED_TIMEOUT" and not refused.granted and refused.fallback
        first = c.request_rate("client", {"tight": "x"}, copies=3, min_copies=1)
        assert first.success and first.copies == 1 and first.fallback
        assert not c.request_rate("client", {"tight": "x"}).success
        c.kill_switch = True
        overridden = c.request_rate("client", {"tight": "x"})
        assert overridden.success and overridden.overridden
        assert c.stats().fallback == 5 and c.stats().fallback_rejected == 3  # one overridden


def test_async_client_has_the_same_breaker_and_fallback() -> None:
    """AsyncClient: the breaker opens after N outages and the fallback answers."""
    clock = Clock()

    async def main() -> tuple[list[bool], ferryman.ClientStats]:
        async with ferryman.AsyncClient(
            f"127.0.0.1:{refused_port()}", fallback_rate=2, breaker_failures=2, clock=clock
        ) as c:
            answers = [(await c.should_rate_limit("client", [{"fixed": "a"}])).ok for _ in range(4)]
            return answers, c.stats()

    answers, stats = asyncio.run(main())
    assert answers == [True, True, False, False]
    assert stats.calls == 2 and stats.short_circuited == 2 and stats.breaker_open


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: ferryman.Client("x:1", fallback_rate={"holds": 1.0}), "fallback_rate"),
        (lambda: ferryman.Client("x:1", fallback_rate=-1), r"fallback_rate\[should_rate_limit\]"),
        (lambda: ferryman.Client("x:1", breaker_failures=-1), "breaker_failures"),
        (lambda: ferryman.Client("x:1", breaker_backoff=0), "breaker_backoff"),
    ],
)
def test_bad_resilience_options_are_refused(build: Callable[[], object], named: str) -> None:
    """A bad fallback rate or breaker option is a ValueError naming the option."""
    with pytest.raises(ValueError, match=named):
        build()
