"""Client.allow and AsyncClient.allow against a real ferryman server on the system clock."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

import ferryman
from ferryman.errors import RequestError, ServiceUnavailableError

from helpers.server import ConfigDir, ServerFactory

QUOTA = """
namespaces:
  api:
    buckets:
      slow: {size: 1, fill_rate: 5, wait_timeout_millis: 1000}
      none: {size: 1, fill_rate: 0.001, max_tokens_per_request: 1}
"""


@pytest.fixture
def target(config_dir: ConfigDir, make_server: ServerFactory) -> str:
    config_dir.write("quota.yaml", QUOTA)
    server = make_server(real_clock=True)
    return f"127.0.0.1:{server.service.grpc_port}"


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_allow_sleeps_the_granted_wait(target: str) -> None:
    """The third token of a 1-token, 5/s bucket is granted with a wait that allow sleeps."""
    with ferryman.Client(target) as client:
        assert client.allow("api", "slow").waited == 0
        assert client.allow("api", "slow").waited == 0  # borrows the next token
        start = time.monotonic()
        third = client.allow("api", "slow")
        elapsed = time.monotonic() - start
    assert third.granted and third.status == "OK" and third.tokens == 1
    assert 0.1 < third.waited <= 0.2
    assert elapsed >= third.waited


def test_allow_refusals_are_answers(target: str) -> None:
    """A timeout (here forced by max_wait) and a missing bucket come back as results."""
    with ferryman.Client(target) as client:
        assert client.allow("api", "none").granted
        refused = client.allow("api", "none", max_wait=0.5)
        assert (refused.granted, refused.status, refused.tokens) == (False, "REJECTED_TIMEOUT", 0)
        assert client.allow("api", "none", tokens=2).status == "REJECTED_TOO_MANY_TOKENS_REQUESTED"
        assert client.allow("other", "x").status == "REJECTED_NO_BUCKET"
        assert client.stats().rejected == 3


def test_allow_checks_names_before_calling(target: str) -> None:
    """A malformed name or a negative count raises RequestError without a call."""
    with ferryman.Client(target) as client:
        with pytest.raises(RequestError):
            client.allow("a-b", "x")
        with pytest.raises(RequestError):
            client.allow("api", "slow", tokens=-1)
        assert client.stats().calls == 0


def test_allow_without_a_service_degrades_or_raises() -> None:
    """No service: fail_open grants locally (degraded); fail closed raises."""
    target = f"127.0.0.1:{unused_port()}"
    with ferryman.Client(target, timeout=0.5) as client:
        result = client.allow("api", "slow", tokens=3)
        assert result.granted and result.degraded and result.tokens == 3
    closed = ferryman.Client(target, timeout=0.5, fail_open=False)
    with closed, pytest.raises(ServiceUnavailableError):
        closed.allow("api", "slow")


def test_async_allow_awaits_the_granted_wait(target: str) -> None:
    """AsyncClient.allow awaits the wait before returning, as the blocking client sleeps."""

    async def main() -> list[ferryman.AllowResult]:
        async with ferryman.AsyncClient(target) as client:
            return [await client.allow("api", "slow") for _ in range(3)]

    start = time.monotonic()
    results = asyncio.run(main())
    elapsed = time.monotonic() - start
    assert [r.status for r in results] == ["OK", "OK", "OK"]
    assert results[0].waited == 0 and 0.1 < results[2].waited <= 0.2
    assert elapsed >= results[2].waited
