"""Shaping (a GCRA node with ``max_wait``): how closely held ShouldRateLimit answers keep
their turns, and what a held caller costs.

Usage::

    python tests/bench/bench_shaping.py [--backend memory,redis] [--rate 100]
                                        [--requests 150] [--held 1000] [--json]

For each backend the script starts ``ferryman serve`` (and, for redis, a throwaway
redis-server) on free loopback ports, with two GCRA nodes of burst 1:

- Spacing. ``--requests`` ShouldRateLimit calls at once (grpc.aio, one channel) on one
  tenant of a node of ``--rate`` a second with max_wait 1 s: about ``rate + 1`` pass, one
  every 1/rate s, the rest are refused at once (the calls reach the server over some
  milliseconds: each 1/rate s of that spread frees one more turn). Reported: the calls
  passed and refused, the gaps between consecutive OK answers as the client sees them (p50,
  p99, against 1/rate), the time from the first OK answer to the last against the span of
  their turns, and how long the refused took to be answered (p99).
- Cost per held caller. ``--held`` calls on one tenant of a node of 1 a second with
  max_wait 1 h: the k-th is held k seconds. Once /status says all are held, the server's
  resident memory over what it had before, per held call (the gRPC call's own state
  included), and its CPU over 2 s of holding
  (nothing but sleeping coroutines: it should be about zero); then the client cancels every
  call, and /status must count them as left.

Client and server share the machine's cores. This is a benchmark, not a test: pytest does
not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from bench_rls import (
    Processes,
    cpu_seconds,
    http_ok,
    http_text,
    port_open,
    rss_mb,
    start_redis_process,
    wait_ready,
)
from helpers.ports import free_port

CONFIG = """
domain: shaped
descriptors:
  - key: spaced
    gcra: {rate: RATE, per: 1s, burst: 1}
    max_wait: 1s
  - key: held
    gcra: {rate: 1, per: 1s, burst: 1}
    max_wait: 1h
"""
OK = rls_pb2.RateLimitResponse.OK


def request(key: str, tenant: str) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=tenant)
    return rls_pb2.RateLimitRequest(
        domain="shaped", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )


def pct(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def start(
    procs: Processes, workdir: Path, backend: str, url: str, rate: int
) -> tuple[Any, int, int]:
    """``ferryman serve`` on ``backend``: (its process, gRPC port, debug port)."""
    config = workdir / f"config-{backend}"
    config.mkdir()
    (config / "shaped.yaml").write_text(CONFIG.replace("RATE", str(rate)))
    grpc_port, http_port, debug_port = free_port(), free_port(), free_port()
    env = dict(os.environ, HOST="127.0.0.1", GRPC_HOST="127.0.0.1", DEBUG_HOST="127.0.0.1")
    env["LOG_LEVEL"] = "WARN"
    argv = [sys.executable, "-m", "ferryman", "serve", "--config", str(config)]
    argv += ["--backend", url if backend == "redis" else "memory"]
    argv += ["--grpc-port", str(grpc_port), "--http-port", str(http_port)]
    argv += ["--debug-port", str(debug_port)]
    log = workdir / f"ferryman-{backend}.log"
    with log.open("w") as out:
        child = procs.start(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    ready = f"http://127.0.0.1:{http_port}/healthcheck"
    wait_ready(child, lambda: http_ok(ready) and port_open(grpc_port), "ferryman", log)
    return child, grpc_port, debug_port


def shaping(debug_port: int) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(http_text(f"http://127.0.0.1:{debug_port}/status"))
    return dict(status["shaping"])


async def spacing(port: int, rate: int, count: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_stub(channel)
        await stub.ShouldRateLimit(request("spaced", "warm-up"), timeout=5)
        began = time.monotonic()

        async def one() -> tuple[bool, float]:
            reply = await stub.ShouldRateLimit(request("spaced", "t"), timeout=5)
            return reply.overall_code == OK, time.monotonic() - began

        answers = await asyncio.gather(*(one() for _ in range(count)))
    passed = sorted(t for ok, t in answers if ok)
    refused = [t for ok, t in answers if not ok]
    step = 1 / rate
    gaps = [b - a for a, b in itertools.pairwise(passed)]
    return {
        "passed": len(passed),
        "refused": len(refused),
        "gap_p50_ms": pct(gaps, 0.5) * 1000,
        "gap_p99_ms": pct(gaps, 0.99) * 1000,
        "span_ms": (passed[-1] - passed[0]) * 1000 if passed else 0.0,
        "span_turns_ms": (len(passed) - 1) * step * 1000,
        "refused_p99_ms": pct(refused, 0.99) * 1000,
    }


def rls_stub(channel: grpc.aio.Channel) -> Any:
    return rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]


async def held(pid: int, port: int, debug_port: int, count: int) -> dict[str, float]:
    before = rss_mb(pid) or 0.0
    done_before = shaping(debug_port)["held"]  # the spacing run's
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_stub(channel)
        calls = [stub.ShouldRateLimit(request("held", "t"), timeout=7200) for _ in range(count)]
        waiting = [asyncio.ensure_future(call) for call in calls]
        deadline = time.monotonic() + 60
        # /status is polled over HTTP: no event to wait on. The first call passes at once.
        while time.monotonic() < deadline:
            shown = shaping(debug_port)
            if shown["holding"] + shown["held"] - done_before >= count - 1:
                break
            await asyncio.sleep(0.1)
        holding = shaping(debug_port)["holding"]  # less the few answered by now
        after = rss_mb(pid) or 0.0
        cpu = cpu_seconds(pid) or 0.0
        await asyncio.sleep(2.0)
        cpu = (cpu_seconds(pid) or 0.0) - cpu
        for call in calls:
            call.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    deadline = time.monotonic() + 10
    while shaping(debug_port)["holding"] and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    shown = shaping(debug_port)
    return {
        "holding": holding,
        "rss_kb_per_held": (after - before) * 1024 / max(holding, 1),
        "cpu_share_while_holding": cpu / 2.0,
        "left_after_cancel": shown["left"],
        "holding_after_cancel": shown["holding"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="memory,redis")
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    procs = Processes()
    rows: dict[str, dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as workdir:
            url = ""
            for backend in args.backend.split(","):
                if backend == "redis" and not url:
                    url, _ = start_redis_process(procs, Path(workdir))
                child, port, debug = start(procs, Path(workdir), backend, url, args.rate)
                row = asyncio.run(spacing(port, args.rate, args.requests))
                row.update(asyncio.run(held(child.pid, port, debug, args.held)))
                rows[backend] = row
                procs.stop(child)
    finally:
        procs.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    step = 1000 / args.rate
    for backend, row in rows.items():
        print(f"{backend}: {args.requests} at once, {args.rate}/s, max_wait 1s")
        print(
            f"  passed {row['passed']:.0f}, refused {row['refused']:.0f} "
            f"(answered by p99 {row['refused_p99_ms']:.1f} ms)"
        )
        print(
            f"  gap between OK answers p50 {row['gap_p50_ms']:.1f} ms, p99 "
            f"{row['gap_p99_ms']:.1f} ms (turns {step:g} ms apart)"
        )
        print(
            f"  first to last OK answer {row['span_ms']:.0f} ms "
            f"(their turns span {row['span_turns_ms']:.0f} ms)"
        )
        print(
            f"  {row['holding']:.0f} held: {row['rss_kb_per_held']:.2f} kB each (server RSS), "
            f"server CPU while holding {row['cpu_share_while_holding'] * 100:.1f}% of a core; "
            f"after cancelling: {row['left_after_cancel']:.0f} left, "
            f"{row['holding_after_cancel']:.0f} still held"
        )


if __name__ == "__main__":
    main()
