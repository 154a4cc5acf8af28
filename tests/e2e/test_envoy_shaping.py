"""Shaping through a real Envoy: envoy/front-proxy.yaml, its rate limit filter's timeout
raised to 3 s, asking a real `ferryman serve` whose edge-proxy domain puts a GCRA of 10 a
second, burst 1, with max_wait 1s on the client address."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envoy_procs import (
    Client,
    front_proxy,
)

pytestmark = pytest.mark.e2e

SHAPED = """
domain: edge-proxy
descriptors:
  - key: remote_address
    gcra: {rate: 10, per: 1s, burst: 1}
    max_wait: 1s
"""
RATELIMIT = "envoy.filters.http.ratelimit"


def _raise_timeout(tree: dict[str, Any], timeout: str) -> None:
    """Every rate limit filter of ``tree`` waits ``timeout`` for ferryman's answer."""
    found = 0
    for listener in tree["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network in chain["filters"]:
                for http_filter in network["typed_config"].get("http_filters", []):
                    if http_filter["name"] == RATELIMIT:
                        http_filter["typed_config"]["timeout"] = timeout
                        found += 1
    assert found, "front-proxy.yaml has no rate limit filter"


def _proxy(workdir: Path, timeout: str) -> contextlib.AbstractContextManager[int]:
    """Envoy's listener port, in front of an upstream, asking ferryman with SHAPED, its
    rate limit filter waiting ``timeout`` for the answer."""
    return front_proxy(workdir, SHAPED, lambda tree: _raise_timeout(tree, timeout))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The proxy, its filter's timeout raised to 3 s (above max_wait)."""
    with _proxy(tmp_path_factory.mktemp("shaping"), "3s") as port:
        yield port


@pytest.fixture(scope="module")
def short_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The proxy, its filter's timeout 0.5 s (under max_wait)."""
    with _proxy(tmp_path_factory.mktemp("short"), "0.5s") as port:
        yield port


def burst(port: int, source: str) -> list[tuple[int, float]]:
    """15 GETs at once from ``source``, each on its own connection: (status, seconds after
    the send) in the order the answers came."""
    answers: list[tuple[int, float]] = []
    lock = threading.Lock()
    start = threading.Event()

    def send() -> None:
        with Client(port, source=source, timeout=10) as client:
            start.wait()
            status, _, _ = client.get("/")
        with lock:
            answers.append((status, time.monotonic() - began))

    threads = [threading.Thread(target=send) for _ in range(15)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    start.set()
    for thread in threads:
        thread.join(15)
    return answers


def test_requests_at_once_are_spaced_out_up_to_max_wait_and_the_rest_refused(
    proxy: int,
) -> None:
    """15 requests at once from one address: the first passes, about ten more are held
    and pass one every 100 ms (up to 1 s), the rest are refused (429) at once, before the
    held ones are answered."""
    answers = burst(proxy, "127.0.9.31")
    statuses = [status for status, _ in answers]
    assert len(statuses) == 15 and set(statuses) <= {200, 429}, statuses
    passed = statuses.count(200)
    # 11 when the 15 reach ferryman within 100 ms; a slow arrival may find one more turn.
    assert 11 <= passed <= 12, statuses
    # The refused are answered at once; the last five held wait 0.6 s and more.
    assert statuses[-5:] == [200] * 5, statuses
    spacing = [round(t, 3) for status, t in answers if status == 200]
    print(f"shaped answers at (s after the send): {spacing}")


def test_a_filter_timeout_under_max_wait_shortens_the_waits(short_proxy: int) -> None:
    """With the filter's timeout (0.5 s, Envoy's gRPC deadline) under max_wait, ferryman
    books only the turns that come before the deadline: about five pass, the rest are
    refused at once, and none is let through by Envoy giving up (the filter fails open)."""
    statuses = [status for status, _ in burst(short_proxy, "127.0.9.32")]
    assert len(statuses) == 15 and set(statuses) <= {200, 429}, statuses
    # Turns at 0, 0.1 ... 0.4 s fit in 0.5 s less ferryman's margin; one more may on a
    # slow arrival. A timed-out call would pass (fail open), making more than six.
    assert 5 <= statuses.count(200) <= 6, statuses
    assert statuses[-3:] == [200] * 3, statuses
