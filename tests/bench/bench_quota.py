"""Throughput, latency and CPU of ``quotaservice.QuotaService/Allow`` on memory and Redis,
next to a do-nothing Allow server in the same run; and memory per token bucket.

Usage::

    python tests/bench/bench_quota.py [--seconds N] [--warmup N] [--concurrency C]
                                      [--buckets N] [--memory-buckets N] [--json]

The script starts ``ferryman serve`` twice (``--backend memory``, then a throwaway
redis-server) with a quota file of one namespace whose dynamic bucket template never runs
dry, and a do-nothing QuotaService (canned OK) in its own process. A client process sends
Allow calls back to back from C workers on one grpc.aio event loop over ``--buckets``
dynamic buckets. Reported per server: req/s, p50 and p99, its ratio to the do-nothing
server, the server's CPU per request, and on Redis the redis-server's CPU per decision
(``INFO cpu`` over the script calls of ``INFO commandstats``).

Then memory per bucket for ``--memory-buckets`` (default 100k) dynamic buckets: the memory
store's Python allocations (tracemalloc) and Redis's ``used_memory``, each divided by the
number of buckets.

Client and servers share the machine's cores: compare runs on one machine, not machines.
This is a benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import grpc
import redis

from ferryman._proto.quotaservice import quota_service_pb2, quota_service_pb2_grpc
from ferryman.algorithms.token_bucket.memory import MemoryTokenBucketStore
from ferryman.algorithms.token_bucket.model import BucketRef, BucketSpec, TakeStatus
from ferryman.algorithms.token_bucket.redis import RedisTokenBucketStore
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import ManualClock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers
from bench_rls import (
    START_TIMEOUT,
    Processes,
    Server,
    cpu_seconds,
    percentile,
    port_open,
    start_ferryman,
    start_redis,
    wait_ready,
)
from helpers.ports import free_port

METHOD = "/quotaservice.QuotaService/Allow"
NAMESPACE = "bench"
POOL = 16_384
HUGE = 1_000_000_000
QUOTA_YAML = f"""\
# Written by tests/bench/bench_quota.py: dynamic buckets that never run dry.
namespaces:
  {NAMESPACE}:
    dynamic_bucket_template: {{size: {HUGE}, fill_rate: {HUGE}}}
"""
TEMPLATE = BucketSpec(size=HUGE, fill_rate=HUGE)


# --------------------------------------------------------------------------- client role


def _identity(data: bytes) -> bytes:
    return data


async def run_load(
    target: str, concurrency: int, buckets: int, warmup: float, seconds: float, pid: int
) -> dict[str, Any]:
    pool = [
        quota_service_pb2.AllowRequest(
            namespace=NAMESPACE, bucket_name=f"b{i % buckets}", tokens_requested=1
        ).SerializeToString()
        for i in range(POOL)
    ]
    channel = grpc.aio.insecure_channel(target)
    call = channel.unary_unary(
        METHOD,
        request_serializer=_identity,
        response_deserializer=quota_service_pb2.AllowResponse.FromString,
    )
    await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT)
    begin = time.perf_counter_ns()
    measure_from = begin + int(warmup * 1e9)
    measure_to = measure_from + int(seconds * 1e9)
    latencies: list[int] = []
    counts = {"errors": 0, "not_ok": 0}
    cpu: dict[str, float] = {}

    async def worker(index: int) -> None:
        position = (index * 7919) % POOL
        clock = time.perf_counter_ns
        while True:
            start = clock()
            if start >= measure_to:
                return
            request = pool[position]
            position = (position + 1) % POOL
            try:
                response = await call(request, timeout=10)
            except grpc.aio.AioRpcError:
                counts["errors"] += 1
                continue
            end = clock()
            if measure_from <= start and end <= measure_to:
                latencies.append(end - start)
                if response.status != quota_service_pb2.AllowResponse.OK:
                    counts["not_ok"] += 1

    async def sample_cpu() -> None:
        await asyncio.sleep(max(0, measure_from - time.perf_counter_ns()) / 1e9)
        before = cpu_seconds(pid)
        await asyncio.sleep(max(0, measure_to - time.perf_counter_ns()) / 1e9)
        after = cpu_seconds(pid)
        if before is not None and after is not None:
            cpu["server"] = after - before

    try:
        await asyncio.gather(sample_cpu(), *(worker(i) for i in range(concurrency)))
    finally:
        await channel.close(None)
    latencies.sort()
    return {
        "requests": len(latencies),
        "rps": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "server_cpu_seconds": cpu.get("server"),
        **counts,
    }


# --------------------------------------------------------------------------- ceiling role


async def serve_ceiling(port: int) -> None:
    """A QuotaService that grants every Allow at once."""
    granted = quota_service_pb2.AllowResponse(
        status=quota_service_pb2.AllowResponse.OK, tokens_granted=1
    )

    class NullQuota(quota_service_pb2_grpc.QuotaServiceServicer):
        async def Allow(
            self, request: quota_service_pb2.AllowRequest, context: Any
        ) -> quota_service_pb2.AllowResponse:
            return granted

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    quota_service_pb2_grpc.add_QuotaServiceServicer_to_server(NullQuota(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0)


# --------------------------------------------------------------------------- orchestration


def start_ceiling(procs: Processes, workdir: Path) -> Server:
    port = free_port()
    log = workdir / "ceiling.log"
    argv = [sys.executable, __file__, "--role", "ceiling", "--port", str(port)]
    with log.open("w") as out:
        child = procs.start(argv, stdout=out, stderr=subprocess.STDOUT)
    wait_ready(child, lambda: port_open(port), "do-nothing Allow server", log)
    return Server("nothing", child, port, log)


def start_quota_ferryman(procs: Processes, workdir: Path, backend: str) -> Server:
    """``ferryman serve`` on ``backend`` with the bench quota file, once Allow answers OK."""
    workdir.mkdir()
    server = start_ferryman(procs, workdir, backend, None)
    (workdir / "config" / "quota.yaml").write_text(QUOTA_YAML)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = quota_service_pb2_grpc.QuotaServiceStub(channel)  # type: ignore[no-untyped-call]
    probe = quota_service_pb2.AllowRequest(namespace=NAMESPACE, bucket_name="probe")

    def loaded() -> bool:
        return bool(stub.Allow(probe, timeout=5).status == quota_service_pb2.AllowResponse.OK)

    wait_ready(server.process, loaded, "ferryman with the quota file", server.log)
    return server


def run_client(procs: Processes, server: Server, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--role", "client", "--port", str(server.grpc_port)]
    argv += ["--server-pid", str(server.process.pid), "--concurrency", str(args.concurrency)]
    argv += ["--buckets", str(args.buckets), "--warmup", str(args.warmup)]
    argv += ["--seconds", str(args.seconds)]
    child = procs.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(timeout=args.warmup + args.seconds + START_TIMEOUT)
    finally:
        procs.stop(child)
    if child.returncode != 0:
        raise RuntimeError(f"client failed ({child.returncode}):\n{err.decode(errors='replace')}")
    result: dict[str, Any] = json.loads(out)
    result["target"] = server.name
    return result


def redis_counters(client: redis.Redis) -> tuple[float, int]:
    """(CPU seconds of redis-server, script calls so far)."""
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    calls = sum(
        int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    )
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


def memory_store_bytes(n: int) -> float:
    """Python bytes allocated per dynamic bucket of the memory store, for ``n`` buckets."""
    store = MemoryTokenBucketStore(ManualClock())
    now = 1_700_000_000_000_000
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):  # the names are counted: the store keeps them
        ref = BucketRef(NAMESPACE, f"b{i}", True)
        assert store.take_at(ref, TEMPLATE, 1, 0, now).status is TakeStatus.OK
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(store) == n
    return (after - before) / n


async def redis_store_bytes(url: str, n: int) -> float:
    """Redis ``used_memory`` per dynamic bucket, for ``n`` buckets made through the script."""
    client = redis.Redis.from_url(url)
    client.flushall()
    before = int(client.info("memory")["used_memory"])
    backend = RedisBackend(parse_backend_url(url, pool_size=4, timeout=10.0))
    await backend.start()
    store = RedisTokenBucketStore(backend.connection, prefix=f"m{uuid.uuid4().hex[:6]}_")
    try:
        for start in range(0, n, 1000):
            refs = [BucketRef(NAMESPACE, f"b{i}", True) for i in range(start, min(n, start + 1000))]
            await asyncio.gather(*(store.take(ref, TEMPLATE, 1, 0) for ref in refs))
    finally:
        await backend.close()
    after = int(client.info("memory")["used_memory"])
    client.close()
    return (after - before) / n


def orchestrate(args: argparse.Namespace) -> int:
    procs = Processes()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ferryman-bench-quota-") as tmp:
        workdir = Path(tmp)
        try:
            redis_url = start_redis(procs, workdir)
            rclient = redis.Redis.from_url(redis_url)
            nothing = start_ceiling(procs, workdir)
            for backend in ("memory", redis_url):
                label = "memory" if backend == "memory" else "redis"
                server = start_quota_ferryman(procs, workdir / label, backend)
                server.name = label
                cpu0, calls0 = redis_counters(rclient)
                result = run_client(procs, server, args)
                cpu1, calls1 = redis_counters(rclient)
                if label == "redis" and calls1 > calls0:
                    result["redis_cpu_us_per_decision"] = (cpu1 - cpu0) / (calls1 - calls0) * 1e6
                results.append(result)
                procs.stop(server.process)
            results.append(run_client(procs, nothing, args))
            memory_bytes = memory_store_bytes(args.memory_buckets)
            redis_bytes = asyncio.run(redis_store_bytes(redis_url, args.memory_buckets))
            rclient.close()
        finally:
            procs.close()
    ceiling = results[-1]["rps"]
    for r in results:
        r["ratio_to_nothing"] = r["rps"] / ceiling if ceiling else None
        if r.get("server_cpu_seconds") is not None and r["requests"]:
            r["server_cpu_us_per_request"] = r["server_cpu_seconds"] / r["requests"] * 1e6
    report = {
        "concurrency": args.concurrency,
        "buckets": args.buckets,
        "seconds": args.seconds,
        "results": results,
        "bytes_per_bucket": {
            "buckets": args.memory_buckets,
            "memory": memory_bytes,
            "redis": redis_bytes,
        },
    }
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in results:
            line = (
                f"{r['target']:<8} Allow c={args.concurrency:<4} {r['rps']:>8.0f} req/s  "
                f"p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  "
                f"{r['ratio_to_nothing']:5.2f}x nothing"
            )
            if "server_cpu_us_per_request" in r:
                line += f"  server cpu {r['server_cpu_us_per_request']:5.0f} us/req"
            if "redis_cpu_us_per_decision" in r:
                line += f"  redis cpu {r['redis_cpu_us_per_decision']:5.1f} us/decision"
            if r["errors"] or r["not_ok"]:
                line += f"  ERRORS {r['errors']} not-OK {r['not_ok']}"
            print(line)
        print(
            f"per bucket ({args.memory_buckets} dynamic buckets): memory store "
            f"{memory_bytes:.0f} B, redis {redis_bytes:.0f} B"
        )
    return 1 if any(r["errors"] or r["not_ok"] for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--buckets", type=int, default=10_000, help="dynamic buckets the load uses")
    parser.add_argument("--memory-buckets", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--role", choices=("client", "ceiling"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "ceiling":
        asyncio.run(serve_ceiling(args.port))
        return 0
    if args.role == "client":
        target = f"127.0.0.1:{args.port}"
        result = asyncio.run(
            run_load(
                target, args.concurrency, args.buckets, args.warmup, args.seconds, args.server_pid
            )
        )
        json.dump(result, sys.stdout)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
