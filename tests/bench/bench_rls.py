"""Throughput and latency of ferryman's ShouldRateLimit, next to a do-nothing gRPC ceiling.

Usage (the README's figures: ``--pin --repeat 3``, with ``--backend redis --scenario
fixed,burst,copies --half-rate`` for Redis and ``--workers 1,2`` for the workers)::

    python tests/bench/bench_rls.py [--seconds N] [--concurrency C] [--channels K]
                                    [--backend memory|redis|URL] [--repeat R] [--json]
                                    [--scenario fixed|burst|request[,...]]
                                    [--env NAME=VALUE ...] [--pin] [--load auto|h2load|python]
                                    [--clients N] [--streams M] [--requests R] [--half-rate]
                                    [--workers 1,2] [--in-process]
                                    [--event-loop auto|uvloop|asyncio] [--reference-ceiling]

The script starts ``ferryman serve`` on free loopback ports with a small descriptor config
(a domain with bare-key rules whose limits are never reached), then drives it from a separate
client process: C workers on one grpc.aio event loop sharing K channels, each sending calls
back to back for a short warm-up and then for the measured duration. The same load is then
sent to a do-nothing grpc.aio server (in its own process), the best a Python gRPC server can
do on this machine, and each ferryman figure is reported with its ratio to it.

Scenarios (``--scenario``, comma-separated to run several against one server):

- ``fixed`` (default): ShouldRateLimit on the fixed-window rules, 1 and 3 descriptors
  (``--descriptors``);
- ``burst``: ShouldRateLimit with one descriptor on a 3-tier burst node (5/1s active 1h,
  unbounded with h2load, whose one user would otherwise be refused;
  50/1s active 5s, cooldown 15s; 500/1s active 1s, cooldown 60s; no hard or global limit),
  keyed by a user among 10k, so nearly every request is granted in tier 1 and the per-tenant
  state is that of a realistic population;
- ``request``: ``ferryman.v1.Limiter/Request`` (copies=1) on the same node and users;
- ``copies``: ShouldRateLimit holding one copy of a copy-limited node (never refused, holds
  last 10 s), for h2load; the Python client alternates each user's hold and its release.

Load: h2load when it is on PATH (``--load``): ``--clients`` connections of ``--streams``
streams each send one serialized request ``--requests`` times (after a fifth as many to warm
up); otherwise the Python client below. For every run the script reads from /proc the CPU
time of the server (all its processes) and of redis-server, and prints it per request, with
ferryman's own share (its CPU per request minus the ceiling's): CPU per request is the
robust figure on a shared machine, where req/s swings. ``--half-rate`` then runs each case
at half the ceiling's req/s, paced (requests sent evenly, whatever the answers: several h2load
processes of one connection each, or the Python client's open loop), and compares p50 and
p99 latencies. ``--workers 1,2`` starts one
ferryman per count (``serve --workers N``; more than one needs Redis) and compares them.
The targets (share of the ceiling for memory, Redis exact and Redis synced with ``--env
REDIS_SYNC_INTERVAL=100ms``, burst tiers and held copies; p99 at half rate; a second
worker's CPU per request) are printed at the end.
``--in-process`` measures only ferryman's own work: the RLS servicer called in a loop on
2,000 distinct requests on the memory backend, no gRPC and no other process.

Client and server share the machine's cores, so the numbers are for comparison between runs
on the same machine, not absolute capacity. gRPC asyncio throughput swings from second to
second; ``--repeat 3`` interleaves the runs of the two servers and reports the median.
``--env NAME=VALUE`` passes settings to ferryman, e.g. ``--env REDIS_PIPELINE_WINDOW=2ms``
to compare Redis batching at a given ``--concurrency``. ``--pin`` pins the server (ferryman or the
ceiling) to the first CPU and the client to the others, like a sidecar given one core
(redis-server is not pinned).
``--event-loop`` (default auto: uvloop when installed) is the loop of both ferryman
(``EVENT_LOOP``) and the ceiling, so that the ceiling is the best on the same loop;
``--reference-ceiling`` adds a ceiling on asyncio's own loop (``ceiling@asyncio``), for
"ferryman on uvloop vs the do-nothing servicer on uvloop and on asyncio". The loop each server
ran on (ferryman's from its /status, the ceiling's from its log) heads the results.
This is a benchmark, not a test: pytest does not collect this directory.

Internal roles (used by the script itself): ``--role client`` runs the load and prints JSON,
``--role ceiling`` serves the do-nothing RateLimitService.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman.core.wire import mark_negative_hits
from ferryman.errors import SettingsError
from ferryman.server import event_loop

from helpers.ports import free_port

DOMAIN = "bench"
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
LIMITER_METHOD = "/ferryman.v1.Limiter/Request"
SCENARIOS = ("fixed", "burst", "request", "copies")
BURST_KEY = "burst_user"  # the burst-tier node of the config
HOLD_KEY = "hold_user"  # the copy-limited node of the config
HUGE = 1_000_000_000  # requests_per_unit: nothing ever goes over
USERS = 10_000
TENANTS = 100
PATHS = 20
POOL = 16_384  # distinct pre-serialized requests per run
START_TIMEOUT = 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
REFERENCE = "ceiling@asyncio"  # --reference-ceiling: the do-nothing servicer on asyncio's loop
# The floors, as shares of the ceiling's req/s: (1 descriptor, 3 or more) for fixed windows;
# burst tiers and held copies on Redis (any other scenario) one figure. Set just under what
# the release measured, so that a change that costs request-path CPU shows as NOT met.
SHARE_TARGETS: dict[str, Any] = {
    "memory": (0.80, 0.75),
    "redis": (0.65, 0.62),
    "synced": (0.75, 0.75),
    "other": 0.58,
}
P99_GAP_MS = 2.0  # p99 at half the ceiling's rate, over the ceiling's p99 at that rate
WORKER_CPU_MARGIN = 0.10  # --workers 2's CPU per request over one worker's

CONFIG_YAML = f"""\
# Written by tests/bench/bench_rls.py: bare-key rules, one counter per value, never over.
domain: {DOMAIN}
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: {HUGE}
  - key: tenant
    rate_limit:
      unit: second
      requests_per_unit: {HUGE}
  - key: path
    rate_limit:
      unit: hour
      requests_per_unit: {HUGE}
"""

# Added to the config only for --scenario burst|request, so the fixed runs see today's config.
BURST_YAML = f"""\
  # Burst tiers: a user gets 5/s, may burst to 50/s for 5 s (then 15 s of cooldown) and to
  # 500/s for 1 s (then a minute of cooldown); no hard or global limit.
  - key: {BURST_KEY}
    burst_tiers:
      - {{limit: TIER1, window: 1s, active: 1h, cooldown: 0}}
      - {{limit: 50, window: 1s, active: 5s, cooldown: 15s}}
      - {{limit: 500, window: 1s, active: 1s, cooldown: 60s}}
  # Held copies (Envoy's concurrency limit): a hold per hit, never refused, gone after 10 s
  # when its release is not sent.
  - key: {HOLD_KEY}
    copies:
      limit: {HUGE}
      hold_ttl: 10s
"""


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    target: str  # the backend name ("memory") or "ceiling"
    scenario: str  # fixed, burst or request
    descriptors: int
    concurrency: int
    channels: int
    seconds: float
    requests: int
    errors: int
    not_ok: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    server_cpu: float | None = None  # share of one core used by the server process
    client_cpu: float | None = None  # share of one core used by the client process
    ratio_to_ceiling: float | None = None
    error_samples: list[str] = field(default_factory=list)
    per_second: list[int] = field(default_factory=list)  # completions in each measured second
    rps_runs: list[float] = field(default_factory=list)  # req/s of each repeat, in run order
    server_rss_mb: float | None = None  # the server's resident memory after the run
    # CPU per request in microseconds, from /proc over the run: the server's (all its
    # processes) and redis-server's; ``own_us`` is the server's minus the ceiling's.
    cpu_us: float | None = None
    redis_us: float | None = None
    own_us: float | None = None
    cpu_us_runs: list[float] = field(default_factory=list)
    redis_us_runs: list[float] = field(default_factory=list)
    load: str = "python"  # the load generator: h2load or python
    rate: float | None = None  # the offered req/s of a fixed-rate run (None: flat out)

    @property
    def label(self) -> str:
        return case_label(self.scenario, self.descriptors)

    def line(self) -> str:
        if self.rate is not None:
            shape = "paced"
        elif self.load == "python":
            shape = f"c={self.concurrency:<4}ch={self.channels}"
        else:
            shape = f"{self.channels}x{self.concurrency}"
        text = (
            f"{self.target:<15} {self.label:<15}{shape:<9}"
            f"{self.rps:>7.0f} req/s  p50 {self.p50_ms:5.2f} ms  p99 {self.p99_ms:5.2f} ms"
        )
        if self.ratio_to_ceiling is not None:
            text += f"  {self.ratio_to_ceiling:4.0%} of ceiling"
        if len(self.rps_runs) > 1:
            text += f" (runs {min(self.rps_runs):.0f}-{max(self.rps_runs):.0f})"
        if self.cpu_us is not None:
            runs = self.cpu_us_runs or [self.cpu_us]
            text += f"  cpu/req {min(runs):.0f}/{self.cpu_us:.0f} us"
            if self.own_us is not None:
                text += f" (own {self.own_us:+.0f})"
        if self.redis_us is not None:
            runs = self.redis_us_runs or [self.redis_us]
            text += f"  redis {min(runs):.0f}/{self.redis_us:.0f} us"
        elif self.server_cpu is not None and self.client_cpu is not None:
            text += f"  cpu server {self.server_cpu:4.0%} client {self.client_cpu:4.0%}"
        if self.server_rss_mb is not None:
            text += f"  rss {self.server_rss_mb:.0f} MB"
        if self.errors or self.not_ok:
            text += f"  ERRORS {self.errors} not-OK {self.not_ok}"
        return text


def case_label(scenario: str, descriptors: int) -> str:
    if scenario == "burst":
        return "burst RLS"
    if scenario == "request":
        return "burst Request"
    if scenario == "copies":
        return "held copy RLS"
    noun = "descriptor" if descriptors == 1 else "descriptors"
    return f"{descriptors} {noun}"


def percentile(ordered: Sequence[int], fraction: float) -> float:
    """Nearest-rank percentile of sorted nanosecond latencies, in milliseconds."""
    if not ordered:
        return float("nan")
    rank = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[rank] / 1e6


# --------------------------------------------------------------------------- client role


def build_requests(scenario: str, descriptors: int, count: int, seed: int) -> list[bytes]:
    """Serialized requests whose values vary (users among USERS, and so on): RateLimitRequests,
    or for ``request`` ferryman.v1 RateRequests."""
    rng = random.Random(seed)
    Descriptor = ratelimit_pb2.RateLimitDescriptor
    Entry = Descriptor.Entry
    if scenario == "request":
        return [
            limiter_pb2.RateRequest(
                domain=DOMAIN,
                descriptor=[limiter_pb2.Entry(key=BURST_KEY, value=f"u{rng.randrange(USERS)}")],
                copies=1,
            ).SerializeToString()
            for _ in range(count)
        ]
    if scenario == "copies":
        # Pairs: a hold of one copy, then its release (a negative hit), for a user.
        out: list[bytes] = []
        while len(out) < count:
            user = f"u{rng.randrange(USERS)}"
            for negative in (False, True):
                held = Descriptor(entries=[Entry(key=HOLD_KEY, value=user)])
                held.hits_addend.value = 1
                if negative:
                    mark_negative_hits(held)
                out.append(
                    rls_pb2.RateLimitRequest(domain=DOMAIN, descriptors=[held]).SerializeToString()
                )
        return out[:count]
    if scenario == "burst":
        return [
            rls_pb2.RateLimitRequest(
                domain=DOMAIN,
                descriptors=[
                    Descriptor(entries=[Entry(key=BURST_KEY, value=f"u{rng.randrange(USERS)}")])
                ],
            ).SerializeToString()
            for _ in range(count)
        ]
    makers: list[Callable[[], tuple[str, str]]] = [
        lambda: ("user", f"u{rng.randrange(USERS)}"),
        lambda: ("tenant", f"t{rng.randrange(TENANTS)}"),
        lambda: ("path", f"/api/v1/r{rng.randrange(PATHS)}"),
    ]
    out = []
    for _ in range(count):
        built = []
        for i in range(descriptors):
            key, value = makers[i % len(makers)]()
            built.append(Descriptor(entries=[Entry(key=key, value=value)]))
        request = rls_pb2.RateLimitRequest(domain=DOMAIN, descriptors=built)
        out.append(request.SerializeToString())
    return out


def _identity(data: bytes) -> bytes:
    return data


def _rls_ok(response: Any) -> bool:
    return bool(response.overall_code == rls_pb2.RateLimitResponse.OK)


def _granted(response: Any) -> bool:
    return bool(response.granted >= 1)


def rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` in MB from /proc (None where there is no /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


async def run_load(
    target: str,
    *,
    scenario: str,
    descriptors: int,
    concurrency: int,
    channels: int,
    warmup: float,
    seconds: float,
    seed: int,
    server_pid: int | None = None,
    rate: float | None = None,
    same: bool = False,
) -> dict[str, Any]:
    """Closed loop (``concurrency`` workers, each sending its next call when the last one is
    answered) or, with ``rate``, open loop: one call every 1/rate seconds whatever the answers,
    so that latency is the server's at that load and not the queue of a burst. ``same``
    sends one request over and over, as h2load does."""
    method = LIMITER_METHOD if scenario == "request" else METHOD
    parse: Callable[[bytes], Any] = (
        limiter_pb2.RateResponse.FromString
        if scenario == "request"
        else rls_pb2.RateLimitResponse.FromString
    )
    is_ok: Callable[[Any], bool] = _granted if scenario == "request" else _rls_ok
    pool = build_requests(scenario, descriptors, 1 if same else POOL, seed)
    # A local subchannel pool gives each channel its own TCP connection.
    opened = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(channels)
    ]
    calls = [
        ch.unary_unary(method, request_serializer=_identity, response_deserializer=parse)
        for ch in opened
    ]
    try:
        for ch in opened:
            await asyncio.wait_for(ch.channel_ready(), START_TIMEOUT)
        begin = time.perf_counter_ns()
        measure_from = begin + int(warmup * 1e9)
        measure_to = measure_from + int(seconds * 1e9)
        latencies: list[int] = []
        per_second = [0] * max(1, math.ceil(seconds))
        last_second = len(per_second) - 1
        errors: list[str] = []
        counts = {"errors": 0, "not_ok": 0}

        async def worker(index: int) -> None:
            call = calls[index % len(calls)]
            position = (index * 7919) % len(pool)
            record = latencies.append
            clock = time.perf_counter_ns
            while True:
                start = clock()
                if start >= measure_to:
                    return
                request = pool[position]
                position = (position + 1) % len(pool)
                try:
                    response = await call(request, timeout=10)
                except grpc.aio.AioRpcError as exc:
                    end = clock()
                    if measure_from <= start and end <= measure_to:
                        counts["errors"] += 1
                        if len(errors) < 5:
                            errors.append(f"{exc.code().name}: {exc.details()}")
                    continue
                end = clock()
                if measure_from <= start and end <= measure_to:
                    record(end - start)
                    per_second[min(last_second, (end - measure_from) // 1_000_000_000)] += 1
                    if not is_ok(response):
                        counts["not_ok"] += 1

        async def one(call: Any, request: bytes) -> None:
            """One call of the open loop, recorded like a worker's."""
            start = clock()
            try:
                response = await call(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                if measure_from <= start < measure_to:
                    counts["errors"] += 1
                    if len(errors) < 5:
                        errors.append(f"{exc.code().name}: {exc.details()}")
                return
            end = clock()
            if measure_from <= start < measure_to:
                latencies.append(end - start)
                per_second[min(last_second, (start - measure_from) // 1_000_000_000)] += 1
                if not is_ok(response):
                    counts["not_ok"] += 1

        async def paced(rate: float) -> None:
            """Starts call i at begin + i/rate (the loop wakes about every millisecond and
            starts every call then due), round robin over the channels, then waits for all."""
            period = 1e9 / rate
            running: set[asyncio.Task[None]] = set()
            sent = 0
            while True:
                now = clock()
                due = begin + int(sent * period)
                if due >= measure_to:
                    break
                if due > now:
                    await asyncio.sleep((due - now) / 1e9)
                    continue
                while due <= now and due < measure_to:
                    task = asyncio.create_task(
                        one(calls[sent % len(calls)], pool[sent % len(pool)])
                    )
                    running.add(task)
                    task.add_done_callback(running.discard)
                    sent += 1
                    due = begin + int(sent * period)
            if running:
                await asyncio.wait(running)

        clock = time.perf_counter_ns
        cpu: dict[str, float] = {}

        async def sample_cpu() -> None:
            """CPU used by this process and by the server over the measured window."""

            def server_now() -> float | None:
                return None if server_pid is None else cpu_seconds(server_pid)

            await asyncio.sleep(max(0, measure_from - time.perf_counter_ns()) / 1e9)
            mine, theirs = time.process_time(), server_now()
            await asyncio.sleep(max(0, measure_to - time.perf_counter_ns()) / 1e9)
            cpu["client"] = (time.process_time() - mine) / seconds
            after = server_now()
            if theirs is not None and after is not None:
                cpu["server"] = (after - theirs) / seconds

        if rate is not None:
            await asyncio.gather(sample_cpu(), paced(rate))
        else:
            await asyncio.gather(sample_cpu(), *(worker(i) for i in range(concurrency)))
    finally:
        for ch in opened:
            await ch.close(None)
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": counts["errors"],
        "not_ok": counts["not_ok"],
        "error_samples": errors,
        "rps": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 0.50),
        "p90_ms": percentile(latencies, 0.90),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": latencies[-1] / 1e6 if latencies else float("nan"),
        "client_cpu": cpu.get("client"),
        "server_cpu": cpu.get("server"),
        "per_second": per_second,
        "server_rss_mb": None if server_pid is None else rss_mb(server_pid),
    }


def client_main(args: argparse.Namespace) -> int:
    result = asyncio.run(
        run_load(
            args.target,
            scenario=args.scenario,
            descriptors=args.descriptors,
            concurrency=args.concurrency,
            channels=args.channels,
            warmup=args.warmup,
            seconds=args.seconds,
            seed=args.seed,
            server_pid=args.server_pid,
            rate=args.rate,
            same=args.same,
        )
    )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


# --------------------------------------------------------------------------- in process


async def in_process(counts: Sequence[int], seed: int, rounds: int = 7) -> list[str]:
    """Ferryman's own work per request without gRPC: the RLS servicer called in a loop on
    2,000 distinct requests (memory backend, the benchmark's config), each answer serialized
    as gRPC would; CPU per request (min/median of ``rounds``), one line per count."""
    from ferryman.apis.rls import RateLimitServicer
    from ferryman.backends.memory import MemoryBackend
    from ferryman.clock import SystemClock
    from ferryman.config.loader import load_sources
    from ferryman.config.reloader import ConfigHolder
    from ferryman.engine import RateLimitEngine
    from ferryman.stats import Stats

    lines = []
    for n in counts:
        clock = SystemClock()
        holder = ConfigHolder(config=load_sources([("bench.yaml", CONFIG_YAML)]))
        engine = RateLimitEngine(holder, MemoryBackend(clock), clock, Stats())
        call = RateLimitServicer(engine).ShouldRateLimit
        requests = [
            rls_pb2.RateLimitRequest.FromString(data)
            for data in build_requests("fixed", n, 2000, seed)
        ]
        context: Any = None  # the servicer does not use it
        for request in requests:  # warm: each request converted and matched once
            await call(request, context)
        per: list[float] = []
        for _ in range(rounds):
            start = time.process_time()
            for _ in range(3):
                for request in requests:
                    await call(request, context)
            per.append((time.process_time() - start) / (3 * len(requests)) * 1e6)
        per.sort()
        lines.append(
            f"in process  {case_label('fixed', n):<15}cpu/req {per[0]:.1f}/"
            f"{per[len(per) // 2]:.1f} us (min/median of {rounds})"
        )
    return lines


# --------------------------------------------------------------------------- ceiling role


async def serve_ceiling(port: int) -> None:
    """A RateLimitService that answers OK at once, with one OK status per descriptor, and a
    ferryman.v1.Limiter that grants every Request at once."""
    Response = rls_pb2.RateLimitResponse
    canned = {
        n: Response(
            overall_code=Response.OK,
            statuses=[Response.DescriptorStatus(code=Response.OK) for _ in range(n)],
        )
        for n in range(8)
    }
    fallback = Response(overall_code=Response.OK)

    class NullServicer(rls_pb2_grpc.RateLimitServiceServicer):
        async def ShouldRateLimit(
            self, request: rls_pb2.RateLimitRequest, context: Any
        ) -> rls_pb2.RateLimitResponse:
            return canned.get(len(request.descriptors), fallback)

    # A reply shaped like ferryman's for a grant in tier 1, so both encode alike.
    granted = limiter_pb2.RateResponse(
        granted=1,
        active_tier_index=1,
        active_tier_limit=5,
        active_tier_hits=1,
        tenant_hits_last_second=1,
        global_hits_last_second=1000,
    )
    granted.active_tier_window.seconds = 1

    class NullLimiter(limiter_pb2_grpc.LimiterServicer):
        async def Request(
            self, request: limiter_pb2.RateRequest, context: Any
        ) -> limiter_pb2.RateResponse:
            return granted

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(NullServicer(), server)  # type: ignore[no-untyped-call]
    limiter_pb2_grpc.add_LimiterServicer_to_server(NullLimiter(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0)


def ceiling_main(args: argparse.Namespace) -> int:
    """The ceiling on the loop ferryman runs on (--event-loop), which it names first."""

    async def serve() -> None:
        print(f"ceiling on {event_loop.name()}", flush=True)
        await serve_ceiling(args.port)

    with asyncio.Runner(loop_factory=event_loop.factory(args.event_loop)) as runner:
        runner.run(serve())
    return 0


# --------------------------------------------------------------------------- orchestration


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, loaded in this (single-threaded) process before any fork."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


def _child_setup(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """What a child runs before exec: get SIGTERM when we die, keep to ``cpus`` if given."""
    prctl = _prctl()
    if prctl is None and not cpus:
        return None

    def setup() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of ``pid`` from /proc (None where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Processes:
    """Every child process this script starts; close() ends them all, politely then not."""

    def __init__(self) -> None:
        self._children: list[subprocess.Popen[Any]] = []

    def start(
        self,
        argv: Sequence[str],
        *,
        stdout: IO[Any] | int | None,
        stderr: IO[Any] | int | None,
        stdin: IO[Any] | int | None = subprocess.DEVNULL,
        env: Mapping[str, str] | None = None,
        text: bool = False,
        cpus: frozenset[int] | None = None,
    ) -> subprocess.Popen[Any]:
        child = subprocess.Popen(
            list(argv),
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            env=env,
            text=text,
            start_new_session=True,  # Ctrl-C reaches only us; we end the children
            preexec_fn=_child_setup(cpus),
        )
        self._children.append(child)
        return child

    def stop(self, child: subprocess.Popen[Any], grace: float = 5.0) -> None:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if child in self._children:
            self._children.remove(child)

    def close(self) -> None:
        for child in list(self._children):
            with contextlib.suppress(Exception):
                self.stop(child)


def wait_ready(
    child: subprocess.Popen[bytes], ready: Callable[[], bool], what: str, log: Path | None
) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if child.poll() is not None:
            detail = log.read_text(errors="replace")[-2000:] if log else ""
            raise RuntimeError(f"{what} exited with code {child.returncode}\n{detail}")
        if ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {START_TIMEOUT:.0f} s")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            status: int = response.status
            return status == 200
    except (OSError, urllib.error.URLError):
        return False


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body.decode()


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    grpc_port: int
    log: Path
    debug_port: int | None = None
    loop: str = "?"  # the event loop it reported


def is_ceiling(name: str) -> bool:
    return name in ("ceiling", REFERENCE)


def cpu_split(pin: bool) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(server CPUs, client CPUs): the first CPU for the server, the others for the client."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None, None
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return None, None
    return frozenset(mine[:1]), frozenset(mine[1:])


def start_redis(procs: Processes, workdir: Path) -> str:
    """A throwaway redis-server on a free loopback port, without persistence; its URL."""
    return start_redis_process(procs, workdir)[0]


def start_redis_process(procs: Processes, workdir: Path) -> tuple[str, int]:
    """start_redis, with the server's process id."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("--backend redis needs redis-server on PATH (or pass a redis:// URL)")
    port = free_port()
    log = workdir / "redis.log"
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(workdir)]
    with log.open("w") as out:
        child = procs.start(argv, stdout=out, stderr=subprocess.STDOUT)
    wait_ready(child, lambda: port_open(port), "redis-server", log)
    return f"redis://127.0.0.1:{port}", child.pid


def backend_label(backend: str) -> str:
    """``memory``, ``redis``, or the scheme of a backend URL."""
    return backend.split("://", 1)[0] if "://" in backend else backend


def start_ferryman(
    procs: Processes,
    workdir: Path,
    backend: str,
    cpus: frozenset[int] | None,
    extra_env: Mapping[str, str] | None = None,
    *,
    burst: bool = False,
    workers: int = 1,
    one_user: bool = False,
) -> Server:
    config = workdir / f"config-{workers}"
    config.mkdir()
    # h2load sends one user's request over and over: its first tier then never runs out,
    # so that the run measures grants, as the varied users of the Python client do.
    tier1 = HUGE if one_user else 5
    (config / "bench.yaml").write_text(
        CONFIG_YAML + (BURST_YAML.replace("TIER1", str(tier1)) if burst else "")
    )
    grpc_port, http_port, debug_port = free_port(), free_port(), free_port()
    log = workdir / f"ferryman-{workers}.log"
    env = dict(os.environ)
    for name in ("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"):
        env.pop(name, None)
    env.update(HOST="127.0.0.1", GRPC_HOST="127.0.0.1", DEBUG_HOST="127.0.0.1", LOG_LEVEL="WARN")
    env.update(extra_env or {})
    argv = [sys.executable, "-m", "ferryman", "serve", "--config", str(config)]
    argv += ["--backend", backend, "--grpc-port", str(grpc_port)]
    argv += ["--http-port", str(http_port), "--debug-port", str(debug_port)]
    if workers > 1:
        argv += ["--workers", str(workers)]
    with log.open("w") as out:
        child = procs.start(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cpus=cpus)
    url = f"http://127.0.0.1:{http_port}/healthcheck"
    wait_ready(child, lambda: http_ok(url) and port_open(grpc_port), "ferryman", log)
    name = backend_label(backend) + (f" x{workers}" if workers > 1 else "")
    status = json.loads(http_text(f"http://127.0.0.1:{debug_port}/status"))
    return Server(name, child, grpc_port, log, debug_port, str(status.get("event_loop", "?")))


def start_ceiling(
    procs: Processes,
    workdir: Path,
    cpus: frozenset[int] | None,
    loop: str,
    name: str = "ceiling",
) -> Server:
    port = free_port()
    log = workdir / f"{name}.log"
    argv = [sys.executable, __file__, "--role", "ceiling", "--port", str(port)]
    argv += ["--event-loop", loop]
    with log.open("w") as out:
        child = procs.start(argv, stdout=out, stderr=subprocess.STDOUT, cpus=cpus)
    wait_ready(child, lambda: port_open(port) and "ceiling on" in log.read_text(), name, log)
    ran = re.search(r"ceiling on (\w+)", log.read_text())
    return Server(name, child, port, log, loop=ran.group(1) if ran else "?")


def run_client(
    procs: Processes,
    server: Server,
    scenario: str,
    descriptors: int,
    args: argparse.Namespace,
    rate: float | None = None,
) -> Result:
    """One run of the Python client: closed loop, or open loop at ``rate`` req/s."""
    argv = [sys.executable, __file__, "--role", "client", "--scenario", scenario]
    argv += ["--target", f"127.0.0.1:{server.grpc_port}", "--descriptors", str(descriptors)]
    argv += ["--concurrency", str(args.concurrency), "--channels", str(args.channels)]
    argv += ["--warmup", str(args.warmup), "--seconds", str(args.seconds)]
    argv += ["--seed", str(args.seed), "--server-pid", str(server.process.pid)]
    if rate is not None:
        argv += ["--rate", str(rate), "--seconds", str(args.rate_seconds)]
    _, client_cpus = cpu_split(args.pin)
    child = procs.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cpus=client_cpus)
    try:
        out, err = child.communicate(timeout=args.warmup + args.seconds + START_TIMEOUT)
    finally:
        procs.stop(child)
    if child.returncode != 0:
        raise RuntimeError(f"client failed ({child.returncode}):\n{err.decode(errors='replace')}")
    if server.process.poll() is not None:
        raise RuntimeError(f"{server.name} server exited with code {server.process.returncode}")
    return Result(
        target=server.name,
        scenario=scenario,
        descriptors=descriptors,
        concurrency=args.concurrency,
        channels=args.channels,
        seconds=args.seconds if rate is None else args.rate_seconds,
        rate=rate,
        **json.loads(out),
    )


# --------------------------------------------------------------------------- h2load


H2LOAD_DONE = re.compile(r"finished in ([\d.]+)(ms|s), ([\d.]+) req/s")
H2LOAD_COUNTS = re.compile(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded")
H2LOAD_TICK = 0.010  # seconds between the sends of a connection paced by h2load's --rps
PACER_RPS = 100  # req/s of each h2load process of a paced run: one request per tick
PACERS_MAX = 48


def grpc_frame(message: bytes) -> bytes:
    """One uncompressed gRPC message as sent on the wire: a flag byte, its length, the bytes."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def child_pids(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        return []
    return out


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of ``pid`` and of every process under it (the workers of ``--workers``)."""
    total = cpu_seconds(pid)
    if total is None:
        return None
    for child in child_pids(pid):
        total += tree_cpu_seconds(child) or 0.0
    return total


def tree_rss_mb(pid: int) -> float | None:
    total = rss_mb(pid)
    if total is None:
        return None
    for child in child_pids(pid):
        total += tree_rss_mb(child) or 0.0
    return total


def answer_ok(port: int, scenario: str, message: bytes) -> bool:
    """Sends ``message`` once with the Python client: is the answer OK (a grant for Request)?"""
    method = LIMITER_METHOD if scenario == "request" else METHOD
    parse: Callable[[bytes], Any] = (
        limiter_pb2.RateResponse.FromString
        if scenario == "request"
        else rls_pb2.RateLimitResponse.FromString
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            method, request_serializer=_identity, response_deserializer=parse
        )
        reply = call(message, timeout=10)
    return _granted(reply) if scenario == "request" else _rls_ok(reply)


def run_h2load(
    procs: Processes,
    workdir: Path,
    server: Server,
    scenario: str,
    descriptors: int,
    args: argparse.Namespace,
    redis_pid: int | None,
    rate: float | None = None,
) -> Result:
    """One h2load run (a warm-up first) of ``--requests`` requests, all the same message.
    CPU per request is read from /proc around it.

    With ``rate`` (req/s in all), the run is paced instead: h2load's ``--rps`` sends each
    connection's due requests together every 10 ms, whose bursts would queue at the server and
    be measured as its latency. So the rate is shared by several h2load processes of one
    connection each, about one request per tick each, started a fraction of the tick apart:
    requests then arrive about evenly."""
    method = LIMITER_METHOD if scenario == "request" else METHOD
    message = build_requests(scenario, descriptors, 1, args.seed)[0]
    body = workdir / f"{scenario}-{descriptors}.grpc"
    body.write_bytes(grpc_frame(message))
    ok = answer_ok(server.grpc_port, scenario, message)
    _, client_cpus = cpu_split(args.pin)
    url = f"http://127.0.0.1:{server.grpc_port}{method}"
    pacers = 1 if rate is None else min(PACERS_MAX, max(1, round(rate / PACER_RPS)))

    def h2load(requests: int, logs: Sequence[Path] = ()) -> list[str]:
        """Runs h2load (``pacers`` processes when paced) to the end; their outputs."""
        children = []
        for index in range(pacers):
            argv = ["h2load", "-t", "1", "-d", str(body)]
            argv += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
            if rate is None:
                argv += ["-c", str(args.clients), "-m", str(args.streams), "-n", str(requests)]
            else:
                share = rate / pacers
                argv += ["-c", "1", "-m", str(args.streams), f"--rps={max(1, round(share))}"]
                argv += ["-n", str(max(1, round(requests / pacers)))]
                time.sleep(H2LOAD_TICK / pacers)  # spreads the processes' ticks
            if logs:
                logs[index].unlink(missing_ok=True)  # h2load appends
                argv.append(f"--log-file={logs[index]}")
            children.append(
                procs.start(
                    [*argv, url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cpus=client_cpus
                )
            )
        texts = []
        for child in children:
            try:
                out, _ = child.communicate(timeout=START_TIMEOUT + requests / 100)
            finally:
                procs.stop(child)
            text: str = out.decode(errors="replace")
            if child.returncode != 0 or H2LOAD_DONE.search(text) is None:
                raise RuntimeError(f"h2load failed ({child.returncode}):\n{text[-2000:]}")
            texts.append(text)
        return texts

    requests = args.requests if rate is None else round(rate * args.rate_seconds)
    h2load(max(args.clients * args.streams, requests // 5))  # warm-up
    logs = [workdir / f"h2load-{index}.log" for index in range(pacers)]
    pid = server.process.pid
    cpu0, redis0 = tree_cpu_seconds(pid), None if redis_pid is None else cpu_seconds(redis_pid)
    client0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    texts = h2load(requests, logs)
    client1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu1, redis1 = tree_cpu_seconds(pid), None if redis_pid is None else cpu_seconds(redis_pid)
    elapsed, rps, total, finished, succeeded = 0.0, 0.0, 0, 0, 0
    for text in texts:
        done = H2LOAD_DONE.search(text)
        counts = H2LOAD_COUNTS.search(text)
        assert done is not None and counts is not None, text
        elapsed = max(elapsed, float(done[1]) / (1000 if done[2] == "ms" else 1))
        rps += float(done[3])
        total, finished, succeeded = (
            total + int(counts[1]),
            finished + int(counts[2]),
            succeeded + int(counts[3]),
        )
    latencies = sorted(
        int(line.split("\t")[2]) * 1000
        for log in logs
        for line in log.read_text().splitlines()
        if line
    )
    client = (client1.ru_utime + client1.ru_stime - client0.ru_utime - client0.ru_stime) / elapsed
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    redis = None if redis0 is None or redis1 is None else redis1 - redis0
    per = 1e6 / max(1, finished)
    return Result(
        target=server.name,
        scenario=scenario,
        descriptors=descriptors,
        concurrency=args.streams,
        channels=args.clients if rate is None else pacers,
        seconds=elapsed,
        requests=succeeded,
        errors=total - succeeded,
        not_ok=0 if ok else succeeded,
        rps=rps,
        p50_ms=percentile(latencies, 0.50),
        p90_ms=percentile(latencies, 0.90),
        p99_ms=percentile(latencies, 0.99),
        max_ms=latencies[-1] / 1e6 if latencies else float("nan"),
        server_cpu=None if cpu is None else cpu / elapsed,
        client_cpu=client,
        server_rss_mb=tree_rss_mb(pid),
        cpu_us=None if cpu is None else cpu * per,
        redis_us=None if redis is None else redis * per,
        load="h2load",
        rate=rate,
    )


def pick_median(runs: Sequence[Result]) -> Result:
    """The run with the median throughput, carrying every run's req/s."""
    ordered = sorted(runs, key=lambda r: r.rps)
    chosen = ordered[(len(ordered) - 1) // 2]
    chosen.rps_runs = [round(r.rps, 1) for r in runs]
    cpu = sorted(r.cpu_us for r in runs if r.cpu_us is not None)
    if cpu:  # CPU per request: its own median, not the one of the median throughput run
        chosen.cpu_us_runs = [round(c, 1) for c in cpu]
        chosen.cpu_us = cpu[(len(cpu) - 1) // 2]
    redis = sorted(r.redis_us for r in runs if r.redis_us is not None)
    if redis:
        chosen.redis_us_runs = [round(c, 1) for c in redis]
        chosen.redis_us = redis[(len(redis) - 1) // 2]
    return chosen


BAD_STATS = ("error", "degraded", "over_limit", "not_found", "overflow", "shadow_mode")
BAD_LOG = ("ERROR", "CRITICAL", "Traceback", "Exception", "error", "fail")


def ferryman_findings(server: Server) -> tuple[list[str], list[str]]:
    """(problems, notes): error-like log lines and nonzero error counters on /stats, and the
    other log lines besides the start-up and shut-down banners."""
    problems: list[str] = []
    notes: list[str] = []
    for line in server.log.read_text(errors="replace").splitlines():
        if not line.strip() or "ferryman serving" in line or "shutting down" in line:
            continue
        (problems if any(w in line for w in BAD_LOG) else notes).append(line)
    if server.debug_port is not None and server.process.poll() is None:
        try:
            stats = http_text(f"http://127.0.0.1:{server.debug_port}/stats")
        except OSError as exc:
            problems.append(f"/stats unreadable: {exc}")
        else:
            for line in stats.splitlines():
                name, _, value = line.partition(": ")
                if any(w in name for w in BAD_STATS) and value.strip() not in ("", "0"):
                    problems.append(f"stat {line}")
    return problems, notes


def server_cpus_for(workers: int, pin: bool) -> frozenset[int] | None:
    """Where a server runs with --pin: one process on the first CPU, N workers on the first N
    (all CPUs but the load generator's when there are that many)."""
    first, _ = cpu_split(pin)
    if first is None or workers == 1:
        return first
    mine = sorted(os.sched_getaffinity(0))
    return frozenset(mine[:workers]) if workers < len(mine) else None


def orchestrate(args: argparse.Namespace) -> int:
    counts = [int(n) for n in args.descriptors.split(",")]
    # (scenario, descriptors per request): fixed runs each --descriptors count, the others one.
    cases = [
        (scenario, n)
        for scenario in args.scenario
        for n in (counts if scenario == "fixed" else [1])
    ]
    use_h2load = args.load == "h2load" or (args.load == "auto" and shutil.which("h2load"))
    procs = Processes()
    results: list[Result] = []
    problems: list[str] = []
    notes: list[str] = []
    redis_pid: int | None = None
    loops: dict[str, str] = {}  # server name -> the event loop it ran on

    def progress(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    runs: dict[tuple[str, str, int], list[Result]] = {}
    half_runs: dict[tuple[str, str, int], list[Result]] = {}
    with tempfile.TemporaryDirectory(prefix="ferryman-bench-") as tmp:
        workdir = Path(tmp)

        def run(server: Server, scenario: str, n: int, rate: float | None = None) -> Result:
            if use_h2load:
                redis = None if is_ceiling(server.name) else redis_pid
                return run_h2load(procs, workdir, server, scenario, n, args, redis, rate)
            return run_client(procs, server, scenario, n, args, rate)

        try:
            servers: list[Server] = []
            if not args.no_ferryman:
                backend = args.backend
                if backend == "redis":
                    backend, redis_pid = start_redis_process(procs, workdir)
                burst = any(scenario != "fixed" for scenario in args.scenario)
                for workers in args.workers:
                    servers.append(
                        start_ferryman(
                            procs,
                            workdir,
                            backend,
                            server_cpus_for(workers, args.pin),
                            args.env,
                            burst=burst,
                            workers=workers,
                            one_user=bool(use_h2load),
                        )
                    )
            if not args.no_ceiling:
                cpus = server_cpus_for(1, args.pin)
                servers.append(start_ceiling(procs, workdir, cpus, args.event_loop))
                if args.reference_ceiling and args.event_loop != "asyncio":
                    servers.append(start_ceiling(procs, workdir, cpus, "asyncio", REFERENCE))
            loops.update((server.name, server.loop) for server in servers)
            # Interleaved, so that a slow spell of the machine hits both sides alike.
            for round_ in range(args.repeat):
                for scenario, n in cases:
                    for server in servers:
                        progress(
                            f"[{round_ + 1}/{args.repeat}] {server.name}, "
                            f"{case_label(scenario, n)}, "
                            + (
                                f"h2load {args.clients}x{args.streams}, {args.requests} requests"
                                if use_h2load
                                else f"c={args.concurrency}, {args.warmup:g}+{args.seconds:g} s"
                            )
                        )
                        result = run(server, scenario, n)
                        runs.setdefault((server.name, scenario, n), []).append(result)
            if args.half_rate and not args.no_ceiling:
                ceilings = {
                    key[1:]: pick_median(group)
                    for key, group in runs.items()
                    if key[0] == "ceiling"
                }
                for round_ in range(args.repeat):
                    for (scenario, n), ceiling in ceilings.items():
                        rate = args.paced_rate or ceiling.rps / 2
                        for server in servers:
                            progress(
                                f"[{round_ + 1}/{args.repeat}] {server.name}, "
                                f"{case_label(scenario, n)} at {rate:.0f} req/s"
                            )
                            result = run(server, scenario, n, rate)
                            half_runs.setdefault((server.name, scenario, n), []).append(result)
            for server in servers:
                if not is_ceiling(server.name):
                    found, noted = ferryman_findings(server)
                    problems += found
                    notes += noted
        finally:
            procs.close()  # before the temporary directory goes
    results = [pick_median(group) for group in runs.values()]
    half = [pick_p99_median(group) for group in half_runs.values()]

    def order(r: Result) -> tuple[bool, str, int, int]:
        return (is_ceiling(r.target), r.target, SCENARIOS.index(r.scenario), r.descriptors)

    results.sort(key=order)
    half.sort(key=order)
    ceiling_of = {(r.scenario, r.descriptors): r for r in results if r.target == "ceiling"}
    for r in results:
        top = ceiling_of.get((r.scenario, r.descriptors))
        if r.target != "ceiling" and top is not None and top.rps:
            r.ratio_to_ceiling = r.rps / top.rps
            if r.cpu_us is not None and top.cpu_us is not None:
                r.own_us = r.cpu_us - top.cpu_us
    checks = target_checks(results, half, args)

    if args.json:
        report = {
            "python": platform.python_version(),
            "grpcio": _grpc_version(),
            "cpus": os.cpu_count(),
            "argv": sys.argv,
            "event_loops": loops,
            "results": [asdict(r) for r in results],
            "half_rate": [asdict(r) for r in half],
            "targets": checks,
            "ferryman_problems": problems,
            "ferryman_notes": notes,
        }
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("event loops: " + ", ".join(f"{name} on {loop}" for name, loop in loops.items()))
        for r in results:
            print(r.line())
            for sample in r.error_samples:
                print(f"    error: {sample}")
        if half:
            rate = f"{args.paced_rate:g}" if args.paced_rate else "half the ceiling's"
            print(f"at {rate} req/s:")
            for r in half:
                print(f"  {r.line()}")
        if checks:
            print("targets:")
            for check in checks:
                print(f"  {check}")
        for line in notes:
            print(f"ferryman log: {line}")
        for line in problems:
            print(f"ferryman PROBLEM: {line}")
    failed = any(r.errors or r.not_ok for r in results + half) or bool(problems)
    return 1 if failed else 0


def pick_p99_median(runs: Sequence[Result]) -> Result:
    """The run with the median p99 latency, carrying every run's req/s."""
    ordered = sorted(runs, key=lambda r: r.p99_ms)
    chosen = ordered[(len(ordered) - 1) // 2]
    chosen.rps_runs = [round(r.rps, 1) for r in runs]
    return chosen


def target_checks(
    results: Sequence[Result], half: Sequence[Result], args: argparse.Namespace
) -> list[str]:
    """The performance targets, each with its figure and whether it is met."""
    out: list[str] = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    synced = synced_interval(args.env) > 0
    for r in results:
        if is_ceiling(r.target) or r.ratio_to_ceiling is None:
            continue
        floor, what = share_target(r, synced)
        ok = r.ratio_to_ceiling >= floor
        out.append(
            f"{r.target}{what} {r.label}: {r.ratio_to_ceiling:.0%} of ceiling "
            f"(>= {floor:.0%}): {verdict(ok)}"
        )
    tops = {(r.scenario, r.descriptors): r for r in half if r.target == "ceiling"}
    for r in half:
        top = tops.get((r.scenario, r.descriptors))
        if is_ceiling(r.target) or top is None:
            continue
        gap = r.p99_ms - top.p99_ms
        out.append(
            f"{r.target} {r.label} at {top.rate or 0:.0f} req/s: p50 {r.p50_ms:.2f} ms vs "
            f"{top.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms vs ceiling {top.p99_ms:.2f} ms "
            f"({gap:+.2f} ms, within {P99_GAP_MS:g} ms): {verdict(gap <= P99_GAP_MS)}"
        )
    workers = {r.target: r for r in results if r.scenario == "fixed" and r.descriptors == 1}
    one = workers.get(backend_label(args.backend))
    for name, r in workers.items():
        if one is not None and name.startswith(one.target + " x") and one.rps:
            text = f"{name} vs 1 worker: {r.rps / one.rps:.2f}x req/s"
            if r.cpu_us is not None and one.cpu_us is not None:
                more = r.cpu_us / one.cpu_us - 1
                text += (
                    f", cpu/req {r.cpu_us:.0f} vs {one.cpu_us:.0f} us ({more:+.0%}, within "
                    f"{WORKER_CPU_MARGIN:.0%}): {verdict(more <= WORKER_CPU_MARGIN)}"
                )
            out.append(text)
    return out


def synced_interval(env: Mapping[str, str]) -> float:
    """REDIS_SYNC_INTERVAL among the ``--env`` settings, in seconds (0: exact)."""
    from ferryman.durations import parse_duration

    return parse_duration(env.get("REDIS_SYNC_INTERVAL") or "0")


def share_target(r: Result, synced: bool) -> tuple[float, str]:
    """The least share of the ceiling a case must reach, and the mode it is named by."""
    redis = r.target.startswith(("redis", "rediss"))
    one = r.descriptors == 1
    if r.scenario != "fixed":
        return SHARE_TARGETS["other"], ""
    if not redis:
        return SHARE_TARGETS["memory"][0 if one else 1], ""
    if synced:
        return SHARE_TARGETS["synced"][0 if one else 1], " (synced)"
    return SHARE_TARGETS["redis"][0 if one else 1], " (exact)"


def _grpc_version() -> str:
    return str(grpc.__version__)


# --------------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark ferryman's ShouldRateLimit against a do-nothing gRPC ceiling.",
        epilog="Exit status 1 when a call failed, an answer was not OK, or ferryman logged or "
        "counted an error; 130 when interrupted.",
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per scenario (default 5)"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="unmeasured seconds first (default 1)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=32, help="concurrent workers (default 32)"
    )
    parser.add_argument(
        "--channels", type=int, default=1, help="gRPC channels shared by the workers (default 1)"
    )
    parser.add_argument(
        "--backend",
        default="memory",
        help="ferryman backend: memory (default); redis, to start a throwaway redis-server "
        "on a free loopback port; or a URL passed to ferryman as is (redis://host:port)",
    )
    parser.add_argument(
        "--descriptors",
        default="1,3",
        help="comma-separated descriptors per request, one run each, for the fixed scenario "
        "(default 1,3)",
    )
    parser.add_argument(
        "--scenario",
        default="fixed",
        help="comma-separated: fixed (ShouldRateLimit on fixed-window rules, default), burst "
        "(ShouldRateLimit on a 3-tier burst node, users among 10k), request "
        "(ferryman.v1.Limiter/Request, copies=1, on the same node)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each scenario, interleaved; the median is reported (default 1)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin the server to the first CPU and the client to the others (Linux)",
    )
    parser.add_argument(
        "--load",
        choices=["auto", "h2load", "python"],
        default="auto",
        help="load generator: h2load (every request the same message, --clients x --streams, "
        "--requests per run), python (grpc.aio, --concurrency/--channels, varied values for "
        "--seconds), auto: h2load when on PATH (default)",
    )
    parser.add_argument("--clients", type=int, default=8, help="h2load connections (default 8)")
    parser.add_argument(
        "--streams", type=int, default=16, help="h2load streams per connection (default 16)"
    )
    parser.add_argument(
        "--requests", type=int, default=20_000, help="h2load requests per run (default 20000)"
    )
    parser.add_argument(
        "--half-rate",
        action="store_true",
        help="then run each case paced at half the ceiling's req/s and compare p50/p99",
    )
    parser.add_argument(
        "--rate-seconds", type=float, default=4.0, help="length of a --half-rate run (default 4)"
    )
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=0.0,
        help="with --half-rate: pace every case at this req/s instead of half the ceiling's",
    )
    parser.add_argument(
        "--workers",
        default="1",
        help="comma-separated worker counts, one ferryman each (serve --workers N; more than "
        "one needs a shared backend such as redis), e.g. 1,2 (default 1)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the request values")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="only ferryman's own CPU per request: the servicer called in a loop, no gRPC",
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the ceiling runs")
    parser.add_argument("--no-ferryman", action="store_true", help="run only the ceiling")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the ferryman process, e.g. USE_PROMETHEUS=true "
        "(repeatable)",
    )
    parser.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="the event loop of ferryman (EVENT_LOOP) and of the ceiling; auto: uvloop when "
        "installed (default)",
    )
    parser.add_argument(
        "--reference-ceiling",
        action="store_true",
        help=f"also run the ceiling on asyncio's own loop ({REFERENCE}), for reference",
    )
    parser.add_argument(
        "--role", choices=["orchestrator", "client", "ceiling"], help=argparse.SUPPRESS
    )
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--same", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "client":
        args.descriptors = int(args.descriptors)
        if args.scenario not in SCENARIOS:
            parser.error(f"--scenario {args.scenario!r}: the client runs one of {SCENARIOS}")
    else:
        scenarios = [s.strip() for s in args.scenario.split(",") if s.strip()]
        unknown = [s for s in scenarios if s not in SCENARIOS]
        if not scenarios or unknown:
            parser.error(f"--scenario takes comma-separated names among {', '.join(SCENARIOS)}")
        args.scenario = list(dict.fromkeys(scenarios))
    if args.seconds <= 0 or args.seconds > 600 or args.warmup < 0 or args.warmup > 60:
        parser.error("--seconds must be in (0, 600] and --warmup in [0, 60]")
    if min(args.concurrency, args.channels, args.repeat, args.clients, args.streams) < 1:
        parser.error(
            "--concurrency, --channels, --clients, --streams and --repeat must be at least 1"
        )
    if args.requests < 1 or args.rate_seconds <= 0:
        parser.error("--requests must be at least 1 and --rate-seconds above 0")
    if args.load == "h2load" and shutil.which("h2load") is None:
        parser.error("--load h2load: h2load is not on PATH (nghttp2's client tools)")
    try:
        args.workers = [int(n) for n in str(args.workers).split(",")]
    except ValueError:
        parser.error("--workers takes comma-separated whole numbers, e.g. 1,2")
    if not args.workers or min(args.workers) < 1:
        parser.error("--workers must name at least one count, each at least 1")
    if args.no_ferryman and args.no_ceiling:
        parser.error("--no-ferryman and --no-ceiling leave nothing to run")
    extra_env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env {item!r}: use NAME=VALUE")
        extra_env[name] = value
    args.env = extra_env
    if args.role in (None, "orchestrator"):
        # One loop for ferryman and the ceiling, named (auto resolved) for both.
        if "EVENT_LOOP" in extra_env:
            parser.error("--env EVENT_LOOP: use --event-loop, which the ceiling follows too")
        try:
            args.event_loop = "asyncio" if event_loop.factory(args.event_loop) is None else "uvloop"
        except SettingsError as exc:
            parser.error(str(exc))
        extra_env["EVENT_LOOP"] = args.event_loop
    if args.role != "client":
        try:
            counts = [int(n) for n in args.descriptors.split(",")]
        except ValueError:
            parser.error("--descriptors takes comma-separated whole numbers, e.g. 1,3")
        if not counts or min(counts) < 1:
            parser.error("--descriptors must name at least one count, each at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "client":
        return client_main(args)
    if args.role == "ceiling":
        return ceiling_main(args)
    if args.in_process:
        counts = [int(n) for n in args.descriptors.split(",")]
        print("\n".join(asyncio.run(in_process(counts, args.seed))))
        return 0
    # SIGTERM unwinds like Ctrl-C, so the finally blocks end the children.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return orchestrate(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
