"""Capacity leases: GetCapacity throughput and p99 on a real server, and allocation time.

Usage::

    python tests/bench/bench_capacity.py [--seconds N] [--concurrency C] [--clients K]
                                         [--allocation-clients M]

Starts ``ferryman serve`` (memory backend, DOORMAN_MINIMUM_REFRESH_INTERVAL=0 so every
request is recomputed) with one FAIR_SHARE template, and drives it from this process with C
grpc.aio workers for N seconds in two scenarios:

- ``one``: each request is one of K clients (1,000 by default) refreshing one resource;
- ``ten``: each request asks for 10 resources at once (the same K clients).

Every client wants a different amount, so the division is recomputed whenever a client's
want changes; here wants are stable, as they are between refreshes in practice. Then, in
process, it times one FAIR_SHARE division of M clients (10,000 by default) and one grant
that has to recompute it. Client and server share the machine's cores: compare runs on
one machine. This is a benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman.algorithms.leases import (
    AlgorithmSpec,
    Demand,
    Kind,
    LeaseState,
    ResourceTemplate,
    TemplateSource,
    divide,
)

RESOURCES = """
resources:
  - identifier_glob: "*"
    capacity: 1000
    algorithm: {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 5,
                learning_mode_duration: 0}
"""


def start_server(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    env = dict(os.environ, DOORMAN_MINIMUM_REFRESH_INTERVAL="0")
    command = [sys.executable, "-m", "ferryman", "serve", "--config", str(config)]
    command += ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    with log.open("w") as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = re.search(r"grpc :(\d+)", log.read_text())
        if match:
            return proc, int(match.group(1))
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("ferryman serve did not start:\n" + log.read_text())


def requests(clients: int, resources: int) -> list[doorman_pb2.GetCapacityRequest]:
    rng = random.Random(7)
    out = []
    for i in range(clients):
        request = doorman_pb2.GetCapacityRequest(client_id=f"client-{i}")
        for r in range(resources):
            request.resource.add(resource_id=f"res-{r}", priority=0, wants=rng.uniform(0.1, 5))
        out.append(request)
    return out


async def load(
    port: int, batch: list[doorman_pb2.GetCapacityRequest], seconds: float, concurrency: int
) -> tuple[float, float, float, float]:
    """(requests per second, p50 ms, p99 ms) after every client arrived and a one-second
    warm-up, and the seconds the clients' arrival took."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = doorman_pb2_grpc.CapacityStub(channel)  # type: ignore[no-untyped-call]
        latencies: list[float] = []
        measuring = False
        stop = False

        async def worker(start: int) -> None:
            i = start
            while not stop:
                began = time.perf_counter()
                await stub.GetCapacity(batch[i % len(batch)], timeout=10)
                if measuring:
                    latencies.append(time.perf_counter() - began)
                i += concurrency

        # Every client once first: a newcomer changes the division (the cost of arrival,
        # reported apart), a known client refreshing with the same want does not.
        began = time.perf_counter()
        for k in range(0, len(batch), concurrency):
            chunk = batch[k : k + concurrency]
            await asyncio.gather(*(stub.GetCapacity(r, timeout=30) for r in chunk))
        arrival = time.perf_counter() - began
        tasks = [asyncio.create_task(worker(k)) for k in range(concurrency)]
        await asyncio.sleep(1.0)
        measuring = True
        began = time.perf_counter()
        await asyncio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - began
        stop = True
        await asyncio.gather(*tasks)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[int(len(latencies) * 0.99)] * 1000
    return len(latencies) / elapsed, p50, p99, arrival


class _All(TemplateSource):
    def __init__(self) -> None:
        self._template = ResourceTemplate("*", 1000.0, AlgorithmSpec(Kind.FAIR_SHARE, 60, 5, 0))

    def template(self, resource_id: str) -> ResourceTemplate | None:
        return self._template


def allocation(clients: int, repeat: int = 20) -> tuple[float, float, float]:
    """Milliseconds for one FAIR_SHARE division of ``clients``, for a grant that recomputes
    it, and for a grant that reuses it."""
    rng = random.Random(11)
    demands = [Demand(rng.uniform(0.1, 5), 1) for _ in range(clients)]
    divisions = []
    for _ in range(repeat):
        began = time.perf_counter()
        divide(Kind.FAIR_SHARE, 1000.0, demands)
        divisions.append(time.perf_counter() - began)
    state = LeaseState(_All(), min_refresh_interval=0)
    now = time.time()
    for i, d in enumerate(demands):
        state.ask(f"c{i}", "r", wants=d.wants, now=now)
    recomputing, cached = [], []
    for k in range(repeat):
        now += 2 * state.recompute_interval  # so that a changed want recomputes the division
        began = time.perf_counter()
        state.ask(f"c{k}", "r", wants=rng.uniform(0.1, 5), now=now)
        recomputing.append(time.perf_counter() - began)
        began = time.perf_counter()
        state.ask(f"c{k + 2 * repeat}", "r", wants=demands[k + 2 * repeat].wants, now=now)
        cached.append(time.perf_counter() - began)
    return (
        statistics.median(divisions) * 1000,
        statistics.median(recomputing) * 1000,
        statistics.median(cached) * 1000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--allocation-clients", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config"
        config.mkdir()
        (config / "resources.yaml").write_text(RESOURCES)
        proc, port = start_server(config, Path(tmp) / "server.log")
        try:
            for name, resources in (("one", 1), ("ten", 10)):
                batch = requests(args.clients, resources)
                rps, p50, p99, arrival = asyncio.run(
                    load(port, batch, args.seconds, args.concurrency)
                )
                print(
                    f"GetCapacity {name:>3} resource(s)/request, {args.clients} clients, "
                    f"concurrency {args.concurrency}: {rps:,.0f} req/s "
                    f"({rps * resources:,.0f} leases/s), p50 {p50:.2f} ms, p99 {p99:.2f} ms "
                    f"(the {args.clients} clients' first requests took {arrival:.2f} s)"
                )
        finally:
            proc.terminate()
            proc.wait(10)
    divide_ms, recompute_ms, cached_ms = allocation(args.allocation_clients)
    print(
        f"FAIR_SHARE at {args.allocation_clients:,} clients: one division {divide_ms:.2f} ms; "
        f"a grant that recomputes it {recompute_ms:.2f} ms, one that reuses it "
        f"{cached_ms:.3f} ms"
    )


if __name__ == "__main__":
    main()
