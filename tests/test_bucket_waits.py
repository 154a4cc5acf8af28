"""Waits for ferryman.v1 callers: ``Limiter.Request`` on a token-bucket node grants hits
after a wait when the caller offers one (``max_wait``), over the real gRPC server on
memory, Redis and a Redis Cluster; the Python client sleeps the wait before returning."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

import ferryman
from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.clock import ManualClock

from helpers.server import EPOCH, ConfigDir, Server, ServerFactory, limiter_stub
from helpers.stores import on_stores

CONFIG = """
domain: w
descriptors:
  - key: job
    token_bucket: {size: 2, fill_rate: 10, max_debt_millis: 1000, wait_timeout_millis: 300}
  - key: strict
    token_bucket: {size: 1, fill_rate: 1}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 1}
"""


def ask(
    server: Server, key: str, copies: int = 1, max_wait_ms: int = 0, min_copies: int | None = None
) -> limiter_pb2.RateResponse:
    request = limiter_pb2.RateRequest(
        domain="w", descriptor=[limiter_pb2.Entry(key=key, value="t")], copies=copies
    )
    if min_copies is not None:
        request.min_copies = min_copies
    if max_wait_ms:
        request.max_wait.FromMilliseconds(max_wait_ms)
    reply: limiter_pb2.RateResponse = limiter_stub(server.channel).Request(request, timeout=10)
    return reply


@on_stores()
def test_a_caller_that_offers_to_wait_is_granted_after_the_debt_ahead_of_it(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """2 tokens, 10 per second: two now, the third borrows (no wait: nobody is ahead of it),
    the fourth waits 100 ms for that debt when it may wait, and is refused when it may not
    or when the wait would be beyond the node's 300 ms."""
    config_dir.write("w.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    first = ask(server, "job", copies=2)
    assert first.granted == 2 and not first.HasField("wait")
    assert first.tokens_remaining == 0
    borrowed = ask(server, "job")
    assert borrowed.granted == 1 and not borrowed.HasField("wait")
    refused = ask(server, "job")
    assert refused.granted == 0
    assert refused.retry_after.ToMilliseconds() == 200  # 100 ms of debt, then a token
    waited = ask(server, "job", max_wait_ms=1000)
    assert waited.granted == 1
    assert waited.wait.ToMilliseconds() == 100
    # Each caller waits for those ahead of it, up to the node's 300 ms.
    assert ask(server, "job", max_wait_ms=1000).wait.ToMilliseconds() == 200
    assert ask(server, "job", max_wait_ms=1000).wait.ToMilliseconds() == 300
    assert ask(server, "job", max_wait_ms=1000).granted == 0
    stat = "ratelimit.service.rate_limit.w.job"
    assert server.stat(f"{stat}.served_with_wait") == 3
    assert server.stat(f"{stat}.within_limit") == 6
    assert server.stat(f"{stat}.over_limit") == 2


def test_min_copies_and_requests_that_can_never_pass(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """min_copies is tried when copies are refused; more than the size with no debt has no
    retry_after; a fixed-window node is still an error for Request."""
    config_dir.write("w.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    never = ask(server, "strict", copies=3)
    assert never.granted == 0 and not never.HasField("retry_after")
    some = ask(server, "strict", copies=3, min_copies=1)
    assert some.granted == 1
    with pytest.raises(grpc.RpcError) as err:
        ask(server, "window")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not burst tiers or token bucket" in (err.value.details() or "")


def test_the_client_sleeps_the_wait_and_the_async_client_awaits_it(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    config_dir.write("w.yaml", CONFIG)
    server = make_server(real_clock=True)
    target = f"127.0.0.1:{server.service.grpc_port}"
    with ferryman.Client(target, timeout=5) as client:
        assert client.request_rate("w", {"job": "c"}, copies=3).success  # 2 + 1 borrowed
        start = time.monotonic()
        result = client.request_rate("w", {"job": "c"}, max_wait=1.0)
        took = time.monotonic() - start
        assert result.success and result.attempts == 1
        assert result.context is not None and result.context.wait is not None
        assert 0.03 < result.context.wait <= 0.1
        assert took >= result.context.wait
        # Without max_wait: refused, then retried only within max_wait (0 here).
        assert not client.request_rate("w", {"job": "c"}).success

    async def run() -> tuple[bool, float | None]:
        async with ferryman.AsyncClient(target, timeout=5) as client:
            await client.request_rate("w", {"job": "a"}, copies=3)
            result = await client.request_rate("w", {"job": "a"}, max_wait=1.0)
            return result.success, result.context.wait if result.context else None

    ok, wait = asyncio.run(run())
    assert ok and wait is not None and wait > 0
