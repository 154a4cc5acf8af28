"""CPU per decision and round trips per decision of each window kind on Redis, in one run:
the reference's fixed window (a minute), a 30 s window, a calendar month, two limits on one
node (``rate_limits``), a sliding window, and every other registered kind given in KINDS
whose YAML loads (GCRA when it is registered).

Usage::

    python tests/bench/bench_kinds.py [--decisions N] [--tenants N] [--concurrency C] [--json]

The engine runs in this process against a throwaway redis-server (no gRPC: the figures are
the engine's and the store's own). For each kind it prints ferryman's CPU per decision
(this process, from /proc), redis-server's CPU per decision (``INFO cpu``) and the commands
Redis was sent per decision (``INFO commandstats``' script calls; every kind decides in
one script): 1.00 is one round trip per decision.

This is a benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import redis

from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import SystemClock
from ferryman.config import Config, load_sources
from ferryman.core.answers import DescriptorRequest
from ferryman.engine import RateLimitEngine
from ferryman.errors import ConfigError
from ferryman.stats import Stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers
from bench_rls import Processes, cpu_seconds, start_redis_process

#: (name, the node's YAML under ``- key: k``)
KINDS = (
    ("fixed window, 1 minute", "rate_limit: {unit: minute, requests_per_unit: 1000000}"),
    ("fixed window, 30 s", "rate_limit: {window: 30s, requests_per_unit: 1000000}"),
    (
        "calendar month",
        "rate_limit: {calendar: {unit: month, time_zone: Europe/Berlin},"
        " requests_per_unit: 1000000}",
    ),
    (
        "two limits (rate_limits)",
        "rate_limits: [{unit: second, requests_per_unit: 1000000},"
        " {unit: day, requests_per_unit: 1000000}]",
    ),
    ("sliding window, 1 minute", "sliding_window: {unit: minute, requests_per_unit: 1000000}"),
    ("gcra", "gcra: {rate: 1000000, per: 1s, burst: 1000}"),
    ("token bucket", "token_bucket: {size: 1000000, fill_rate: 1000000}"),
)


class Source:
    def __init__(self, config: Config) -> None:
        self.config = config


def counters(client: redis.Redis) -> tuple[float, int]:
    """redis-server's CPU seconds and the scripts it has been sent (every kind decides in
    one script: a decision that costs one call costs one round trip)."""
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    scripts = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k in scripts)
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls


async def run_kind(
    url: str, yaml: str, decisions: int, tenants: int, concurrency: int
) -> dict[str, float]:
    config = load_sources([("k.yaml", f"domain: k\ndescriptors:\n  - key: k\n    {yaml}\n")])
    backend = RedisBackend(parse_backend_url(url, pool_size=4, timeout=5.0))
    await backend.start()
    engine = RateLimitEngine(Source(config), backend, SystemClock(), Stats())
    client = redis.Redis.from_url(url)
    requests = [[DescriptorRequest((("k", f"t{i}"),))] for i in range(tenants)]

    async def worker(start: int) -> None:
        for n in range(start, decisions, concurrency):
            await engine.should_rate_limit("k", requests[n % tenants], 1)

    try:
        await asyncio.gather(*(worker(i) for i in range(min(concurrency, 50))))  # warm up
        redis_cpu, commands = counters(client)
        mine = cpu_seconds(os.getpid()) or time.process_time()
        began = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - began
        mine = (cpu_seconds(os.getpid()) or time.process_time()) - mine
        redis_after, commands_after = counters(client)
    finally:
        client.close()
        await backend.close()
    return {
        "decisions_per_s": decisions / elapsed,
        "ferryman_cpu_us": mine / decisions * 1e6,
        "redis_cpu_us": (redis_after - redis_cpu) / decisions * 1e6,
        "calls_per_decision": (commands_after - commands) / decisions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    procs = Processes()
    rows: dict[str, dict[str, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as workdir:
            url, _ = start_redis_process(procs, Path(workdir))
            for name, yaml in KINDS:
                try:
                    rows[name] = asyncio.run(
                        run_kind(url, yaml, args.decisions, args.tenants, args.concurrency)
                    )
                except ConfigError as exc:
                    print(f"{name}: skipped ({exc.problems[0].message})", file=sys.stderr)
    finally:
        procs.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'kind':<28}{'decisions/s':>12}{'ferryman us':>13}{'redis us':>10}{'calls':>7}")
    for name, row in rows.items():
        print(
            f"{name:<28}{row['decisions_per_s']:>12.0f}{row['ferryman_cpu_us']:>13.1f}"
            f"{row['redis_cpu_us']:>10.1f}{row['calls_per_decision']:>7.2f}"
        )


if __name__ == "__main__":
    main()
