"""Memory per tenant of burst-tier state, on Redis and in the memory backend.

Usage::

    python tests/bench/bench_burst_memory.py [--tenants 1000,10000] [--seconds 5] [--rate 3]
                                             [--backend memory,redis] [--json]

For each backend and tenant count, N tenants send a steady load to one 3-tier burst node
(the node of ``bench_rls.py --scenario burst``: 5/1s active 1h; 50/1s active 5s cooldown 15s;
500/1s active 1s cooldown 60s; no hard or global limit): every simulated second each tenant
asks ``--rate`` times (in a shuffled order, so that the requests are spread over the second),
for ``--seconds`` simulated seconds. Then the state left behind is measured:

- Redis: the script's CPU per decision (``INFO commandstats``, EVALSHA's usec_per_call);
  ``INFO memory`` used_memory after minus before, divided by N; the ``MEMORY USAGE``
  (all elements sampled) of one tenant's keys, of all the tenant keys divided by N, and of
  the node-wide keys (the all-tenants last-second log, which holds one entry per grant);
- memory backend: tracemalloc's traced memory after minus before, divided by N, split into
  the tenant states and the expiry heap; and a sys.getsizeof-based deep size of one tenant.

How the load is driven: in process, through ferryman's own engine
(``RateLimitEngine.request``, what ``ferryman.v1.Limiter/Request`` calls) over a
``RedisBackend(server_time=False)`` or a ``MemoryBackend``, with a fake clock that advances
by 1/(N*rate) s at each request. So keys, node and tenant names are exactly the server's,
time runs as fast as the machine can go (10k tenants at 3/s for 5 s is 150k decisions, which
a gRPC server on a small machine could not take in 5 real seconds), and the measure is of
the state, not of a server process. The Redis backend uses one pipelined connection, so the
scripts run in the order the requests were made and time never goes backwards in Redis.

The script starts its own redis-server (no persistence) on a free loopback port and stops it
at the end, also on Ctrl-C or SIGTERM; a run of the defaults takes well under a minute, and
``--timeout`` (default 600 s) bounds it.
This is a benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import random
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import RedisBackend, RedisTarget
from ferryman.config.loader import load_sources
from ferryman.config.model import Config
from ferryman.core.algorithm import Granted
from ferryman.engine import RateLimitEngine
from ferryman.stats import Stats

from helpers.redis_procs import RedisProcess

DOMAIN = "bench"
KEY = "burst_user"
CONFIG_YAML = f"""\
domain: {DOMAIN}
descriptors:
  - key: {KEY}
    burst_tiers:
      - {{limit: 5, window: 1s, active: 1h, cooldown: 0}}
      - {{limit: 50, window: 1s, active: 5s, cooldown: 15s}}
      - {{limit: 500, window: 1s, active: 1s, cooldown: 60s}}
"""
START = 1_700_000_000.0  # the fake clock's epoch
BATCH = 512  # requests in flight at once on Redis
START_TIMEOUT = 30.0


class TickClock:
    """A fake clock that moves forward by ``step`` every time it is read.

    The engine reads its clock once per request, so consecutive requests get increasing
    times spread evenly over each simulated second.
    """

    def __init__(self, start: float, step: float) -> None:
        self._next = start
        self.step = step

    def now(self) -> float:
        value = self._next
        self._next += self.step
        return value

    def peek(self) -> float:
        return self._next


@dataclass
class Source:
    config: Config | None


@dataclass
class Report:
    backend: str
    tenants: int
    rate: float
    seconds: float
    requests: int
    granted: int
    wall_seconds: float
    bytes_per_tenant: float  # the headline figure: whole-store growth / tenants
    details: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [
            f"{self.backend:<7}{self.tenants:>6} tenants x {self.rate:g}/s x {self.seconds:g} s: "
            f"{self.requests} requests, {self.granted} granted, {self.wall_seconds:.1f} s wall; "
            f"{self.bytes_per_tenant:,.0f} B/tenant"
        ]
        for name, value in self.details.items():
            if isinstance(value, float):
                value = f"{value:,.1f}"
            elif isinstance(value, int):
                value = f"{value:,}"
            out.append(f"    {name}: {value}")
        return out


async def request_rate(engine: RateLimitEngine, entries: tuple[tuple[str, str], ...]) -> Granted:
    """One ferryman.v1 Request of one hit on the burst-tier node, as the server makes it."""
    return await engine.request(DOMAIN, entries, 1, 1, 0)


def engine_for(backend: Any, clock: TickClock) -> RateLimitEngine:
    config = load_sources([("bench.yaml", CONFIG_YAML)])
    return RateLimitEngine(Source(config), backend, clock, Stats())


def schedule(tenants: int, rate: int, seconds: float, seed: int) -> Iterator[list[int]]:
    """Rounds of tenant indexes: each round asks once per tenant, in a shuffled order."""
    rng = random.Random(seed)
    order = list(range(tenants))
    for _ in range(math.ceil(seconds * rate)):
        rng.shuffle(order)
        yield order


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.seconds = seconds

    def check(self) -> None:
        if time.monotonic() > self.at:
            raise TimeoutError(f"gave up after --timeout {self.seconds:g} s")


async def drive(
    engine: RateLimitEngine,
    tenants: int,
    rate: int,
    seconds: float,
    seed: int,
    batch: int,
    deadline: Deadline,
) -> tuple[int, int]:
    """Send the load; return (requests, granted)."""
    entries_key = KEY
    requests = granted = 0
    for order in schedule(tenants, rate, seconds, seed):
        deadline.check()
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            # A fresh value string per request, as a decoded gRPC request would carry.
            calls = [request_rate(engine, ((entries_key, f"u{i}"),)) for i in chunk]
            if batch == 1:
                outcomes = [await calls[0]]
            else:
                outcomes = await asyncio.gather(*calls)
            requests += len(outcomes)
            granted += sum(outcome.granted for outcome in outcomes)
    return requests, granted


# --------------------------------------------------------------------------- memory backend


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    """sys.getsizeof over an object graph (containers, __dict__, __slots__), each once."""
    if seen is None:
        seen = set()
    if obj is None or isinstance(obj, bool) or id(obj) in seen:
        return 0
    if isinstance(obj, int) and -5 <= obj <= 256:
        return 0  # cached small ints
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | deque | set | frozenset):
        size += sum(deep_size(x, seen) for x in obj)
    if hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot != "__weakref__" and hasattr(obj, slot):
                size += deep_size(getattr(obj, slot), seen)
    return size


def run_memory(tenants: int, rate: int, seconds: float, seed: int, deadline: Deadline) -> Report:
    clock = TickClock(START, 1.0 / (tenants * rate))
    backend = MemoryBackend()
    engine = engine_for(backend, clock)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        began = time.perf_counter()
        requests, granted = asyncio.run(drive(engine, tenants, rate, seconds, seed, 1, deadline))
        wall = time.perf_counter() - began
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        # The expiry heap (private; read here only to measure it) gets one entry per grant.
        heap = backend.store("burst_tiers")._heap
        heap_entries = len(heap)
        heap.clear()
        gc.collect()
        without_heap = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    nodes = backend.store("burst_tiers")._nodes
    glob, states = next(iter(nodes.values()))
    sample_key = next(iter(states))
    one = deep_size((sample_key, states[sample_key]))
    total = after - before
    heap_bytes = after - without_heap
    return Report(
        backend="memory",
        tenants=tenants,
        rate=rate,
        seconds=seconds,
        requests=requests,
        granted=granted,
        wall_seconds=wall,
        bytes_per_tenant=total / tenants,
        details={
            "tenant states held": backend.store("burst_tiers").tenants,
            "traced bytes after - before (tracemalloc)": total,
            "  of which tenant states, per tenant": (without_heap - before) / tenants,
            "  of which expiry heap": heap_bytes,
            "expiry heap entries (one per grant)": heap_entries,
            "expiry heap bytes per entry": heap_bytes / heap_entries if heap_entries else 0.0,
            "node-wide last-second log entries": len(glob),
            f"deep getsizeof of one tenant ({sample_key!r} and its state)": one,
            "hit logs per tenant (one per tier, one for the last second)": 1
            + len(states[sample_key][0].logs),
        },
    )


# --------------------------------------------------------------------------- Redis


@contextlib.contextmanager
def redis_server() -> Iterator[int]:
    """A throwaway redis-server on a free loopback port, without persistence; its port."""
    with tempfile.TemporaryDirectory(prefix="ferryman-burst-mem-") as tmp:
        server = RedisProcess(Path(tmp)).start()
        try:
            yield server.port
        finally:
            server.stop()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def used_memory(client: redis.Redis) -> dict[str, int]:
    info = client.info("memory")
    return {k: int(info[k]) for k in ("used_memory", "used_memory_dataset")}


def memory_usage(client: redis.Redis, keys: Sequence[bytes]) -> list[int]:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    return [int(v or 0) for v in pipe.execute()]


async def redis_load(
    port: int, tenants: int, rate: int, seconds: float, seed: int, deadline: Deadline
) -> tuple[int, int, float, dict[str, int], dict[str, int]]:
    sync = redis.Redis(host="127.0.0.1", port=port)
    # One pipelined connection: the scripts run in request order, so time only moves on.
    target = RedisTarget(addresses=(("127.0.0.1", port),), pool_size=1, timeout=10.0)
    backend = RedisBackend(target, server_time=False)
    await backend.start()
    try:
        # Warm up (script cache, connection), then start from an empty keyspace.
        warm = engine_for(backend, TickClock(START - 100, 0.001))
        await request_rate(warm, ((KEY, "warmup"),))
        sync.flushall()
        await asyncio.sleep(0.2)
        before = used_memory(sync)
        clock = TickClock(START, 1.0 / (tenants * rate))
        engine = engine_for(backend, clock)
        began = time.perf_counter()
        requests, granted = await drive(engine, tenants, rate, seconds, seed, BATCH, deadline)
        wall = time.perf_counter() - began
        # Measured at once: the node-wide log expires 2 real seconds after the last write.
        after = used_memory(sync)
    finally:
        await backend.close()
        sync.close()
    return requests, granted, wall, before, after


def run_redis(
    port: int, tenants: int, rate: int, seconds: float, seed: int, deadline: Deadline
) -> Report:
    sync = redis.Redis(host="127.0.0.1", port=port)
    try:
        sync.flushall()
        sync.config_resetstat()
        requests, granted, wall, before, after = asyncio.run(
            redis_load(port, tenants, rate, seconds, seed, deadline)
        )
        script = sync.info("commandstats").get("cmdstat_evalsha", {})
        keys = sorted(sync.scan_iter(count=1000))
        sizes = dict(zip(keys, memory_usage(sync, keys), strict=True))
        node_keys = {k: v for k, v in sizes.items() if k.endswith((b"}:g", b"}:gt"))}
        tenant_total = sum(sizes.values()) - sum(node_keys.values())
        # One tenant's keys: {node}:s:<tenant> (hash), :q:<tenant> (last second),
        # :l:<tenant>:<tier> (a tier's window), the tiers that are or were active only.
        sample = "u0"
        own = {k.decode(): v for k, v in sizes.items() if k.split(b":")[2:3] == [sample.encode()]}
        ttls = {k: int(sync.pttl(k)) for k in own}
        hash_key = next((k for k in own if ":s:" in k), None)
        hash_fields = sync.hgetall(hash_key) if hash_key else {}
        glob_len = sum(int(sync.llen(k)) for k in node_keys if k.endswith(b"}:g"))
    finally:
        sync.close()
    growth = after["used_memory"] - before["used_memory"]
    details: dict[str, Any] = {
        "used_memory before -> after": f"{before['used_memory']:,} -> {after['used_memory']:,}",
        "used_memory_dataset after - before, per tenant": (
            after["used_memory_dataset"] - before["used_memory_dataset"]
        )
        / tenants,
        "Redis CPU per decision, us (EVALSHA usec_per_call)": float(
            script.get("usec_per_call", 0.0)
        ),
        "keys": len(sizes),
        "keys per tenant": (len(sizes) - len(node_keys)) / tenants,
        "MEMORY USAGE of all tenant keys / tenants": tenant_total / tenants,
        "MEMORY USAGE of the node-wide keys (g: last-second log, gt: its total)": sum(
            node_keys.values()
        ),
        "  per tenant": sum(node_keys.values()) / tenants,
        "  node-wide last-second log entries": glob_len,
        f"MEMORY USAGE of tenant {sample!r} (sum)": sum(own.values()),
    }
    for key, size in sorted(own.items()):
        details[f"  {key}"] = f"{size} B, ttl {ttls[key] / 1000:.0f} s"
    if hash_fields:
        shown = " ".join(f"{_text(k)}={_text(v)}" for k, v in sorted(hash_fields.items()))
        details["  state hash fields"] = shown
    return Report(
        backend="redis",
        tenants=tenants,
        rate=rate,
        seconds=seconds,
        requests=requests,
        granted=granted,
        wall_seconds=wall,
        bytes_per_tenant=growth / tenants,
        details=details,
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Memory per tenant of burst-tier state on Redis and in memory."
    )
    parser.add_argument(
        "--tenants", default="1000,10000", help="comma-separated tenant counts (1000,10000)"
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="simulated seconds of load (default 5)"
    )
    parser.add_argument(
        "--rate", type=int, default=3, help="requests per tenant per simulated second (3)"
    )
    parser.add_argument(
        "--backend", default="memory,redis", help="comma-separated: memory, redis (both)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="give up after this many seconds (600)"
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    args = parser.parse_args(argv)
    try:
        args.tenants = [int(n) for n in args.tenants.split(",")]
    except ValueError:
        parser.error("--tenants takes comma-separated whole numbers")
    args.backend = [b.strip() for b in args.backend.split(",") if b.strip()]
    if not args.backend or set(args.backend) - {"memory", "redis"}:
        parser.error("--backend takes memory, redis or both")
    if min(args.tenants) < 1 or args.rate < 1 or not 0 < args.seconds <= 3600:
        parser.error("--tenants and --rate must be at least 1, --seconds in (0, 3600]")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    deadline = Deadline(args.timeout)
    reports: list[Report] = []

    def show(report: Report) -> None:
        reports.append(report)
        if not args.json:
            print("\n".join(report.lines()), flush=True)

    try:
        if "memory" in args.backend:
            for n in args.tenants:
                show(run_memory(n, args.rate, args.seconds, args.seed, deadline))
        if "redis" in args.backend:
            with redis_server() as port:
                for n in args.tenants:
                    show(run_redis(port, n, args.rate, args.seconds, args.seed, deadline))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if args.json:
        json.dump([asdict(r) for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
