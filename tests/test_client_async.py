"""ferryman.AsyncClient and the grpc.aio interceptor against a real ferryman server."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TypeVar, cast

import grpc
import grpc.aio
import pytest

import ferryman
from ferryman.errors import NotFoundError, RequestError, ServiceUnavailableError

from helpers.client_domain import CLIENT_CONFIG, ECHO, Echo, route_echo
from helpers.ports import refused_port, silent_listener
from helpers.server import ConfigDir, ServerFactory

T = TypeVar("T")


def run(coro: Coroutine[object, object, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def target(config_dir: ConfigDir, make_server: ServerFactory) -> str:
    """A ferryman server on the system clock with the client test domain."""
    config_dir.write("client.yaml", CLIENT_CONFIG)
    server = make_server(real_clock=True)
    return f"127.0.0.1:{server.service.grpc_port}"


def test_async_backoff_waits_and_succeeds_when_capacity_frees_up(target: str) -> None:
    """Two hits fill the 2/s tier; one more with max_wait=3 is awaited for about a second."""

    async def main() -> ferryman.RateResult:
        async with ferryman.AsyncClient(target, timeout=5) as client:
            assert (await client.request_rate("client", {"tight": "a1"}, copies=2)).success
            return await client.request_rate("client", {"tight": "a1"}, max_wait=3)

    result = run(main())
    assert result.success and result.copies == 1 and result.attempts == 2
    assert 0.9 <= result.waited < 1.6


def test_async_backoff_gives_up_on_time(target: str) -> None:
    """A node that never grants: max_wait=1 is spent, within +-25%, in two or three attempts."""

    async def main() -> tuple[ferryman.RateResult, float]:
        async with ferryman.AsyncClient(target, timeout=5) as client:
            start = time.monotonic()
            result = await client.request_rate("client", {"shut": "a2"}, max_wait=1)
            return result, time.monotonic() - start

    result, elapsed = run(main())
    assert not result.success and result.copies == 0
    # jitter(1) in [0.75, 1.25): cut to what is left of the second or not, then the rest.
    assert result.attempts in (2, 3)
    assert 0.75 <= elapsed <= 1.25


def test_async_concurrent_requests_share_one_limit(target: str) -> None:
    """Five concurrent one-hit requests on a 2/s tier: exactly two are granted."""

    async def main() -> list[ferryman.RateResult]:
        async with ferryman.AsyncClient(target, timeout=5) as client:
            return await asyncio.gather(
                *(client.request_rate("client", {"tight": "a3"}) for _ in range(5))
            )

    assert sorted(r.success for r in run(main())) == [False] * 3 + [True] * 2


def test_async_should_rate_limit_answers_with_statuses(target: str) -> None:
    """ShouldRateLimit through the async client: OK, then OVER_LIMIT as an answer."""

    async def main() -> list[ferryman.RateLimitResult]:
        async with ferryman.AsyncClient(target, timeout=5) as client:
            return [
                await client.should_rate_limit("client", [{"fixed": "a4"}], hits=2),
                await client.should_rate_limit("client", [{"fixed": "a4"}]),
            ]

    ok, over = run(main())
    assert ok.ok and ok.statuses[0].limit == ferryman.RateLimit(2, "minute", "fixed_two")
    assert over.code is ferryman.Code.OVER_LIMIT


def test_async_degraded_grant_when_the_server_is_down_or_silent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refused or silent: min_copies granted, degraded=True, logged, within the timeout."""
    caplog.set_level(logging.WARNING, logger="ferryman.client")

    async def main(port: int) -> tuple[ferryman.RateResult, float]:
        async with ferryman.AsyncClient(f"127.0.0.1:{port}", timeout=0.3) as client:
            start = time.monotonic()
            result = await client.request_rate("client", {"tight": "x"}, copies=4, min_copies=3)
            return result, time.monotonic() - start

    refused, quick = run(main(refused_port()))
    with silent_listener() as port:
        silent, slow = run(main(port))
    for result in (refused, silent):
        assert result.success and result.degraded and result.copies == 3
    assert quick < 0.3
    assert 0.25 <= slow < 0.8
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "UNAVAILABLE" in logged and "DEADLINE_EXCEEDED" in logged


def test_async_failing_closed_raises_service_unavailable() -> None:
    """fail_open=False: an unreachable service raises ServiceUnavailableError."""

    async def main() -> None:
        target = f"127.0.0.1:{refused_port()}"
        async with ferryman.AsyncClient(target, fail_open=False) as client:
            await client.should_rate_limit("client", [{"fixed": "x"}])

    with pytest.raises(ServiceUnavailableError, match="UNAVAILABLE"):
        run(main())


def test_async_client_errors_raise(target: str) -> None:
    """NOT_FOUND and INVALID_ARGUMENT answers raise NotFoundError and RequestError."""

    async def main() -> None:
        async with ferryman.AsyncClient(target) as client:
            with pytest.raises(NotFoundError, match="unknown domain"):
                await client.request_rate("nope", {"tight": "x"})
            with pytest.raises(RequestError, match="rate_limit"):
                await client.request_rate("client", {"fixed": "x"})

    run(main())


def test_async_kill_switch_grants_and_reports(target: str) -> None:
    """With the kill switch a rejection is granted at once, flagged overridden and counted."""

    async def main() -> tuple[ferryman.RateResult, ferryman.ClientStats]:
        async with ferryman.AsyncClient(target, kill_switch=True) as client:
            await client.request_rate("client", {"closed": "a5"})
            result = await client.request_rate("client", {"closed": "a5"}, max_wait=5)
            return result, client.stats()

    start = time.monotonic()
    result, stats = run(main())
    assert time.monotonic() - start < 1
    assert result.success and result.overridden and result.copies == 1
    assert (stats.granted, stats.overridden, stats.rejected) == (1, 1, 0)


def test_async_client_made_outside_a_loop_works_inside_one(target: str) -> None:
    """The channel opens on first use in the running loop; after aclose() calls are refused."""
    client = ferryman.AsyncClient(target)

    async def main() -> None:
        assert (await client.request_rate("client", {"tight": "a6"})).success
        await client.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await client.request_rate("client", {"tight": "a6"})

    run(main())


def test_aio_interceptor_refuses_calls_over_the_limit(target: str, echo: Echo) -> None:
    """On a grpc.aio channel: two calls of one user pass, the third raises before leaving."""

    async def main() -> ferryman.RateLimitedError:
        async with ferryman.AsyncClient(target) as client:
            interceptor = ferryman.AsyncRateLimitInterceptor(client, route_echo)
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{echo.port}",
                interceptors=[cast("grpc.aio.ClientInterceptor", interceptor)],
            ) as channel:
                say = channel.unary_unary(ECHO, None, None)
                assert await say(b"eve", timeout=5) == b"echo:eve"
                assert await say(b"eve", timeout=5) == b"echo:eve"
                with pytest.raises(ferryman.RateLimitedError) as info:
                    await say(b"eve", timeout=5)
                other = channel.unary_unary("/test.Echo/Other", None, None)
                with pytest.raises(grpc.RpcError) as unrouted:
                    await other(b"eve", timeout=5)
                assert unrouted.value.code() is grpc.StatusCode.UNIMPLEMENTED
                return info.value

    error = run(main())
    assert (error.method, error.descriptor) == (ECHO, (("tight", "eve"),))
    assert echo.calls == 2
