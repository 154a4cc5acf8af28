"""Lease-backed sidecars: decisions per second and CPU per decision of a ``leased_limit``
node against the same node as a fixed window on Redis, and the parent's load.

Usage::

    python tests/bench/bench_leased.py [--seconds 5] [--concurrency 32] [--sidecars 100]

Starts a redis-server, a root ``ferryman serve`` holding one FAIR_SHARE resource and one
sidecar ``ferryman serve --parent ROOT --backend REDIS`` whose config has two nodes: one
``leased_limit`` on that resource and one ``rate_limit`` per second on Redis, both too large
to refuse anything. It drives each node in turn over gRPC ShouldRateLimit from this process
(C grpc.aio workers for N seconds) and prints the sidecar's decisions per second and its CPU
(from /proc) per decision. Then it starts K in-process ``AsyncCapacityClient``s, each a
simulated sidecar leasing the resource at a 1 s refresh interval, and prints the
GetCapacity calls per second the root answered and its CPU. Client and server share the
machine's cores: compare runs on one machine. A benchmark, not a test: pytest does not
collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from ferryman.algorithms.leased_limit import LEASED_LIMIT, LeasedLimiter
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.client import AsyncCapacityClient
from ferryman.clock import SystemClock
from ferryman.config.loader import load_sources
from ferryman.core.answers import DescriptorRequest
from ferryman.engine import RateLimitEngine
from ferryman.stats import Stats

from helpers.capacity import Ferryman
from helpers.redis_procs import RedisProcess

ROOT = """
resources:
  - identifier_glob: api*
    capacity: 1000000000
    algorithm: {kind: FAIR_SHARE, lease_length: 5, refresh_interval: 1,
                learning_mode_duration: 0}
"""

SIDECAR = """
domain: bench
descriptors:
  - key: route
    value: leased
    leased_limit: {resource: api}
  - key: route
    value: fixed
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(address: str, route: str, seconds: float, concurrency: int) -> tuple[int, int]:
    """Decisions made and OK answers among them, in ``seconds``."""
    descriptor = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="route", value=route)]
    )
    request = rls_pb2.RateLimitRequest(domain="bench", descriptors=[descriptor])
    done = ok = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
        await stub.ShouldRateLimit(request, timeout=5)
        end = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done, ok
            while time.monotonic() < end:
                reply = await stub.ShouldRateLimit(request, timeout=5)
                ok += reply.overall_code == rls_pb2.RateLimitResponse.OK
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, ok


class _Holder:
    def __init__(self, text: str) -> None:
        self.config = load_sources([("bench.yaml", text)])


async def in_process(redis_url: str, decisions: int) -> dict[str, float]:
    """CPU per decision of the engine alone (no gRPC): each node, one request at a time."""
    clock = SystemClock()
    backend = RedisBackend(parse_backend_url(redis_url), server_time=False)
    await backend.start()
    engine = RateLimitEngine(_Holder(SIDECAR), backend, clock, Stats())
    leased = engine.limiter(LEASED_LIMIT.name)
    assert isinstance(leased, LeasedLimiter)
    leased.reader = lambda resource: (1e9, None)
    out: dict[str, float] = {}
    try:
        for route in ("fixed", "leased"):
            request = [DescriptorRequest((("route", route),))]
            await engine.should_rate_limit("bench", request)
            cpu, start = time.process_time(), time.monotonic()
            for _ in range(decisions):
                await engine.should_rate_limit("bench", request)
            out[route] = (time.process_time() - cpu) / decisions
            out[route + "_wall"] = (time.monotonic() - start) / decisions
    finally:
        await backend.close()
    return out


async def simulate(address: str, sidecars: int, seconds: float) -> int:
    clients = [AsyncCapacityClient(address, f"sidecar-{i}") for i in range(sidecars)]
    for i, client in enumerate(clients):
        client.resource("api", 100 + i)
    await asyncio.sleep(1.5)  # every client has its first lease
    before = sum(c.stats().refreshes for c in clients)
    await asyncio.sleep(seconds)
    calls = sum(c.stats().refreshes for c in clients) - before
    for client in clients:
        await client.close()
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sidecars", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        redis_server = RedisProcess(work / "redis").start()
        servers: list[Ferryman] = []
        try:
            (work / "root-config").mkdir()
            (work / "root-config" / "resources.yaml").write_text(ROOT)
            root = Ferryman(work / "root", work / "root-config")
            servers.append(root)
            (work / "sidecar-config").mkdir()
            (work / "sidecar-config" / "bench.yaml").write_text(SIDECAR)
            sidecar = Ferryman(
                work / "sidecar",
                work / "sidecar-config",
                "--parent",
                root.address,
                "--backend",
                redis_server.url,
            )
            servers.append(sidecar)
            time.sleep(1.5)  # the first lease
            print(f"sidecar, {args.concurrency} workers, {args.seconds:g} s per node")
            for route, label in (
                ("leased", "leased_limit (local)"),
                ("fixed", "fixed window, Redis"),
            ):
                # A warm-up: the lease follows the demand it sees, one refresh behind.
                asyncio.run(drive(sidecar.address, route, 4.0, args.concurrency))
                cpu = cpu_seconds(sidecar.proc.pid)
                start = time.monotonic()
                done, ok = asyncio.run(
                    drive(sidecar.address, route, args.seconds, args.concurrency)
                )
                took = time.monotonic() - start
                used = cpu_seconds(sidecar.proc.pid) - cpu
                print(
                    f"  {label:22} {done / took:8.0f} decisions/s"
                    f"  {used / done * 1e6:6.0f} us CPU/decision  {ok / done:6.1%} OK"
                )
            alone = asyncio.run(in_process(redis_server.url, 20000))
            print("engine alone, one request at a time (no gRPC):")
            print(
                f"  fixed window, Redis     {alone['fixed'] * 1e6:6.1f} us CPU/decision"
                f"  {alone['fixed_wall'] * 1e6:6.1f} us/decision"
            )
            print(
                f"  leased_limit (local)    {alone['leased'] * 1e6:6.1f} us CPU/decision"
                f"  {alone['leased_wall'] * 1e6:6.1f} us/decision"
            )
            cpu = cpu_seconds(root.proc.pid)
            calls = asyncio.run(simulate(root.address, args.sidecars, args.seconds))
            used = cpu_seconds(root.proc.pid) - cpu
            print(
                f"parent, {args.sidecars} simulated sidecars (refresh 1 s):"
                f" {calls / args.seconds:.1f} GetCapacity calls/s,"
                f" {used / (args.seconds + 1.5) * 100:.1f}% of a core"
            )
        finally:
            for server in servers:
                server.stop()
            redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
