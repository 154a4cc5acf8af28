"""Smooth limits through a real Envoy: envoy/front-proxy.yaml asking a real `ferryman
serve` whose edge-proxy domain puts a token bucket on the client address and a sliding
window on partners."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from envoy_procs import (
    Client,
    Reply,
    front_proxy,
    within,
)

pytestmark = pytest.mark.e2e

SMOOTH = """
domain: edge-proxy
descriptors:
  - key: remote_address
    token_bucket: {size: 5, fill_rate: 2}
  - key: header_match
    value: partner
    sliding_window: {unit: hour, requests_per_unit: 3}
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Envoy's listener port, in front of an upstream, asking ferryman with SMOOTH."""
    with front_proxy(tmp_path_factory.mktemp("smooth"), SMOOTH) as port:
        yield port


def test_a_token_bucket_lets_its_size_through_then_refills_smoothly(proxy: int) -> None:
    """5 tokens, 2 a second, per client address: five pass, the sixth is 429 with the fill
    rate as the limit; 0.6 s later one or two more pass, not a whole bucket's worth."""

    def send(attempt: int) -> list[Reply]:
        with Client(proxy, source=f"127.0.{attempt + 1}.21") as client:
            return [client.get("/") for _ in range(6)]

    replies = within(send, 0.45)
    assert [status for status, _, _ in replies] == [200] * 5 + [429]
    headers = replies[0][1]
    assert headers["x-ratelimit-limit"].startswith("2, 2;w=1")
    assert [h["x-ratelimit-remaining"] for _, h, _ in replies] == ["4", "3", "2", "1", "0", "0"]
    assert replies[5][1]["x-envoy-ratelimited"] == "true"
    assert replies[5][1]["x-ratelimit-reset"] == "1"

    def refill(attempt: int) -> tuple[list[int], list[int]]:
        with Client(proxy, source=f"127.0.{attempt + 11}.21") as client:
            drained = [client.get("/")[0] for _ in range(6)]
            time.sleep(0.6)  # 1.2 tokens more, whatever was left (under one) included
            return drained, [client.get("/")[0] for _ in range(4)]

    drained, after = within(refill, 1.2)
    assert drained == [200] * 5 + [429]
    assert after[0] == 200 and after[-2:] == [429, 429]


def test_a_sliding_window_limits_partners(proxy: int) -> None:
    """Partners (x-plan: partner): 3 an hour on the sliding window, whatever the address."""
    with Client(proxy, source="127.0.8.22") as client:
        statuses = [client.get("/", {"x-plan": "partner"})[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
