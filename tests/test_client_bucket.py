"""The smart token-bucket client and after-the-fact charges against a real server in process."""

from __future__ import annotations

import asyncio

import pytest

import ferryman
from ferryman.client import BucketStats

from helpers.ports import refused_port
from helpers.server import ConfigDir, Server, ServerFactory

QUOTA = """
namespaces:
  api:
    buckets:
      big: {size: 100000, fill_rate: 1, wait_timeout_millis: 0, max_tokens_per_request: 100000}
      ledger: {size: 1000, fill_rate: 0.001, wait_timeout_millis: 0, max_tokens_per_request: 1000}
      small: {size: 5, fill_rate: 0.001, wait_timeout_millis: 0, max_tokens_per_request: 100}
"""


@pytest.fixture
def server(config_dir: ConfigDir, make_server: ServerFactory) -> Server:
    config_dir.write("quota.yaml", QUOTA)
    return make_server(real_clock=True)


@pytest.fixture
def target(server: Server) -> str:
    return f"127.0.0.1:{server.service.grpc_port}"


def test_one_allow_serves_a_whole_batch_of_local_decisions(target: str) -> None:
    """At a batch of 10,000 and no low water, 30,000 takes cost three Allow calls; the
    reserve never holds more than one batch nor hands out more than the server granted."""
    with ferryman.Client(target, timeout=5) as client:
        bucket = client.bucket("api", "big", batch=10_000, low_water=0)
        assert all(bucket.take(max_wait=5) for _ in range(30_000))
        stats = bucket.stats()
        assert client.stats().calls == stats.refills <= 4  # the last one may be under way
        assert stats.used == 30_000 <= stats.server_tokens <= 40_000
        assert stats.peak <= 10_000 and stats.local == 0


def test_the_reserve_holds_only_what_the_server_granted(target: str) -> None:
    """A 5-token bucket asked for batches of 100 grants 5 and then refuses: takes beyond the
    server's grants are refused, never made up locally."""
    with ferryman.Client(target, timeout=5) as client:
        bucket = client.bucket("api", "small", batch=5, low_water=0)
        got = [bucket.take(max_wait=2) for _ in range(5)]
        assert got == [True] * 5
        assert not bucket.take()
        stats = bucket.stats()
        assert stats.used == stats.server_tokens == 5 and stats.refused == 1


def test_out_of_reach_a_bucket_answers_from_the_fallback() -> None:
    """With no service, takes are answered by the client's fallback limiter."""

    def clock() -> float:
        return 0.0

    client = ferryman.Client(f"127.0.0.1:{refused_port()}", fallback_rate=3, clock=clock)
    with client:
        bucket = client.bucket("api", "big", batch=100)
        answers = [bucket.take(max_wait=5) for _ in range(4)]
        assert answers == [True, True, True, False]
        stats: BucketStats = bucket.stats()
        assert stats.server_tokens == 0 and stats.local == 4


def test_charges_are_sent_in_one_allow_per_bucket_and_kept_when_refused(target: str) -> None:
    """Ten charges flush as one Allow of ten that the server takes from the bucket; a charge
    beyond what a bucket holds stays pending."""
    with ferryman.Client(target, timeout=5, charge_interval=3600) as client:
        for _ in range(10):
            client.charge("api", "ledger")
        client.charge("api", "small", 6)  # more than the bucket holds
        client.flush()
        assert client.stats().calls == 2
        assert client.pending_charges() == {("api", "small"): 6}
        assert not client.allow("api", "ledger", 991).granted
        assert client.allow("api", "ledger", 990).granted


def test_async_bucket_refills_in_a_task(target: str) -> None:
    """AsyncClient.bucket spends its reserve and refills it with one Allow per batch."""

    async def main() -> tuple[int, BucketStats]:
        async with ferryman.AsyncClient(target, timeout=5) as client:
            bucket = client.bucket("api", "big", batch=1000, low_water=0)
            for _ in range(2000):
                assert await bucket.take(max_wait=5)
            return client.stats().calls, bucket.stats()

    calls, stats = asyncio.run(main())
    assert stats.used == 2000 and calls <= 3 and stats.peak <= 1000
