"""Held copies: reserve+release pairs per second and their latency, and the memory per hold.

Usage::

    python tests/bench/bench_holds.py [--backend memory,redis] [--concurrency 1,16,64]
                                      [--seconds 5] [--warmup 1] [--channels 1]
                                      [--tenants 1000,10000] [--sessions 100] [--copies 2]
                                      [--json] [--timeout 600]
                                      [--parts throughput,memory,queue] [--workers 20]
                                      [--hold 0.1] [--rounds 5] [--waiters 1000]

Throughput. For each backend the script starts ``ferryman serve`` (and, for redis, a
throwaway redis-server without persistence) on free loopback ports with one copy-limited node
(per-tenant limit 100, a group ``everyone`` of all tenants and a global limit, both 1,000,000:
every reservation touches the tenant's, the group's and the node's counts and none is ever
refused). A separate client process on grpc.aio opens C Sessions (``--concurrency``, over
``--channels`` channels); each session loops Reserve(copies=1) then Release of that copy for
its own tenant, back to back, for a warm-up and then the measured window. Reported: pairs per
second, p50/p90/p99 of a pair (Reserve plus Release, as the client sees it), p50/p99 of each
call, and the CPU used by the server, Redis and the client over the window (shares of one
core). Client, server and Redis share the machine's cores.

Memory per hold. N tenants (``--tenants``) each hold ``--copies`` copies, spread over
``--sessions`` sessions of one client, through a fresh server (and Redis):

- redis: ``INFO memory`` used_memory with the holds minus before (sessions already open,
  scripts loaded, the node's lease entry written), divided by N; the same for the sum of
  ``MEMORY USAGE`` (every element sampled) of the node's keys, and each of the counts hash
  and the server's contributions hash. used_memory also moves by a fixed 50-110 kB that is
  not in any key (the Lua VM, allocator), so at small N the key sum is the better figure;
- both backends: the ferryman server's resident memory (VmRSS) with the holds minus before,
  divided by N (coarse: it includes the session hold sets and allocator slack);
- memory backend, in process: tracemalloc's traced memory of the memory copy store after N
  reservations minus before, divided by N, and of N entries of a session's hold set (the
  ``{(node, tenant, groups): copies}`` dict a server keeps per session).

After the holds the sessions are closed and the counts are checked to be back at zero.

Waiting (``--parts queue``). A contended resource: a node of 2 copies and ``--workers``
workers (20), each holding one copy for ``--hold`` seconds (0.1) once, all starting
together, through ``ferryman.AsyncClient.hold_copy(max_wait=30)``; ideally the run takes
workers * hold / 2 (1 s). Two ways side by side: ``queue`` (the service's queue) and
``backoff`` (the client as it acts against a service without queues: asked again after
jitter(2**i) seconds). Reported over ``--rounds`` runs: utilization (the ideal over the
run's length, the mean and the worst), and the wake-up: the time from a release (its call
sent) to the next waiter's grant (the answer read), p50/p99, the k-th grant that waited (the
first 2 find free copies) paired with the k-th release. Then the cost of a waiting caller:
``--waiters`` calls (1000, the default cap per node) wait on the full node; the server's
resident memory with them minus before, per waiter; Redis's used_memory likewise; and the
CPU the server (and Redis) used over 2 s while they all wait (no polling: near zero).

This is a benchmark, not a test: pytest does not collect this directory.

Internal roles (used by the script itself): ``--role load`` runs the throughput client and
prints JSON; ``--role hold`` holds copies for the memory measurement, stepping on stdin;
``--role contend`` runs the contended workers and prints JSON; ``--role wait`` keeps
``--waiters`` calls waiting, stepping on stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc

# The process helpers of the RLS benchmark next to this script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc

from bench_rls import Processes, cpu_seconds, http_ok, port_open, wait_ready
from helpers.ports import free_port

DOMAIN = "bench"
KEY = "tenant"
POOL = "pool"  # the contended resource of the queue measurements
POOL_COPIES = 2
BIG = 1_000_000
TENANT_LIMIT = 100
CONFIG_YAML = f"""\
# Written by tests/bench/bench_holds.py: one copy-limited node that never refuses.
domain: {DOMAIN}
descriptors:
  - key: {KEY}
    copies:
      limit: {TENANT_LIMIT}
      global_limit: {BIG}
      groups:
        - {{name: everyone, limit: {BIG}, members: ["*"]}}
  - key: {POOL}
    copies: {{global_limit: {POOL_COPIES}}}
"""
NODE = f"ferryman_copies_{DOMAIN}.{KEY}"  # RateLimitEngine.copies_node, no key prefix
T = TypeVar("T")
START_TIMEOUT = 30.0
INFLIGHT = 64  # reservations in flight at once while taking the holds
Pb = limiter_pb2


def tenant_name(i: int) -> str:
    return f"tenant-{i:06d}"


def entries(tenant: str) -> list[Any]:
    return [Pb.Entry(key=KEY, value=tenant)]


def percentile_ms(ordered: Sequence[int], fraction: float) -> float:
    """Nearest-rank percentile of sorted nanosecond samples, in ms."""
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index] / 1e6


def rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` from /proc (None where there is no /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# --------------------------------------------------------------------------- client roles


class Client:
    """Sessions on one server over grpc.aio."""

    def __init__(self, target: str, channels: int) -> None:
        # A local subchannel pool gives each channel its own TCP connection.
        self.channels = [
            grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(channels)
        ]
        self.stubs = [
            limiter_pb2_grpc.LimiterStub(ch)  # type: ignore[no-untyped-call]
            for ch in self.channels
        ]

    async def ready(self) -> None:
        for ch in self.channels:
            await asyncio.wait_for(ch.channel_ready(), START_TIMEOUT)

    async def open(self, index: int) -> tuple[Any, Any, tuple[tuple[str, str], ...]]:
        """(stub, session call, metadata) of a new session."""
        stub = self.stubs[index % len(self.stubs)]
        call = stub.Session()
        await call.write(Pb.SessionRequest(open=Pb.SessionRequest.Open(client_name="bench")))
        event = await call.read()
        session_id = event.opened.session_id
        if not session_id:
            raise RuntimeError(f"no session id in {event}")
        return stub, call, (("ferryman-session", session_id),)

    @staticmethod
    async def end(call: Any) -> None:
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:  # type: ignore[attr-defined]
            pass

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close(None)


async def run_load(args: argparse.Namespace) -> dict[str, Any]:
    """C sessions, each looping Reserve(1) + Release(1) on its own tenant."""
    client = Client(args.target, args.channels)
    pids = {"server": args.server_pid, "redis": args.redis_pid}
    try:
        await client.ready()
        sessions = [await client.open(i) for i in range(args.concurrency)]
        clock = time.perf_counter_ns
        begin = clock()
        measure_from = begin + int(args.warmup * 1e9)
        measure_to = measure_from + int(args.seconds * 1e9)
        pairs: list[int] = []
        reserves: list[int] = []
        releases: list[int] = []
        problems: list[str] = []

        async def worker(index: int) -> None:
            stub, _, md = sessions[index]
            tenant = tenant_name(index)
            reserve = Pb.ReserveRequest(domain=DOMAIN, descriptor=entries(tenant), copies=1)
            release: Any = None
            while True:
                start = clock()
                if start >= measure_to:
                    return
                reply = await stub.Reserve(reserve, metadata=md, timeout=10)
                middle = clock()
                if reply.granted != 1:
                    problems.append(f"reserve granted {reply.granted}")
                    return
                if release is None:
                    release = Pb.ReleaseRequest(
                        domain=DOMAIN, descriptor=entries(tenant), copies=1,
                        groups=[g.name for g in reply.groups],
                    )  # fmt: skip
                await stub.Release(release, metadata=md, timeout=10)
                end = clock()
                if measure_from <= start and end <= measure_to:
                    pairs.append(end - start)
                    reserves.append(middle - start)
                    releases.append(end - middle)

        cpu: dict[str, float] = {}

        async def sample_cpu() -> None:
            await asyncio.sleep(max(0, measure_from - clock()) / 1e9)
            before = {k: cpu_seconds(p) for k, p in pids.items() if p}
            mine = time.process_time()
            await asyncio.sleep(max(0, measure_to - clock()) / 1e9)
            cpu["client"] = (time.process_time() - mine) / args.seconds
            for name, then in before.items():
                now = cpu_seconds(pids[name])
                if then is not None and now is not None:
                    cpu[name] = (now - then) / args.seconds

        await asyncio.gather(sample_cpu(), *(worker(i) for i in range(args.concurrency)))
        for _, call, _ in sessions:
            await client.end(call)
    finally:
        await client.close()
    for samples in (pairs, reserves, releases):
        samples.sort()
    return {
        "concurrency": args.concurrency,
        "pairs": len(pairs),
        "pairs_per_s": len(pairs) / args.seconds,
        "pair_p50_ms": percentile_ms(pairs, 0.50),
        "pair_p90_ms": percentile_ms(pairs, 0.90),
        "pair_p99_ms": percentile_ms(pairs, 0.99),
        "reserve_p50_ms": percentile_ms(reserves, 0.50),
        "reserve_p99_ms": percentile_ms(reserves, 0.99),
        "release_p50_ms": percentile_ms(releases, 0.50),
        "release_p99_ms": percentile_ms(releases, 0.99),
        "cpu": cpu,
        "problems": problems[:5],
    }


async def run_hold(args: argparse.Namespace) -> None:
    """Open sessions, then on each stdin line: hold N tenants' copies, then close."""
    loop = asyncio.get_running_loop()

    async def step(report: dict[str, Any]) -> str:
        print(json.dumps(report), flush=True)
        line: str = await loop.run_in_executor(None, sys.stdin.readline)
        return line.strip()

    client = Client(args.target, 1)
    try:
        await client.ready()
        sessions = [await client.open(i) for i in range(args.sessions)]

        # Warm up: the script is loaded, this server's lease entry is written, and the
        # server's Redis pool has as many connections as the holding below will use.
        async def warm(i: int) -> None:
            stub, _, md = sessions[i % len(sessions)]
            tenant = f"warm-up-{i}"
            reply = await stub.Reserve(
                Pb.ReserveRequest(domain=DOMAIN, descriptor=entries(tenant), copies=1),
                metadata=md, timeout=10,
            )  # fmt: skip
            await stub.Release(
                Pb.ReleaseRequest(
                    domain=DOMAIN, descriptor=entries(tenant), copies=1,
                    groups=[g.name for g in reply.groups],
                ),
                metadata=md, timeout=10,
            )  # fmt: skip

        for _ in range(3):
            await asyncio.gather(*(warm(i) for i in range(INFLIGHT)))
        await step({"step": "ready"})
        gate = asyncio.Semaphore(INFLIGHT)
        granted = 0

        async def hold(i: int) -> None:
            nonlocal granted
            stub, _, md = sessions[i % len(sessions)]
            request = Pb.ReserveRequest(
                domain=DOMAIN, descriptor=entries(tenant_name(i)), copies=args.copies
            )
            async with gate:
                reply = await stub.Reserve(request, metadata=md, timeout=30)
            granted += reply.granted

        started = time.perf_counter()
        await asyncio.gather(*(hold(i) for i in range(args.tenants)))
        took = time.perf_counter() - started
        await step({"step": "held", "granted": granted, "seconds": took})
        for _, call, _ in sessions:
            await client.end(call)
        await step({"step": "closed"})
    finally:
        await client.close()


async def run_contend(args: argparse.Namespace) -> dict[str, Any]:
    """Workers each holding one copy of the pool once; rounds of them, one client."""
    import ferryman

    clock = time.perf_counter
    rounds: list[dict[str, Any]] = []
    async with ferryman.AsyncClient(args.target, timeout=5) as client:
        if args.mode == "backoff":
            client._core.queues = False  # as against a service that answers at once
        for _ in range(args.rounds):
            grants: list[tuple[float, float]] = []  # (asked, granted)
            releases: list[float] = []

            async def worker(grants: list[tuple[float, float]], releases: list[float]) -> None:
                asked = clock()
                async with client.hold_copy(DOMAIN, {POOL: "x"}, max_wait=30) as hold:
                    if not hold.success:
                        raise RuntimeError(f"not granted: {hold}")
                    grants.append((asked, clock()))
                    await asyncio.sleep(args.hold)
                    releases.append(clock())

            start = clock()
            await asyncio.gather(*(worker(grants, releases) for _ in range(args.workers)))
            took = clock() - start
            # The first grants had free copies; each later one waited for a release.
            waited = sorted(g for _, g in grants)[POOL_COPIES:]
            wakes = [g - r for g, r in zip(waited, sorted(releases), strict=False)]
            rounds.append({"seconds": took, "wakes": wakes})
    return {"rounds": rounds}


async def run_wait(args: argparse.Namespace) -> None:
    """Fill the pool, then keep --waiters calls waiting; on each stdin line: go on."""
    loop = asyncio.get_running_loop()

    async def step(report: dict[str, Any]) -> str:
        print(json.dumps(report), flush=True)
        line: str = await loop.run_in_executor(None, sys.stdin.readline)
        return line.strip()

    client = Client(args.target, 1)
    try:
        await client.ready()
        sessions = [await client.open(i) for i in range(args.sessions)]
        stub, _, md = sessions[0]
        request = Pb.ReserveRequest(domain=DOMAIN, descriptor=[Pb.Entry(key=POOL, value="x")])
        full = Pb.ReserveRequest()
        full.CopyFrom(request)
        full.copies = POOL_COPIES
        reply = await stub.Reserve(full, metadata=md)
        if reply.granted != POOL_COPIES:
            raise RuntimeError(f"the pool is not free: {reply}")
        await step({"step": "ready"})
        request.max_wait.FromSeconds(300)
        calls = [
            sessions[i % len(sessions)][0].Reserve(
                request, metadata=sessions[i % len(sessions)][2], timeout=600
            )
            for i in range(args.waiters)
        ]
        await asyncio.sleep(0.5)
        await step({"step": "waiting"})
        for call in calls:
            call.cancel()
        for _, call, _ in sessions:
            await client.end(call)
        await step({"step": "closed"})
    finally:
        await client.close()


# --------------------------------------------------------------------------- processes


class Stack:
    """A ferryman server (and its redis-server) in a directory of its own."""

    def __init__(self, procs: Processes, workdir: Path, backend: str) -> None:
        self.procs = procs
        self.backend = backend
        self.redis: subprocess.Popen[Any] | None = None
        self.redis_port: int | None = None
        workdir.mkdir(parents=True)
        url = "memory"
        if backend == "redis":
            binary = shutil.which("redis-server")
            if binary is None:
                raise RuntimeError("--backend redis needs redis-server on PATH")
            self.redis_port = port = free_port()
            log = workdir / "redis.log"
            argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
            argv += ["--appendonly", "no", "--dir", str(workdir)]
            with log.open("w") as out:
                self.redis = procs.start(argv, stdout=out, stderr=subprocess.STDOUT)
            wait_ready(self.redis, lambda: port_open(port), "redis-server", log)
            url = f"redis://127.0.0.1:{port}"
        config = workdir / "config"
        config.mkdir()
        (config / "bench.yaml").write_text(CONFIG_YAML)
        self.grpc_port, http_port = free_port(), free_port()
        log = workdir / "ferryman.log"
        env = dict(os.environ)
        for name in ("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"):
            env.pop(name, None)
        for name in ("CACHE_KEY_PREFIX", "HOLD_LEASE_SECONDS"):
            env.pop(name, None)
        env.update(HOST="127.0.0.1", GRPC_HOST="127.0.0.1", DEBUG_HOST="127.0.0.1")
        env.update(LOG_LEVEL="WARN")
        argv = [sys.executable, "-m", "ferryman", "serve", "--config", str(config)]
        argv += ["--backend", url, "--grpc-port", str(self.grpc_port)]
        argv += ["--http-port", str(http_port), "--debug-port", str(free_port())]
        with log.open("w") as out:
            self.server = procs.start(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        health = f"http://127.0.0.1:{http_port}/healthcheck"
        wait_ready(
            self.server, lambda: http_ok(health) and port_open(self.grpc_port), "ferryman", log
        )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def redis_client(self) -> Any:
        import redis

        assert self.redis_port is not None, "this run has no Redis"
        return redis.Redis(port=self.redis_port, socket_timeout=10, decode_responses=True)

    def close(self) -> None:
        self.procs.stop(self.server)
        if self.redis is not None:
            self.procs.stop(self.redis)


# --------------------------------------------------------------------------- measurements


def throughput(procs: Processes, stack: Stack, args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for concurrency in args.concurrency:
        argv = [sys.executable, __file__, "--role", "load", "--target", stack.target]
        argv += ["--concurrency", str(concurrency), "--channels", str(args.channels)]
        argv += ["--warmup", str(args.warmup), "--seconds", str(args.seconds)]
        argv += ["--server-pid", str(stack.server.pid)]
        if stack.redis is not None:
            argv += ["--redis-pid", str(stack.redis.pid)]
        child = procs.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = child.communicate(timeout=args.warmup + args.seconds + 2 * START_TIMEOUT)
        finally:
            procs.stop(child)
        if child.returncode != 0:
            raise RuntimeError(f"load client failed:\n{err.decode(errors='replace')[-3000:]}")
        result = {"backend": stack.backend, **json.loads(out)}
        if result["problems"]:
            raise RuntimeError(f"load client saw: {result['problems']}")
        results.append(result)
    return results


def _used_memory(db: Any) -> int:
    return int(db.info("memory")["used_memory"])


def _keys_bytes(db: Any) -> int:
    """MEMORY USAGE (every element sampled) summed over the node's keys."""
    return sum(db.memory_usage(k, samples=0) or 0 for k in db.keys("{" + NODE + "}:*"))


def _clients(db: Any) -> int:
    return int(db.info("clients")["connected_clients"])


def hold_memory(
    procs: Processes, stack: Stack, tenants: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Bytes per hold through a server: N tenants each holding --copies copies."""
    argv = [sys.executable, __file__, "--role", "hold", "--target", stack.target]
    argv += ["--tenants", str(tenants), "--sessions", str(args.sessions)]
    argv += ["--copies", str(args.copies)]
    child = procs.start(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    db = stack.redis_client() if stack.redis is not None else None

    def step(expected: str) -> dict[str, Any]:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        if not line:
            err = child.stderr.read() if child.stderr is not None else ""
            raise RuntimeError(f"hold client ended early:\n{err[-3000:]}")
        report: dict[str, Any] = json.loads(line)
        if report.get("step") != expected:
            raise RuntimeError(f"hold client: expected {expected}, got {report}")
        return report

    assert child.stdin is not None
    try:
        step("ready")
        time.sleep(0.5)
        rss_before = rss_bytes(stack.server.pid)
        used_before = _used_memory(db) if db is not None else None
        clients = [_clients(db)] if db is not None else []
        keys_before = _keys_bytes(db) if db is not None else 0
        child.stdin.write("go\n")
        child.stdin.flush()
        held = step("held")
        if held["granted"] != tenants * args.copies:
            raise RuntimeError(f"granted {held['granted']} of {tenants * args.copies}")
        time.sleep(0.5)
        rss_held = rss_bytes(stack.server.pid)
        out: dict[str, Any] = {
            "backend": stack.backend,
            "tenants": tenants,
            "copies_each": args.copies,
            "sessions": args.sessions,
            "reserve_seconds": held["seconds"],
        }
        if rss_before is not None and rss_held is not None:
            out["server_rss_bytes_per_hold"] = (rss_held - rss_before) / tenants
        if db is not None and used_before is not None:
            used_held = _used_memory(db)
            clients.append(_clients(db))
            out["redis_used_memory_bytes_per_hold"] = (used_held - used_before) / tenants
            out["redis_keys_bytes_per_hold"] = (_keys_bytes(db) - keys_before) / tenants
            tag = "{" + NODE + "}"
            contributions = db.keys(f"{tag}:c:*")
            out["redis_counts_hash_bytes"] = db.memory_usage(f"{tag}:n", samples=0)
            out["redis_contributions_hash_bytes"] = sum(
                db.memory_usage(k, samples=0) or 0 for k in contributions
            )
            out["redis_counts_hash_encoding"] = db.object("encoding", f"{tag}:n")
        child.stdin.write("go\n")
        child.stdin.flush()
        step("closed")
        if db is not None:
            tag = "{" + NODE + "}"
            deadline = time.monotonic() + 10
            while db.exists(f"{tag}:n") and time.monotonic() < deadline:
                time.sleep(0.05)
            left = db.hgetall(f"{tag}:n")
            if left:
                raise RuntimeError(f"counts not back at zero after the sessions closed: {left}")
            used_closed = _used_memory(db)
            clients.append(_clients(db))
            out["redis_connected_clients_before_held_closed"] = clients
            # The same connections exist with the holds and after: the fairer difference.
            out["redis_used_memory_bytes_per_hold_vs_closed"] = (used_held - used_closed) / tenants
            out["redis_used_memory_after_close_minus_before"] = used_closed - (used_before or 0)
        child.stdin.write("go\n")
        child.stdin.flush()
        child.wait(START_TIMEOUT)
    finally:
        procs.stop(child)
        if db is not None:
            db.close()
    return out


def _child_json(procs: Processes, argv: list[str], timeout: float) -> dict[str, Any]:
    child = procs.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        procs.stop(child)
    if child.returncode != 0:
        raise RuntimeError(f"client failed:\n{err.decode(errors='replace')[-3000:]}")
    result: dict[str, Any] = json.loads(out)
    return result


def contention(
    procs: Processes, stack: Stack, mode: str, args: argparse.Namespace
) -> dict[str, Any]:
    """The contended pool's utilization and wake-ups, waiting one way (``mode``)."""
    argv = [sys.executable, __file__, "--role", "contend", "--target", stack.target]
    argv += ["--mode", mode, "--workers", str(args.workers), "--hold", str(args.hold)]
    argv += ["--rounds", str(args.rounds)]
    cpu = {"server": stack.server.pid, "redis": stack.redis.pid if stack.redis else None}
    cpu_before = {k: cpu_seconds(v) if v else None for k, v in cpu.items()}
    started = time.perf_counter()
    result = _child_json(procs, argv, args.rounds * 60 + START_TIMEOUT)
    wall = time.perf_counter() - started
    ideal = args.workers * args.hold / POOL_COPIES
    lengths = [r["seconds"] for r in result["rounds"]]
    wakes = sorted(round(w * 1e9) for r in result["rounds"] for w in r["wakes"])
    out: dict[str, Any] = {
        "backend": stack.backend,
        "mode": mode,
        "workers": args.workers,
        "rounds": args.rounds,
        "ideal_seconds": ideal,
        "run_seconds_mean": sum(lengths) / len(lengths),
        "utilization_mean": ideal / (sum(lengths) / len(lengths)),
        "utilization_worst": ideal / max(lengths),
        "wakeups": len(wakes),
        "wake_p50_ms": percentile_ms(wakes, 0.5),
        "wake_p99_ms": percentile_ms(wakes, 0.99),
    }
    for name, before in cpu_before.items():
        pid = cpu[name]
        after = cpu_seconds(pid) if pid else None
        if before is not None and after is not None:
            out[f"{name}_cpu_share"] = (after - before) / wall
    return out


def waiter_cost(procs: Processes, stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    """Memory per waiting caller, and the CPU spent while they all wait."""
    argv = [sys.executable, __file__, "--role", "wait", "--target", stack.target]
    argv += ["--waiters", str(args.waiters), "--sessions", str(args.sessions)]
    child = procs.start(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    db = stack.redis_client() if stack.redis is not None else None
    pids = {"server": stack.server.pid, "redis": stack.redis.pid if stack.redis else None}

    def step(expected: str) -> None:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        if not line or json.loads(line).get("step") != expected:
            err = child.stderr.read() if child.stderr is not None else ""
            raise RuntimeError(f"wait client: expected {expected}, got {line!r}\n{err[-3000:]}")

    def go() -> None:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()

    try:
        step("ready")
        time.sleep(0.5)
        rss_before = rss_bytes(stack.server.pid)
        used_before = _used_memory(db) if db is not None else None
        go()
        step("waiting")
        time.sleep(0.5)
        out: dict[str, Any] = {"backend": stack.backend, "waiters": args.waiters}
        rss_waiting = rss_bytes(stack.server.pid)
        if rss_before is not None and rss_waiting is not None:
            out["server_rss_bytes_per_waiter"] = (rss_waiting - rss_before) / args.waiters
        if db is not None and used_before is not None:
            out["redis_used_memory_bytes_per_waiter"] = (
                _used_memory(db) - used_before
            ) / args.waiters
        before = {k: cpu_seconds(v) if v else None for k, v in pids.items()}
        time.sleep(2.0)
        for name, was in before.items():
            pid = pids[name]
            now = cpu_seconds(pid) if pid else None
            if was is not None and now is not None:
                out[f"{name}_cpu_share_while_waiting"] = (now - was) / 2.0
        go()
        step("closed")
        go()
        child.wait(START_TIMEOUT)
    finally:
        procs.stop(child)
        if db is not None:
            db.close()
    return out


def ledger_memory(tenants: int, copies: int) -> dict[str, Any]:
    """In process: tracemalloc over the memory copy store and a session hold set, per hold."""
    from ferryman.algorithms.copies.memory import MemoryCopies
    from ferryman.algorithms.copies.model import CopyGroup, CopyPolicy, Holder
    from ferryman.clock import ManualClock

    group = CopyGroup("everyone", BIG, ("*",))
    policy = CopyPolicy(limit=TENANT_LIMIT, global_limit=BIG, groups=(group,))
    groups = (group,)
    server, lease_ms, now = "0123456789abcdef", 10_000, 1_700_000_000.0
    ledger = MemoryCopies(ManualClock(now))

    def run(call: Coroutine[Any, Any, T]) -> T:
        # The memory store never awaits: one step of the coroutine is the whole call.
        try:
            call.send(None)
        except StopIteration as done:
            return cast(T, done.value)
        raise RuntimeError("the memory copy store awaited")

    holder = Holder(NODE, server, lease_ms, now)
    run(ledger.reserve(holder, "warm-up", policy, groups, 1, 1))
    run(ledger.release(holder, "warm-up", ("everyone",), 1))
    names = [tenant_name(i) for i in range(tenants)]  # allocated before measuring
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for name in names:
            run(ledger.reserve(holder, name, policy, groups, copies, copies))
        gc.collect()
        ledger_bytes = tracemalloc.get_traced_memory()[0] - before
        # What HoldManager keeps per session: {(node, tenant, groups): copies}.
        hold_sets: list[dict[tuple[str, str, tuple[str, ...]], int]] = [{} for _ in range(100)]
        before = tracemalloc.get_traced_memory()[0]
        for i, name in enumerate(names):
            hold_sets[i % 100][(NODE, name, ("everyone",))] = copies
        gc.collect()
        hold_set_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counts = ledger.counts(NODE)
    if counts.get("all") != tenants * copies:
        raise RuntimeError(f"ledger holds {counts.get('all')} copies, not {tenants * copies}")
    return {
        "backend": "memory (in process)",
        "tenants": tenants,
        "copies_each": copies,
        "ledger_bytes_per_hold": ledger_bytes / tenants,
        "session_hold_set_bytes_per_hold": hold_set_bytes / tenants,
    }


# --------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--role", choices=["main", "load", "hold", "contend", "wait"], default="main")
    p.add_argument("--parts", default="throughput,memory,queue", help="what to measure")
    p.add_argument("--workers", type=int, default=20, help="contended workers")
    p.add_argument("--hold", type=float, default=0.1, help="seconds each worker holds")
    p.add_argument("--rounds", type=int, default=5, help="contended runs per way")
    p.add_argument("--waiters", type=int, default=1000, help="waiting callers for the cost")
    p.add_argument("--mode", choices=["queue", "backoff"], default="queue")
    p.add_argument("--backend", default="memory,redis", help="comma-separated: memory,redis")
    p.add_argument("--concurrency", default="1,16,64", help="sessions at once (list)")
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--tenants", default="1000,10000", help="tenants holding copies (list)")
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--copies", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this long")
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    p.add_argument("--redis-pid", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "load":
        args.concurrency = int(args.concurrency)
    elif args.role == "hold":
        args.tenants = int(args.tenants)
    else:
        args.concurrency = _ints(args.concurrency)
        args.tenants = _ints(args.tenants)
        args.backend = [b for b in args.backend.split(",") if b]
        unknown = set(args.backend) - {"memory", "redis"}
        if unknown:
            p.error(f"--backend: unknown {sorted(unknown)}")
    return args


def _fmt(row: Mapping[str, Any]) -> Iterator[str]:
    for key, value in row.items():
        if isinstance(value, float):
            yield f"{key}={value:,.1f}" if abs(value) >= 100 else f"{key}={value:.3f}"
        elif isinstance(value, dict):
            yield f"{key}=" + ",".join(f"{k}:{v:.2f}" for k, v in value.items())
        elif key != "problems":
            yield f"{key}={value}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "load":
        print(json.dumps(asyncio.run(run_load(args))))
        return 0
    if args.role == "hold":
        asyncio.run(run_hold(args))
        return 0
    if args.role == "contend":
        print(json.dumps(asyncio.run(run_contend(args))))
        return 0
    if args.role == "wait":
        asyncio.run(run_wait(args))
        return 0

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGALRM, stop)
    signal.alarm(max(1, int(args.timeout)))
    procs = Processes()
    results: dict[str, list[dict[str, Any]]] = {"throughput": [], "memory": [], "queue": []}
    parts = set(args.parts.split(","))

    def show(section: str, row: dict[str, Any]) -> None:
        results[section].append(row)
        if not args.json:
            print(f"{section}: " + " ".join(_fmt(row)), flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="bench_holds_") as tmp:
            work = Path(tmp)
            for backend in args.backend if "throughput" in parts else ():
                stack = Stack(procs, work / f"{backend}-load", backend)
                try:
                    for row in throughput(procs, stack, args):
                        show("throughput", row)
                finally:
                    stack.close()
            for backend in args.backend if "queue" in parts else ():
                stack = Stack(procs, work / f"{backend}-queue", backend)
                try:
                    for mode in ("queue", "backoff"):
                        show("queue", contention(procs, stack, mode, args))
                    show("queue", waiter_cost(procs, stack, args))
                finally:
                    stack.close()
            for backend in args.backend if "memory" in parts else ():
                for tenants in args.tenants:
                    stack = Stack(procs, work / f"{backend}-hold-{tenants}", backend)
                    try:
                        show("memory", hold_memory(procs, stack, tenants, args))
                    finally:
                        stack.close()
                    if backend == "memory":
                        show("memory", ledger_memory(tenants, args.copies))
    finally:
        signal.alarm(0)
        procs.close()
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
