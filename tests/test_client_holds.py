"""Held resources through ferryman.Client / AsyncClient against real servers on the real clock.

Counts are read as another client sees them: a one-copy probe reservation reports how many
copies of its tenant are held (``tenant_held``) besides its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

import ferryman
from ferryman.errors import HoldError, NotFoundError, RequestError, ServiceUnavailableError

from helpers.ports import refused_port, silent_listener
from helpers.server import ConfigDir, Server, ServerFactory, wait_for
from helpers.stores import on_stores

T = TypeVar("T")

CONFIG = """
domain: holds
descriptors:
  - key: tenant             # the main copy-limited node
    copies:
      limit: 5
      global_limit: 40
      groups:
        - {name: vip, limit: 30, members: [acme*]}
  - key: gpu                # a second copy-limited node, for multi-resource holds
    copies: {limit: 3}
  - key: api                # a rate-limited node: two hits per second
    burst_tiers:
      - {limit: 2, window: 1s, active: 1h}
  - key: fixed              # neither: a fixed-window limit
    rate_limit: {unit: minute, requests_per_unit: 2}
"""

# A child process that seizes a transfer, shows what it holds, releases one copy, and
# tries the same transfer id again; each step waits for a line on stdin.
CHILD = """
import sys
import ferryman

target, transfer_id = sys.argv[1], sys.argv[2]
with ferryman.Client(target, timeout=5) as client:
    with client.seize_copy(transfer_id) as hold:
        shown = ",".join(f"{k}={v}" for k, v in hold.descriptor)
        print("seized", hold.copies, hold.domain, shown, ",".join(hold.groups), hold.held,
              flush=True)
        sys.stdin.readline()
        hold.release(1)
        print("left", hold.copies, flush=True)
        sys.stdin.readline()
    try:
        with client.seize_copy(transfer_id):
            print("seized twice", flush=True)
    except ferryman.NotFoundError as error:
        print("again", type(error).__name__, error.field, flush=True)
"""

# A child that holds copies and waits to be killed.
DOOMED = """
import sys, time
import ferryman

client = ferryman.Client(sys.argv[1], timeout=5)
with client.hold_copy("holds", {"tenant": sys.argv[2]}, copies=4) as hold:
    print("held", hold.copies, flush=True)
    time.sleep(600)
"""


def run(coro: Coroutine[object, object, T]) -> T:
    return asyncio.run(coro)


def target_of(server: Server) -> str:
    return f"127.0.0.1:{server.service.grpc_port}"


def probe(client: ferryman.Client, tenant: str, key: str = "tenant") -> int:
    """Copies of ``tenant`` held by everyone else, as one more reservation reports them."""
    with client.hold_copy("holds", {key: tenant}) as hold:
        assert hold.success and hold.context is not None, hold
        return hold.context.tenant_held - hold.copies


@pytest.fixture
def server(config_dir: ConfigDir, make_server: ServerFactory) -> Server:
    """A ferryman server on the system clock with the holds test domain."""
    config_dir.write("holds.yaml", CONFIG)
    return make_server(real_clock=True)


@pytest.fixture
def target(server: Server) -> str:
    return target_of(server)


@pytest.fixture
def client(target: str) -> Iterator[ferryman.Client]:
    with ferryman.Client(target, timeout=5) as c:
        yield c


@pytest.fixture
def other(target: str) -> Iterator[ferryman.Client]:
    """A second client of the same server: another session, to look at the counts."""
    with ferryman.Client(target, timeout=5) as c:
        yield c


@pytest.fixture
def pair(config_dir: ConfigDir, make_server: ServerFactory) -> tuple[Server, Server]:
    """Two servers on one store (memory: one backend object; redis: one redis-server)."""
    config_dir.write("holds.yaml", CONFIG)
    a = make_server(real_clock=True)
    b = make_server(store_of=a, real_clock=True)
    return a, b


# hold_copy: context, release on exit, partial release.


def test_hold_reports_copies_groups_and_the_services_counts(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """A granted hold has its copies, groups, limits and counts; another client sees them."""
    with client.hold_copy("holds", {"tenant": "acme-1"}, copies=3) as hold:
        assert hold.success and hold.held and hold.copies == 3
        assert not (hold.degraded or hold.overridden or hold.lost)
        assert hold.groups == ("vip",)
        assert (hold.domain, hold.descriptor) == ("holds", (("tenant", "acme-1"),))
        assert hold.attempts == 1 and hold.waited < 1
        ctx = hold.context
        assert ctx is not None
        assert (ctx.granted, ctx.limit, ctx.global_limit, ctx.tenant_held) == (3, 5, 40, 3)
        assert ctx.groups == (ferryman.HoldGroup("vip", 30, 3),)
        assert probe(other, "acme-1") == 3
    assert probe(other, "acme-1") == 0
    assert client.stats().sessions == 1


def test_hold_is_released_when_the_block_raises(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """An exception in the block propagates and the copies are given back on the way."""

    def work() -> None:
        with client.hold_copy("holds", {"tenant": "t2"}, copies=4) as hold:
            assert probe(other, "t2") == 4
            hold.copies / 0

    with pytest.raises(ZeroDivisionError):
        work()
    assert probe(other, "t2") == 0
    assert client.stats().errors == 0


def test_partial_release_and_over_release(client: ferryman.Client, other: ferryman.Client) -> None:
    """release(n) gives back n now; more than the hold has is HoldError and changes nothing."""
    with client.hold_copy("holds", {"tenant": "t3"}, copies=5) as hold:
        hold.release(2)
        assert hold.copies == 3 and probe(other, "t3") == 3
        with pytest.raises(HoldError, match=r"copies: 4 is more than this hold has \(3\)"):
            hold.release(4)
        assert hold.copies == 3 and probe(other, "t3") == 3
        hold.release()  # all that is left
        assert hold.copies == 0 and not hold.held and probe(other, "t3") == 0
    assert probe(other, "t3") == 0


def test_min_copies_and_a_rejection_within_max_wait(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """Take what there is down to min_copies; below it the hold fails whole, after max_wait,
    in one call that waited in the service's queue."""
    with other.hold_copy("holds", {"tenant": "t4"}, copies=3):
        with client.hold_copy("holds", {"tenant": "t4"}, copies=5, min_copies=1) as some:
            assert some.success and some.copies == 2
        with client.hold_copy("holds", {"tenant": "t4"}, copies=3, max_wait=1) as none:
            assert not none.success and none.copies == 0 and not none.held
            assert none.attempts == 1
            assert none.context is not None and none.context.tenant_held == 3
    assert client.stats().rejected == 1


def test_reserve_waits_in_the_queue_until_copies_free_up(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """A full tenant frees up after 0.5s: the waiting hold is granted in the same call."""
    with other.hold_copy("holds", {"tenant": "t5"}, copies=5) as full:
        threading.Timer(0.5, full.release, args=(2,)).start()
        with client.hold_copy("holds", {"tenant": "t5"}, copies=2, max_wait=30) as hold:
            assert hold.success and hold.copies == 2
            assert hold.attempts == 1
        wait_for("the timer's release", lambda: full.copies == 3)
    assert client.stats().retries == 0


def test_reserve_backs_off_against_a_service_without_queues(
    client: ferryman.Client, other: ferryman.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service that ignores max_wait (an older one) is asked again after the backoff."""

    def older(request: Any, context: Any) -> float:
        request.ClearField("max_wait")  # as a service that does not know the field
        return 0.0

    monkeypatch.setattr("ferryman.apis.limiter._wait", older)
    with other.hold_copy("holds", {"tenant": "t6"}, copies=5) as full:
        threading.Timer(0.5, full.release, args=(2,)).start()
        with client.hold_copy("holds", {"tenant": "t6"}, copies=2, max_wait=3) as hold:
            assert hold.success and hold.copies == 2
            assert hold.attempts == 2
        wait_for("the timer's release", lambda: full.copies == 3)
    assert client.stats().retries == 1


def test_threads_share_one_client_and_one_session(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """Eight threads hold one copy each at the same time: five get one, over one session."""
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def work() -> None:
        with client.hold_copy("holds", {"tenant": "t14"}) as hold:
            results.append(hold.success)
            barrier.wait(10)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(results) == [False] * 3 + [True] * 5
    assert client.stats().sessions == 1
    assert probe(other, "t14") == 0


def test_client_errors_raise(client: ferryman.Client) -> None:
    """Unknown node: NotFoundError; a node without copies or bad arguments: RequestError."""
    with pytest.raises(NotFoundError), client.hold_copy("holds", {"nope": "x"}):
        pass
    with pytest.raises(RequestError, match="copies"), client.hold_copy("holds", {"fixed": "x"}):
        pass
    calls = client.stats().calls
    with (
        pytest.raises(RequestError, match="min_copies"),
        client.hold_copy("holds", {"tenant": "x"}, copies=1, min_copies=2),
    ):
        pass
    with pytest.raises(RequestError, match="ttl"), client.hold_copy("holds", {"tenant": "x"}) as h:
        h.transfer(1, ttl=0)
    assert client.stats().calls == calls + 2  # the hold's reserve and release


# Transfer and seize.


def test_transfer_and_seize_between_clients(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """Transferred copies leave the sender and belong to the seizer; a second seize fails."""
    with client.hold_copy("holds", {"tenant": "acme-6"}, copies=4) as hold:
        transfer_id = hold.transfer(3, ttl=30)
        assert hold.copies == 1
        with other.seize_copy(transfer_id) as seized:
            assert seized.success and seized.held and seized.copies == 3
            assert seized.groups == ("vip",) and seized.context is None
            assert seized.descriptor == (("tenant", "acme-6"),)
            with pytest.raises(NotFoundError) as info:
                other.seize_copy(transfer_id).__enter__()
            assert info.value.field == "transfer_id"
            assert probe(other, "acme-6") == 4  # 1 + 3, wherever they are held
        assert probe(other, "acme-6") == 1
        with pytest.raises(HoldError):
            hold.transfer(3, ttl=30)
    assert probe(other, "acme-6") == 0


def test_unclaimed_transfer_expires(client: ferryman.Client, other: ferryman.Client) -> None:
    """A transfer not seized within its ttl is released; seizing it then is NotFoundError."""
    with client.hold_copy("holds", {"tenant": "t7"}, copies=2) as hold:
        transfer_id = hold.transfer(2, ttl=0.3)
    time.sleep(0.5)
    assert probe(other, "t7") == 0
    with pytest.raises(NotFoundError), other.seize_copy(transfer_id):
        pass


@on_stores("memory", "redis")
def test_transfer_to_a_child_process_on_another_server(pair: tuple[Server, Server]) -> None:
    """Figure 6: a child process seizes 3 of 4 copies on the other server, once and only once."""
    a, b = pair
    with (
        ferryman.Client(target_of(a), timeout=5) as sender,
        ferryman.Client(target_of(a), timeout=5) as watcher,
        sender.hold_copy("holds", {"tenant": "acme-8"}, copies=4) as hold,
    ):
        transfer_id = hold.transfer(3, ttl=30)
        assert hold.copies == 1
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, target_of(b), transfer_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdin is not None
            line = child.stdout.readline()
            assert line.split() == ["seized", "3", "holds", "tenant=acme-8", "vip", "True"], (
                line + child.stderr.read() if child.stderr else line
            )
            assert probe(watcher, "acme-8") == 4  # 1 here, 3 in the child
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().split() == ["left", "2"]
            assert probe(watcher, "acme-8") == 3
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().split() == ["again", "NotFoundError", "transfer_id"]
            assert child.wait(20) == 0
        finally:
            if child.poll() is None:
                child.kill()
            child.communicate(timeout=10)
        assert probe(watcher, "acme-8") == 1
        assert len(b.service.holds.sessions) == 0  # the child's session ended with it


# Sessions.


def test_closing_the_client_ends_its_session_and_the_server_releases(
    server: Server, target: str, other: ferryman.Client
) -> None:
    """close() ends the session: its copies are freed; the open block exits without error."""
    client = ferryman.Client(target, timeout=5)
    assert probe(other, "t9") == 0
    with client.hold_copy("holds", {"tenant": "t9"}, copies=4) as hold:
        assert len(server.service.holds.sessions) == 2  # this client's and other's
        client.close()
        wait_for("the release", lambda: probe(other, "t9") == 0)
        assert len(server.service.holds.sessions) == 1
        hold.release(1)  # a no-op: the session is gone
        assert hold.lost
    clients = [s.client for s in server.service.holds.sessions.values()]
    assert clients[0].startswith("ferryman-python/")


def test_a_killed_client_process_loses_its_holds(target: str, other: ferryman.Client) -> None:
    """SIGKILL: no release runs, but the session's stream breaks and the server frees all."""
    child = subprocess.Popen(
        [sys.executable, "-c", DOOMED, target, "t10"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["held", "4"]
        assert probe(other, "t10") == 4
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        wait_for("the release", lambda: probe(other, "t10") == 0)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=10)


@pytest.mark.parametrize("keepalive", [1.0, 0.0], ids=["keepalive", "no-keepalive"])
def test_a_frozen_client_process_loses_its_holds_after_the_keepalive(
    config_dir: ConfigDir, make_server: ServerFactory, keepalive: float
) -> None:
    """SIGSTOP: the client's host still acknowledges TCP, but nothing answers HTTP/2 pings,
    as when a host dies without closing its connections. The server's keepalive notices and
    ends the session; without keepalive the copies stay held."""
    config_dir.write("holds.yaml", CONFIG)
    server = make_server(
        real_clock=True, grpc_keepalive_time=keepalive, grpc_keepalive_timeout=keepalive
    )
    target = target_of(server)
    child = subprocess.Popen(
        [sys.executable, "-c", DOOMED, target, "t11"], stdout=subprocess.PIPE, text=True
    )
    try:
        with ferryman.Client(target, timeout=5) as other:
            assert child.stdout is not None
            assert child.stdout.readline().split() == ["held", "4"]
            assert probe(other, "t11") == 4
            os.kill(child.pid, signal.SIGSTOP)
            if keepalive:
                wait_for("the release", lambda: probe(other, "t11") == 0, timeout=30)
            else:
                time.sleep(5)  # several keepalive periods of the other case
                assert probe(other, "t11") == 4
    finally:
        child.kill()
        os.kill(child.pid, signal.SIGCONT)
        child.communicate(timeout=10)


def test_a_session_the_server_ends_marks_holds_lost_and_a_new_one_opens(
    config_dir: ConfigDir, make_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends its sessions (its lease lapsed): holds are lost, the next opens anew."""
    caplog.set_level(logging.WARNING, logger="ferryman.client")
    config_dir.write("holds.yaml", CONFIG)
    server = make_server(real_clock=True, hold_lease_seconds=1.0)
    holds = server.service.holds
    with (
        ferryman.Client(target_of(server), timeout=5) as client,
        ferryman.Client(target_of(server), timeout=5) as other,
        client.hold_copy("holds", {"tenant": "t11"}, copies=2) as hold,
    ):
        server.loop.call_soon_threadsafe(holds._lose, "test: lease lapsed")
        wait_for("the session's end", lambda: hold.lost)
        assert hold.copies == 2 and not hold.held
        tid = hold.transfer(1, ttl=5)  # failing open: the copies go on locally
        with client.seize_copy(tid) as moved:
            assert moved.degraded and moved.copies == 1
        with client.hold_copy("holds", {"tenant": "t11"}, copies=3) as again:
            assert again.success and again.held and again.copies == 3
        # The lost copies stay counted until the old lease lapses (1s), then they are freed.
        wait_for("the lapse of the lost copies", lambda: probe(other, "t11") == 0)
        hold.release()  # nothing to send: the session is gone
        stats = client.stats()
        assert (stats.sessions, stats.sessions_lost, stats.errors) == (2, 1, 0)
    assert any("test: lease lapsed" in r.getMessage() for r in caplog.records)


def test_a_session_the_server_forgot_is_reopened(server: Server, client: ferryman.Client) -> None:
    """FAILED_PRECONDITION (the server does not know the session): open another and retry."""
    with client.hold_copy("holds", {"tenant": "t12"}):
        pass
    holds = server.service.holds

    async def forget() -> None:
        holds.sessions.clear()

    server.run(forget())
    with client.hold_copy("holds", {"tenant": "t12"}, copies=2) as hold:
        assert hold.success and hold.held and hold.attempts == 1
    assert client.stats().sessions == 2


# Degraded mode and the kill switch.


def test_degraded_hold_when_the_server_is_down(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listening: min_copies granted at once, degraded, no exception, nothing held."""
    caplog.set_level(logging.WARNING, logger="ferryman.client")
    with ferryman.Client(f"127.0.0.1:{refused_port()}", timeout=2) as c:
        start = time.monotonic()
        with c.hold_copy("holds", {"tenant": "x"}, copies=5, min_copies=2, max_wait=10) as h:
            assert h.success and h.degraded and h.copies == 2 and not h.held
            assert h.context is None
            h.release(1)
            transfer_id = h.transfer(1, ttl=5)  # a local id: the receiver is degraded too
        with c.seize_copy(transfer_id) as seized:
            assert seized.degraded and seized.copies == 1 and seized.descriptor == h.descriptor
        with c.seize_copy("some-real-looking-id", min_copies=2) as unknown:
            assert unknown.degraded and unknown.copies == 2 and unknown.domain == ""
        with c.hold_resources([ferryman.Resource("holds", {"tenant": "x"})], copies=3) as many:
            assert many.success and many.degraded and many.copies == 3
        assert time.monotonic() - start < 2
        assert c.stats().degraded == 4
    assert any("UNAVAILABLE" in r.getMessage() for r in caplog.records)


def test_local_transfer_ids_are_checked_before_any_call() -> None:
    """A malformed local transfer id or an empty one is a RequestError, not an outage."""
    with ferryman.Client(f"127.0.0.1:{refused_port()}") as c:
        for bad in ("ferryman-local:not-base64!", "ferryman-local:WzFd", ""):
            with pytest.raises(RequestError, match="transfer_id"), c.seize_copy(bad):
                pass
        assert c.stats().calls == 0 and c.stats().degraded == 0


def test_degraded_hold_never_hangs_past_the_timeout() -> None:
    """A server that never answers: degraded after the 0.3s timeout of the session's open."""
    with silent_listener() as port, ferryman.Client(f"127.0.0.1:{port}", timeout=0.3) as c:
        start = time.monotonic()
        with c.hold_copy("holds", {"tenant": "x"}, max_wait=10) as hold:
            elapsed = time.monotonic() - start
            assert hold.success and hold.degraded and hold.copies == 1
        assert 0.25 <= elapsed < 0.8
        start = time.monotonic()
    assert time.monotonic() - start < 0.8  # closing does not wait either


def test_failing_closed_raises_service_unavailable() -> None:
    """fail_open=False: hold_copy and seize_copy raise instead of granting locally."""
    with ferryman.Client(f"127.0.0.1:{refused_port()}", fail_open=False) as c:
        with (
            pytest.raises(ServiceUnavailableError, match="UNAVAILABLE"),
            c.hold_copy("holds", {"tenant": "x"}),
        ):
            pass
        with pytest.raises(ServiceUnavailableError), c.seize_copy("id"):
            pass
        assert c.stats().errors == 2


def test_kill_switch_grants_min_copies_and_holds_nothing(
    target: str, other: ferryman.Client
) -> None:
    """A rejection becomes an overridden grant of min_copies, at once; nothing is held."""
    with (
        other.hold_copy("holds", {"tenant": "t13"}, copies=5),
        ferryman.Client(target, kill_switch=True) as c,
    ):
        start = time.monotonic()
        with c.hold_copy("holds", {"tenant": "t13"}, copies=3, min_copies=1, max_wait=5) as h:
            assert time.monotonic() - start < 0.5
            assert h.success and h.overridden and h.copies == 1 and not h.held
            assert h.context is not None and h.context.granted == 0
            assert h.context.tenant_held == 5
            tid = h.transfer(1, ttl=5)
        with c.seize_copy(tid) as passed:
            assert passed.overridden and not passed.degraded and passed.copies == 1
        assert c.stats().overridden == 2
    assert probe(other, "t13") == 0  # nothing was held for the overridden grants


# Several resources at once (paper 3.3).


def resources(user: str, gpu: str = "g") -> list[ferryman.Resource]:
    """A copy-limited tenant and gpu, and a rate-limited api user (given first on purpose)."""
    return [
        ferryman.Resource("holds", {"api": user}, rate_limited=True),
        ferryman.Resource("holds", {"tenant": user}),
        ferryman.Resource("holds", {"gpu": gpu}),
    ]


def test_multi_resource_success_releases_everything_on_exit(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """Two copies of each: both copy-limited holds, two api hits; all given back on exit."""
    with client.hold_resources(resources("m1", "g1"), copies=2) as got:
        assert got.success and got.copies == 2 and got.failed is None
        assert [h.copies for h in got.holds] == [2, 2]
        assert [h.descriptor for h in got.holds] == [(("tenant", "m1"),), (("gpu", "g1"),)]
        assert got.rate is not None and got.rate.copies == 2
        assert probe(other, "m1") == 2 and probe(other, "g1", "gpu") == 2
    assert probe(other, "m1") == 0 and probe(other, "g1", "gpu") == 0


def test_multi_resource_trims_to_the_shortest_resource(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """gpu has one copy left: tenant's surplus is released and one api hit is asked."""
    with other.hold_copy("holds", {"gpu": "g2"}, copies=2):
        with client.hold_resources(resources("m2", "g2"), copies=3, min_copies=1) as got:
            assert got.success and got.copies == 1
            assert [h.copies for h in got.holds] == [1, 1]
            assert probe(other, "m2") == 1
            assert got.rate is not None and got.rate.copies == 1
        with client.hold_resources(resources("m2b", "g3"), copies=3, min_copies=1) as got:
            assert got.copies == 2  # the api tier grants two hits a second
            assert [h.copies for h in got.holds] == [2, 2] and probe(other, "m2b") == 2


def test_multi_resource_failure_releases_what_was_held(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """A full gpu, or a spent api tier: nothing stays held and the result names the culprit."""
    with (
        other.hold_copy("holds", {"gpu": "g4"}, copies=3),
        client.hold_resources(resources("m4", "g4"), copies=2, min_copies=1) as got,
    ):
        assert not got.success and got.copies == 0 and got.holds == ()
        assert got.failed == ferryman.Resource("holds", {"gpu": "g4"})
        assert probe(other, "m4") == 0
    assert client.request_rate("holds", {"api": "m5"}, copies=2).success
    with client.hold_resources(resources("m5", "g5"), copies=1) as got:
        assert not got.success and got.failed is not None and got.failed.rate_limited
        assert got.rate is not None and not got.rate.success
        assert probe(other, "m5") == 0 and probe(other, "g5", "gpu") == 0


def test_multi_resource_releases_when_the_block_raises(
    client: ferryman.Client, other: ferryman.Client
) -> None:
    """An exception in the block, or a client error midway: every hold is given back."""
    with pytest.raises(KeyError), client.hold_resources(resources("m6", "g6")[1:], copies=2):
        raise KeyError("boom")
    assert probe(other, "m6") == 0 and probe(other, "g6", "gpu") == 0
    unknown = [*resources("m7")[1:2], ferryman.Resource("holds", {"nope": "x"})]
    with pytest.raises(NotFoundError), client.hold_resources(unknown, copies=2):
        pass
    assert probe(other, "m7") == 0  # the first resource's hold did not outlive the error


def test_multi_resource_validation(client: ferryman.Client) -> None:
    """Two rate-limited resources, none at all, or a non-Resource: refused before any call."""
    rated = ferryman.Resource("holds", {"api": "x"}, rate_limited=True)
    with pytest.raises(ValueError, match="at most one"), client.hold_resources([rated, rated]):
        pass
    with pytest.raises(ValueError, match="at least one"), client.hold_resources([]):
        pass
    with pytest.raises(TypeError), client.hold_resources([("holds", {"a": "b"})]):  # type: ignore[list-item]
        pass
    assert client.stats().calls == 0


# The asyncio client.


def test_async_hold_release_transfer_and_seize(target: str, other: ferryman.Client) -> None:
    """async with: partial release, a transfer seized by another async client, release on exit."""

    async def main() -> list[int]:
        seen: list[int] = []
        async with (
            ferryman.AsyncClient(target, timeout=5) as a,
            ferryman.AsyncClient(target, timeout=5) as b,
        ):
            async with a.hold_copy("holds", {"tenant": "a1"}, copies=5) as hold:
                assert hold.success and hold.held and hold.groups == ()
                await hold.release(1)
                seen.append(await asyncio.to_thread(probe, other, "a1"))
                tid = await hold.transfer(2, ttl=30)
                async with b.seize_copy(tid) as seized:
                    assert seized.copies == 2 and seized.held
                    seen.append(await asyncio.to_thread(probe, other, "a1"))
                    with pytest.raises(NotFoundError):
                        async with b.seize_copy(tid):
                            pass
                seen.append(await asyncio.to_thread(probe, other, "a1"))
            seen.append(await asyncio.to_thread(probe, other, "a1"))
            assert a.stats().sessions == 1
        return seen

    assert run(main()) == [4, 4, 2, 0]


def test_async_hold_is_released_when_the_block_raises_or_is_cancelled(
    target: str, other: ferryman.Client
) -> None:
    """An exception or a cancellation inside async with: the copies are given back."""

    async def main() -> None:
        async with ferryman.AsyncClient(target, timeout=5) as a:
            with pytest.raises(ZeroDivisionError):
                async with a.hold_copy("holds", {"tenant": "a2"}, copies=3):
                    _ = 1 / 0

            async def hold_forever() -> None:
                async with a.hold_copy("holds", {"tenant": "a2"}, copies=2):
                    await asyncio.sleep(600)

            task = asyncio.create_task(hold_forever())
            await asyncio.sleep(0.3)
            assert await asyncio.to_thread(probe, other, "a2") == 2
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(probe, other, "a2") == 0

    run(main())


def test_async_concurrent_holds_share_one_session(target: str) -> None:
    """Eight tasks hold one copy each at the same time: five get one, over one session."""

    async def main() -> tuple[list[bool], int]:
        barrier = asyncio.Barrier(8)
        async with ferryman.AsyncClient(target, timeout=5) as a:

            async def work() -> bool:
                async with a.hold_copy("holds", {"tenant": "a5"}) as hold:
                    await barrier.wait()
                    return hold.success

            results = await asyncio.gather(*(work() for _ in range(8)))
            return sorted(results), a.stats().sessions

    assert run(main()) == ([False] * 3 + [True] * 5, 1)


def test_async_multi_resource_and_kill_switch(target: str, other: ferryman.Client) -> None:
    """hold_resources trims to the rate-limited grant; the kill switch overrides a full gpu."""

    async def main() -> None:
        async with ferryman.AsyncClient(target, timeout=5) as a:
            async with a.hold_resources(resources("a3", "g7"), copies=3, min_copies=1) as got:
                assert got.success and got.copies == 2
                assert [h.copies for h in got.holds] == [2, 2]
                assert await asyncio.to_thread(probe, other, "a3") == 2
            assert await asyncio.to_thread(probe, other, "a3") == 0
            with pytest.raises(ValueError, match="at most one"):
                async with a.hold_resources(resources("x") + resources("y")):
                    pass
            async with a.hold_copy("holds", {"gpu": "g8"}, copies=3):
                a.kill_switch = True
                async with a.hold_copy("holds", {"gpu": "g8"}) as extra:
                    assert extra.overridden and extra.copies == 1 and not extra.held

    run(main())


def test_async_degraded_and_session_closing(target: str, other: ferryman.Client) -> None:
    """Server down or silent: a degraded grant within the timeout; aclose() frees holds."""

    async def degraded(port: int, seconds: float) -> float:
        async with ferryman.AsyncClient(f"127.0.0.1:{port}", timeout=seconds) as down:
            start = time.monotonic()
            async with down.hold_copy("holds", {"tenant": "x"}, copies=3, min_copies=2) as h:
                assert h.success and h.degraded and h.copies == 2 and not h.held
            return time.monotonic() - start

    async def main() -> None:
        assert await degraded(refused_port(), 2) < 2
        with silent_listener() as port:
            assert 0.25 <= await degraded(port, 0.3) < 0.8
        a = ferryman.AsyncClient(target, timeout=5)
        async with a.hold_copy("holds", {"tenant": "a4"}, copies=3) as hold:
            assert await asyncio.to_thread(probe, other, "a4") == 3
            await a.aclose()
            for _ in range(100):
                if await asyncio.to_thread(probe, other, "a4") == 0:
                    break
                await asyncio.sleep(0.02)
            assert await asyncio.to_thread(probe, other, "a4") == 0
            assert hold.lost

    run(main())
