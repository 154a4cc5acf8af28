"""ferryman.Client against a real ferryman server on the real clock, plus its pure parts."""

from __future__ import annotations

import inspect
import logging
import re
import shutil
import subprocess
import sys
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

import ferryman
import ferryman.client
from ferryman import cli
from ferryman.client import _protocol
from ferryman.client._backoff import RetrySchedule, jitter
from ferryman.client._models import normalize_descriptor
from ferryman.errors import NotFoundError, RequestError, ServiceUnavailableError

from helpers.client_domain import CLIENT_CONFIG, ECHO, Echo, route_echo
from helpers.ports import refused_port, silent_listener
from helpers.server import ConfigDir, Server, ServerFactory

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def server(config_dir: ConfigDir, make_server: ServerFactory) -> Server:
    """A ferryman server on the system clock with the client test domain."""
    config_dir.write("client.yaml", CLIENT_CONFIG)
    return make_server(real_clock=True, limit_response_headers_enabled=True)


@pytest.fixture
def target(server: Server) -> str:
    return f"127.0.0.1:{server.service.grpc_port}"


@pytest.fixture
def client(target: str) -> Iterator[ferryman.Client]:
    with ferryman.Client(target, timeout=5) as c:
        yield c


@pytest.fixture
def closed_port() -> int:
    return refused_port()


@pytest.fixture
def silent_port() -> Iterator[int]:
    with silent_listener() as port:
        yield port


class FakeTime:
    """A monotonic clock that only sleeps move."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# The retry schedule, pure.


def test_jitter_stays_within_a_quarter_either_side() -> None:
    """jitter(v) covers [v - v/4, v + v/4): the lowest draw gives 3v/4, the highest under 5v/4."""
    assert jitter(4.0, lambda: 0.0) == 3.0
    assert jitter(4.0, lambda: 0.5) == 4.0
    assert 4.999 < jitter(4.0, lambda: 0.9999) < 5.0


def test_schedule_doubles_and_is_cut_at_max_wait() -> None:
    """Sleeps are jitter(1), jitter(2), jitter(4)... until the last fills max_wait, then None."""
    clock = FakeTime()
    schedule = RetrySchedule(10.0, draw=lambda: 0.0, monotonic=clock)
    sleeps = []
    while (delay := schedule.next_delay()) is not None:
        sleeps.append(delay)
        clock.now += delay
    assert sleeps == [0.75, 1.5, 3.0, 4.75]  # 0.75 + 1.5 + 3 = 5.25; 6 is cut to 4.75
    assert schedule.elapsed == 10.0


def test_schedule_waits_for_retry_after_but_never_past_max_wait() -> None:
    """retry_after raises a sleep to it; a retry_after beyond max_wait is cut to what is left."""
    clock = FakeTime()
    schedule = RetrySchedule(5.0, draw=lambda: 0.5, monotonic=clock)
    assert schedule.next_delay(retry_after=0.2) == 1.0  # the schedule's own sleep is longer
    clock.now += 1.0
    assert schedule.next_delay(retry_after=3.0) == 3.0  # jitter(2) = 2 < 3
    clock.now += 3.0
    assert schedule.next_delay(retry_after=60.0) == 1.0  # only a second of max_wait is left
    clock.now += 1.0
    assert schedule.next_delay(retry_after=0.0) is None


def test_max_wait_zero_never_sleeps() -> None:
    """With the default max_wait of 0 the first rejection is final."""
    assert RetrySchedule(0.0).next_delay() is None


# Values and the error boundary.


def test_descriptor_takes_a_mapping_or_pairs_and_keeps_the_order() -> None:
    """A dict and a list of pairs give the same ordered entries; bad shapes are rejected."""
    pairs = [("b", "1"), ("a", "2")]
    assert normalize_descriptor(dict(pairs)) == normalize_descriptor(pairs) == tuple(pairs)
    with pytest.raises(RequestError, match=r"descriptor\[0\]\.key: must not be empty"):
        normalize_descriptor({"": "x"})
    with pytest.raises(RequestError, match="at least one entry"):
        normalize_descriptor({})
    with pytest.raises(TypeError, match="pair"):
        normalize_descriptor(["ab"])  # type: ignore[list-item]


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK])
def test_every_grpc_status_is_translated(code: grpc.StatusCode) -> None:
    """Client errors become RequestError/NotFoundError (field kept); the rest an outage."""
    error = _protocol.translate(_Failed(code, "descriptor: no node matches"), "h:1")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        assert type(error) is RequestError
    elif code is grpc.StatusCode.NOT_FOUND:
        assert type(error) is NotFoundError
    else:
        assert isinstance(error, ServiceUnavailableError)
        assert (error.target, error.code) == ("h:1", code.name)
        return
    assert error.field == "descriptor"
    assert str(error) == "descriptor: no node matches"


def _annotations(obj: object) -> Iterator[str]:
    if typing.get_origin(obj) is not None:
        yield str(obj)  # a type alias: Route, RouteFunction, DescriptorLike
    elif inspect.isclass(obj):
        for name, member in vars(obj).items():
            if not name.startswith("_") or name == "__init__":
                yield from _annotations(getattr(member, "fget", member))
    elif callable(obj) and hasattr(obj, "__annotations__"):
        yield from (str(a) for a in inspect.get_annotations(obj).values())
    else:
        yield str(obj)


def test_public_api_has_no_any() -> None:
    """No public class, method or type alias of the client mentions Any."""
    for name in ferryman.client.__all__:
        for annotation in _annotations(getattr(ferryman.client, name)):
            assert not re.search(r"\bAny\b", annotation), (name, annotation)
    assert (ROOT / "service" / "ferryman" / "py.typed").exists()


# should_rate_limit against the real server.


def test_should_rate_limit_returns_limits_remaining_reset_and_headers(
    client: ferryman.Client,
) -> None:
    """Each status carries its limit, remaining hits and reset; the headers come along."""
    result = client.should_rate_limit("client", [{"fixed": "a"}, [("outer", "x")]])
    assert result.code is ferryman.Code.OK and result.ok
    fixed, unlimited = result.statuses
    assert fixed.limit == ferryman.RateLimit(2, "minute", "fixed_two")
    assert fixed.remaining == 1
    assert fixed.reset is not None and 0 < fixed.reset <= 60
    assert unlimited.limit is None
    assert dict(result.headers)["RateLimit-Remaining"] == "1"
    assert not result.degraded and not result.overridden


def test_should_rate_limit_over_limit_is_an_answer(client: ferryman.Client) -> None:
    """The third hit of a 2/minute limit is OVER_LIMIT, returned, not raised."""
    assert client.should_rate_limit("client", [{"fixed": "b"}], hits=2).ok
    over = client.should_rate_limit("client", [{"fixed": "b"}])
    assert over.code is ferryman.Code.OVER_LIMIT and not over.ok
    assert over.statuses[0].code is ferryman.Code.OVER_LIMIT
    assert client.stats().rejected == 1


def test_descriptor_order_reaches_the_server(client: ferryman.Client) -> None:
    """{outer, inner} matches the nested 1/hour limit; the same pairs reversed match nothing."""
    nested = client.should_rate_limit("client", [{"outer": "o", "inner": "i"}])
    assert nested.statuses[0].limit == ferryman.RateLimit(1, "hour")
    reversed_ = client.should_rate_limit("client", [[("inner", "i"), ("outer", "o")]])
    assert reversed_.statuses[0].limit is None


def test_one_descriptor_passed_as_descriptors_is_a_type_error(client: ferryman.Client) -> None:
    """A bare list of pairs where a list of descriptors belongs fails before any call."""
    with pytest.raises(TypeError, match="wrap it in a list"):
        client.should_rate_limit("client", [("fixed", "a")])  # type: ignore[list-item]
    assert client.stats().calls == 0


# request_rate: backoff on the real clock.


def test_backoff_waits_and_succeeds_when_capacity_frees_up(client: ferryman.Client) -> None:
    """Two hits fill the 2/s tier; one more with max_wait=3 gets in after about a second."""
    assert client.request_rate("client", {"tight": "u1"}, copies=2).copies == 2
    start = time.monotonic()
    result = client.request_rate("client", {"tight": "u1"}, max_wait=3)
    elapsed = time.monotonic() - start
    assert result.success and result.copies == 1
    assert result.attempts == 2
    # The first rejection said retry_after ~1s; the client did not wake before it.
    assert 0.9 <= result.waited <= elapsed < 1.6
    assert client.stats().retries == 1


def test_backoff_gives_up_on_time_when_nothing_frees_up(client: ferryman.Client) -> None:
    """A node that never grants: the schedule fills max_wait=1.5 exactly, in three attempts."""
    start = time.monotonic()
    result = client.request_rate("client", {"shut": "u2"}, max_wait=1.5)
    elapsed = time.monotonic() - start
    assert not result.success and result.copies == 0
    # Schedule: jitter(1) in [0.75, 1.25), then min(1.5 - elapsed, jitter(2) >= 1.5), then
    # 1.5 - elapsed <= 0: stop. Expected total 1.5s; allow +-25%.
    assert result.attempts == 3
    assert 1.5 * 0.75 <= elapsed <= 1.5 * 1.25
    assert result.context is not None and result.context.retry_after is None


def test_backoff_never_outlasts_max_wait_for_a_distant_retry_after(
    client: ferryman.Client,
) -> None:
    """retry_after is a minute away; max_wait=1 still ends after one second, two attempts."""
    assert client.request_rate("client", {"closed": "u3"}).success
    start = time.monotonic()
    result = client.request_rate("client", {"closed": "u3"}, max_wait=1)
    elapsed = time.monotonic() - start
    assert not result.success
    assert result.attempts == 2
    assert 0.75 <= elapsed <= 1.25
    assert result.context is not None
    assert result.context.retry_after is not None and result.context.retry_after > 50


def test_min_copies_takes_what_there_is(client: ferryman.Client) -> None:
    """copies=5, min_copies=1 on a 2/s tier grants 2, with the server's context."""
    result = client.request_rate("client", [("tight", "u4")], copies=5, min_copies=1)
    assert result.success and result.copies == 2 and result.attempts == 1
    assert result.context is not None and result.context.active_tier_limit == 2


# Failures: degraded mode, failing closed, client errors.


def test_degraded_grant_when_the_server_is_down(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listening: min_copies granted, degraded=True, a warning, no exception, no wait."""
    caplog.set_level(logging.WARNING, logger="ferryman.client")
    with ferryman.Client(f"127.0.0.1:{closed_port}", timeout=2) as c:
        start = time.monotonic()
        result = c.request_rate("client", {"tight": "x"}, copies=5, min_copies=2, max_wait=10)
        checked = c.should_rate_limit("client", [{"fixed": "x"}, {"tight": "x"}])
        elapsed = time.monotonic() - start
        stats = c.stats()
    assert result.success and result.degraded and result.copies == 2
    assert not result.overridden and result.context is None
    assert checked.ok and checked.degraded and len(checked.statuses) == 2
    assert elapsed < 2
    assert stats.degraded == 2
    assert any("UNAVAILABLE" in r.getMessage() for r in caplog.records)


def test_degraded_mode_never_hangs_past_the_timeout(silent_port: int) -> None:
    """A service that accepts and never answers: degraded after the 0.3s timeout, not later."""
    with ferryman.Client(f"127.0.0.1:{silent_port}", timeout=0.3) as c:
        start = time.monotonic()
        result = c.request_rate("client", {"tight": "x"}, max_wait=10)
        elapsed = time.monotonic() - start
    assert result.success and result.degraded and result.copies == 1
    assert 0.25 <= elapsed < 0.8


def test_failing_closed_raises_service_unavailable(closed_port: int, silent_port: int) -> None:
    """fail_open=False turns an outage into ServiceUnavailableError naming target and status."""
    target = f"127.0.0.1:{closed_port}"
    with ferryman.Client(target, fail_open=False) as c:
        with pytest.raises(ServiceUnavailableError) as info:
            c.request_rate("client", {"tight": "x"})
        assert (info.value.target, info.value.code) == (target, "UNAVAILABLE")
        assert c.stats().errors == 1
    silent = f"127.0.0.1:{silent_port}"
    with (
        ferryman.Client(silent, timeout=0.2, fail_open=False) as c,
        pytest.raises(ServiceUnavailableError, match="DEADLINE_EXCEEDED"),
    ):
        c.should_rate_limit("client", [{"fixed": "x"}])


def test_client_errors_raise_even_when_failing_open(client: ferryman.Client) -> None:
    """Unknown domain or descriptor: NotFoundError; not a burst node or bad args: RequestError."""
    with pytest.raises(NotFoundError) as info:
        client.request_rate("nope", {"tight": "x"})
    assert info.value.field == "domain"
    with pytest.raises(NotFoundError, match="descriptor"):
        client.request_rate("client", {"unknown": "x"})
    with pytest.raises(RequestError, match="rate_limit"):
        client.request_rate("client", {"fixed": "x"})
    calls = client.stats().calls
    with pytest.raises(RequestError, match=r"min_copies: 3 is more than copies \(2\)"):
        client.request_rate("client", {"tight": "x"}, copies=2, min_copies=3)
    with pytest.raises(RequestError, match="max_wait"):
        client.request_rate("client", {"tight": "x"}, max_wait=-1)
    assert client.stats().calls == calls  # checked before any call


def test_closed_client_refuses_calls(target: str) -> None:
    """After close(), a call is a RuntimeError, not an outage to degrade."""
    c = ferryman.Client(target)
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.request_rate("client", {"tight": "x"})


# Kill switch.


def test_kill_switch_turns_rejections_into_reported_grants(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Rejections become min_copies grants flagged overridden, at once, logged and counted."""
    caplog.set_level(logging.WARNING, logger="ferryman.client")
    with ferryman.Client(target, kill_switch=True) as c:
        assert not c.request_rate("client", {"closed": "k"}).overridden  # a real grant
        start = time.monotonic()
        result = c.request_rate("client", {"closed": "k"}, copies=3, min_copies=2, max_wait=5)
        assert time.monotonic() - start < 0.5  # no backoff: the switch grants at once
        assert result.success and result.overridden and result.copies == 2
        assert result.context is not None and result.context.granted == 0
        c.should_rate_limit("client", [{"fixed": "k"}], hits=2)
        over = c.should_rate_limit("client", [{"fixed": "k"}])
        assert over.ok and over.overridden
        assert over.statuses[0].code is ferryman.Code.OVER_LIMIT  # still reported
        assert c.stats().overridden == 2
        c.kill_switch = False
        assert not c.request_rate("client", {"closed": "k"}).success
    assert sum("kill switch" in r.getMessage() for r in caplog.records) == 2


# The interceptor on a real gRPC call.


def test_interceptor_refuses_calls_over_the_limit(client: ferryman.Client, echo: Echo) -> None:
    """Two Say calls of one user pass, the third raises RateLimitedError and never leaves."""
    with grpc.insecure_channel(f"127.0.0.1:{echo.port}") as channel:
        limited = grpc.intercept_channel(channel, ferryman.RateLimitInterceptor(client, route_echo))
        say: Callable[..., bytes] = limited.unary_unary(ECHO, None, None)
        assert say(b"ann", timeout=5) == b"echo:ann"
        assert say(b"ann", timeout=5) == b"echo:ann"
        with pytest.raises(ferryman.RateLimitedError) as info:
            say(b"ann", timeout=5)
        assert say(b"bob", timeout=5) == b"echo:bob"  # another user, another tenant
        other: Callable[..., bytes] = limited.unary_unary("/test.Echo/Other", None, None)
        with pytest.raises(grpc.RpcError) as unrouted:
            other(b"ann", timeout=5)  # unrouted: reaches the server (which lacks it)
    error = info.value
    assert (error.method, error.domain, error.descriptor) == (ECHO, "client", (("tight", "ann"),))
    assert error.retry_after is not None and 0 < error.retry_after <= 1
    assert unrouted.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert echo.calls == 3


def test_interceptor_wait_is_capped_by_the_call_timeout(
    client: ferryman.Client, echo: Echo
) -> None:
    """max_wait=5 but the call's timeout is 0.5s: refused after about 0.5s, not 1s or 5s."""
    interceptor = ferryman.RateLimitInterceptor(client, route_echo, max_wait=5)
    with grpc.insecure_channel(f"127.0.0.1:{echo.port}") as channel:
        say: Callable[..., bytes] = grpc.intercept_channel(channel, interceptor).unary_unary(
            ECHO, None, None
        )
        say(b"cy", timeout=5)
        say(b"cy", timeout=5)
        start = time.monotonic()
        with pytest.raises(ferryman.RateLimitedError):
            say(b"cy", timeout=0.5)
        assert 0.4 <= time.monotonic() - start < 0.9
    assert echo.calls == 2


def test_interceptor_lets_calls_through_when_ferryman_is_down(closed_port: int, echo: Echo) -> None:
    """A fail-open client's degraded grant lets the intercepted call go ahead."""
    with (
        ferryman.Client(f"127.0.0.1:{closed_port}") as down,
        grpc.insecure_channel(f"127.0.0.1:{echo.port}") as channel,
    ):
        limited = grpc.intercept_channel(channel, ferryman.RateLimitInterceptor(down, route_echo))
        say: Callable[..., bytes] = limited.unary_unary(ECHO, None, None)
        assert [say(b"dan", timeout=5) for _ in range(3)] == [b"echo:dan"] * 3
    assert echo.calls == 3


# `ferryman query`.


def test_query_prints_each_status_and_exits_by_overall_code(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """OK exits 0, OVER_LIMIT exits 1; overall code, every status and the headers are printed."""
    args = ["query", "--target", target, "--domain", "client", "--descriptor", "fixed=q"]
    assert cli.main([*args, "--descriptor", "outer=o,inner=i"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "overall: OK"
    assert re.fullmatch(
        r"descriptor\[0\] fixed=q: OK, limit 2/minute \(fixed_two\), remaining 1, "
        r"resets in [\d.]+s",
        out[1],
    )
    assert re.fullmatch(
        r"descriptor\[1\] outer=o,inner=i: OK, limit 1/hour, remaining 0, resets in [\d.]+s",
        out[2],
    )
    assert "header RateLimit-Remaining: 0" in out[3:]
    assert cli.main([*args, "--hits", "2"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "overall: OVER_LIMIT"
    assert out[1].startswith("descriptor[0] fixed=q: OVER_LIMIT, limit 2/minute (fixed_two)")


def test_query_target_defaults_to_grpc_port(
    server: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --target, query asks 127.0.0.1:$GRPC_PORT; a descriptor without a limit is OK."""
    monkeypatch.setenv("GRPC_PORT", str(server.service.grpc_port))
    assert cli.main(["query", "--domain", "client", "--descriptor", "outer=x"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "overall: OK",
        "descriptor[0] outer=x: OK, no limit",
    ]


def test_query_errors_exit_2(
    target: str, closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreachable service, a request the service rejects, a malformed flag: exit 2."""
    down = ["query", "--target", f"127.0.0.1:{closed_port}", "--timeout", "2"]
    assert cli.main([*down, "--domain", "client", "--descriptor", "fixed=a"]) == 2
    assert "UNAVAILABLE" in capsys.readouterr().err
    bad = ["query", "--target", target, "--domain", "client", "--descriptor", "=a"]
    with pytest.raises(SystemExit) as info:
        cli.main(bad)
    assert info.value.code == 2
    assert "'=a' is not key=value" in capsys.readouterr().err
    empty_key = ["query", "--target", target, "--domain", "", "--descriptor", "fixed=a"]
    assert cli.main(empty_key) == 2
    assert "domain: must not be empty" in capsys.readouterr().err


# Examples.

EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))


def test_examples_run_against_a_real_server(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Every program in examples/ exits 0 against a server loading descriptors/."""
    for source in (ROOT / "descriptors").glob("*.y*ml"):
        shutil.copy(source, config_dir.path / source.name)
    server = make_server(real_clock=True)
    target = f"127.0.0.1:{server.service.grpc_port}"
    assert {
        "grpc_interceptor.py",
        "hold_copy.py",
        "request_rate.py",
        "should_rate_limit.py",
        "transfer.py",
    } <= set(EXAMPLES)
    # In parallel: each waits on the real clock for about a second.
    runs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / name), target],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in EXAMPLES
    }
    outputs = {name: run.communicate(timeout=60) for name, run in runs.items()}
    for name, run in runs.items():
        out, err = outputs[name]
        assert run.returncode == 0, f"{name} exited {run.returncode}:\n{out}\n{err}"
        assert "degraded" not in out, f"{name}:\n{out}"
    assert "message 6: OVER_LIMIT" in outputs["should_rate_limit.py"][0]
    assert "success=True granted 1" in outputs["request_rate.py"][0]
    assert "call 6: refused" in outputs["grpc_interceptor.py"][0]
    held = outputs["hold_copy.py"][0]
    assert "released 1 early, holding 2" in held
    assert "afterwards all 4 copies are free again: success=True" in held
    assert "multi-resource: success=True copies=2 (held [2], hits 2)" in held
    transfer = outputs["transfer.py"][0].splitlines()
    assert transfer == [
        "process 1: holds 4 copies",
        "process 1: staged 3 for process 2, has 1",
        transfer[2],
        "process 2: released 1, has 2 until its block ends",
        "process 1: process 2 had 2 left and exited 0",
        "process 1: still has 1",
    ]
    assert re.fullmatch(r"process 2: seized 3 copies of workers customer=example-\w+", transfer[2])
