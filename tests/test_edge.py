"""The server edge: every servicer's calls counted, errors answered from the one table."""

from __future__ import annotations

import grpc
import pytest

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.algorithms.burst.model import BurstOutcome, BurstRequest
from ferryman.backends.memory import MemoryBackend
from ferryman.errors import BackendError
from ferryman.stats import CALL, REQUEST_CALL, total_requests

from helpers.server import MIXED, ConfigDir, ServerFactory, limiter_stub


class FailingBursts:
    """A burst-tier store that is always down."""

    async def decide(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        raise BackendError("connection refused")

    def clear(self) -> None:
        pass


class BurstsDown(MemoryBackend):
    """The memory backend with its burst tiers down."""

    def __init__(self) -> None:
        super().__init__()
        self._stores["burst_tiers"] = FailingBursts()


def rate(channel: grpc.Channel, domain: str, key: str, value: str) -> limiter_pb2.RateResponse:
    stub = limiter_stub(channel)
    request = limiter_pb2.RateRequest(
        domain=domain, descriptor=[limiter_pb2.Entry(key=key, value=value)]
    )
    reply: limiter_pb2.RateResponse = stub.Request(request, timeout=10)
    return reply


def test_limiter_calls_are_counted_per_method(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Limiter calls count under their own method, apart from ShouldRateLimit's counter."""
    config_dir.write("mx.yaml", MIXED)
    server = make_server()
    for _ in range(3):
        assert rate(server.channel, "mx", "tiers", "t").granted == 1
    assert server.stat(total_requests("Request")) == 3
    assert server.stat(total_requests("ShouldRateLimit")) == 0


def test_request_errors_are_answered_and_counted_from_the_table(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """NOT_FOUND and INVALID_ARGUMENT as the table says, each counted as a service error."""
    config_dir.write("mx.yaml", MIXED)
    server = make_server()
    with pytest.raises(grpc.RpcError) as missing:
        rate(server.channel, "nowhere", "tiers", "t")
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as wrong_kind:
        rate(server.channel, "mx", "fixed", "a")
    assert wrong_kind.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "fixed window" in (wrong_kind.value.details() or "")
    assert server.stat(f"{REQUEST_CALL}.service_error") == 2


def test_fail_open_request_is_counted_as_a_degraded_request_not_should_rate_limit(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With FAIL_OPEN a Request whose store is down is granted and counted under Request."""
    config_dir.write("mx.yaml", MIXED)
    server = make_server(backend=BurstsDown(), fail_open=True)
    assert rate(server.channel, "mx", "tiers", "t").granted == 1
    assert server.stat(f"{REQUEST_CALL}.degraded") == 1
    assert server.stat(f"{CALL}.degraded") == 0


def test_fail_closed_request_is_unavailable_and_counted_as_a_backend_error(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Without FAIL_OPEN the same call is UNAVAILABLE, counted as a redis_error of Request."""
    config_dir.write("mx.yaml", MIXED)
    server = make_server(backend=BurstsDown())
    with pytest.raises(grpc.RpcError) as down:
        rate(server.channel, "mx", "tiers", "t")
    assert down.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "rate limit backend" in (down.value.details() or "")
    assert server.stat(f"{REQUEST_CALL}.redis_error") == 1
