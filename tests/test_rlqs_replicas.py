"""Two ``ferryman serve`` replicas on one real Redis share a quota bucket's rate between the
Envoys of both: each leases its part from the elected capacity master."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.rate_limit_quota.v3 import rlqs_pb2

from helpers.capacity import Ferryman, Fleet
from helpers.redis_procs import RedisProcess
from helpers.server import ConfigDir, wait_for

pytestmark = pytest.mark.redis

CONFIG = """
domain: quota
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 20}
"""
STREAM = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"


class FakeEnvoy:
    """A quota stream to one replica reporting ``per_second`` requests on ``tenant=acme``
    every ``every`` seconds (as 5 s of usage each), keeping the last token bucket assigned."""

    def __init__(self, replica: Ferryman, name: str, per_second: int, every: float) -> None:
        self.rate: float | None = None
        self._reports: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        call = replica.channel.stream_stream(
            STREAM,
            rlqs_pb2.RateLimitQuotaUsageReports.SerializeToString,
            rlqs_pb2.RateLimitQuotaResponse.FromString,
        )
        self._responses = call(iter(self._reports.get, None), metadata=(("ferryman-envoy", name),))
        usage = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage(
            bucket_id=rlqs_pb2.BucketId(bucket={"tenant": "acme"}),
            num_requests_allowed=per_second * 5,
            time_elapsed={"seconds": 5},
        )
        self._report = rlqs_pb2.RateLimitQuotaUsageReports(
            domain="quota", bucket_quota_usages=[usage]
        )
        self._every = every
        self._threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._read, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        while not self._stop.wait(self._every):
            self._reports.put(self._report)

    def _read(self) -> None:
        try:
            for response in self._responses:
                for action in response.bucket_action:
                    tb = action.quota_assignment_action.rate_limit_strategy.token_bucket
                    if tb.fill_interval.seconds:
                        self.rate = tb.tokens_per_fill.value / tb.fill_interval.seconds
        except grpc.RpcError:
            pass  # cancelled at the end of the test

    def stop(self) -> None:
        self._stop.set()
        self._reports.put(None)
        self._responses.cancel()  # type: ignore[no-untyped-call]
        for thread in self._threads:
            thread.join(5)


@pytest.fixture
def fleet(tmp_path: Path, config_dir: ConfigDir) -> Iterator[Fleet]:
    config_dir.write("quota.yaml", CONFIG)
    fleet = Fleet(tmp_path / "procs", config_dir.path)
    yield fleet
    fleet.close()


def test_envoys_of_two_replicas_share_one_rate(fleet: Fleet, redis_server: RedisProcess) -> None:
    """Envoys wanting 30/s and 10/s, each on its own replica, are assigned about 10/s each:
    together no more than the bucket's 20/s, though each replica alone would give 20."""
    env = {"CACHE_KEY_PREFIX": f"t{uuid.uuid4().hex[:12]}_", "DOORMAN_ELECTION_TERM": "1s"}
    replicas = [fleet.server("--backend", redis_server.url, env=env) for _ in range(2)]
    envoys = [
        FakeEnvoy(replicas[0], "a", 30, 0.3),
        FakeEnvoy(replicas[1], "b", 10, 0.3),
    ]
    try:

        def settled() -> bool:
            a, b = envoys[0].rate, envoys[1].rate
            return a is not None and b is not None and abs(a - 10) <= 1.5 and abs(b - 10) <= 1.5

        wait_for("both Envoys assigned about 10/s", settled, timeout=20)
        # Still so a refresh later: each replica divides only what it leased.
        time.sleep(2.5)
        rates = [e.rate or 0.0 for e in envoys]
        assert sum(rates) <= 20.0, rates
        assert rates == [pytest.approx(10, abs=1.5), pytest.approx(10, abs=1.5)]
    finally:
        for envoy in envoys:
            envoy.stop()
