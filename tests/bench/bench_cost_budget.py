"""Cost budgets: decisions per second, the script's CPU and the state left per tenant.

Usage::

    python tests/bench/bench_cost_budget.py [--tenants 1000] [--requests 20000]
                                            [--backend memory,redis] [--max-keys N] [--json]

Through ferryman's own engine (``RateLimitEngine.should_rate_limit``), over a
``MemoryBackend`` or a ``RedisBackend(server_time=False)`` on a throwaway redis-server:
``--requests`` requests spread over ``--tenants`` users, each an estimate (two budgets: the
user's and its organisation's, reserved all or none) followed by its settlement, one
request in ten never settled (its reservation expires into a charge). Time is a fake clock
advancing 10 ms a request, so expiries happen as they would. Printed: decisions (calls) per
second, Redis's EVALSHA usec_per_call, and ``MEMORY USAGE`` of one tenant's four keys.
``--max-keys`` caps the memory backend's state (MEMORY_MAX_KEYS; 0, the default here: no
cap), to measure what making room costs when the budgets pass it.

This is a benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from ferryman.backends.base import Backend
from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.core.answers import DescriptorRequest
from ferryman.engine import RateLimitEngine
from ferryman.stats import Stats

from helpers.redis_procs import RedisProcess

CONFIG = """
domain: llm
descriptors:
  - key: user
    cost_budget: {budget: 100000, window: 1h, max_debt: 20000, reservation_ttl: 30s}
  - key: org
    cost_budget: {budget: 5000000, window: 1h, reservation_ttl: 30s}
"""


class _Source:
    config = load_sources([("llm.yaml", CONFIG)])


def _request(user: int, rid: str, hits: int, settle: bool) -> list[DescriptorRequest]:
    tail = (("settle", "1"),) if settle else ()
    return [
        DescriptorRequest((("user", f"u{user}"), ("request_id", rid), *tail), hits=hits),
        DescriptorRequest((("org", f"o{user % 10}"), ("request_id", rid), *tail), hits=hits),
    ]


async def run(backend: Backend, tenants: int, requests: int) -> dict[str, Any]:
    clock = ManualClock(1_700_006_400.0)
    engine = RateLimitEngine(_Source(), backend, clock, Stats())
    rng = random.Random(7)
    calls = 0
    started = time.perf_counter()
    for n in range(requests):
        clock.advance(0.01)
        user, rid = rng.randrange(tenants), f"r{n}"
        await engine.should_rate_limit("llm", _request(user, rid, rng.randrange(100, 2000), False))
        calls += 1
        if n % 10:
            await engine.should_rate_limit(
                "llm", _request(user, rid, rng.randrange(50, 3000), True)
            )
            calls += 1
    elapsed = time.perf_counter() - started
    return {"calls": calls, "calls_per_second": round(calls / elapsed)}


async def _measure(
    name: str, tenants: int, requests: int, tmp: Path, max_keys: int = 0
) -> dict[str, Any]:
    if name == "memory":
        backend: Backend = MemoryBackend(ManualClock(0.0), max_keys)
        await backend.start()
        out = await run(backend, tenants, requests)
        await backend.close()
        return out
    server = RedisProcess(tmp / "redis").start()
    try:
        target = parse_backend_url(server.url, pool_size=4, timeout=5.0)
        backend = RedisBackend(target, server_time=False)
        await backend.start()
        out = await run(backend, tenants, requests)
        await backend.close()
        with server.client() as client:
            stats = client.info("commandstats").get("cmdstat_evalsha", {})
            out["evalsha_usec_per_call"] = stats.get("usec_per_call")
            base = "ferryman_budget_{llm.user|u0}"
            keys = [base, base + ":open", base + ":estimates", base + ":settled"]
            out["tenant_bytes"] = sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)
        return out
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--backend", default="memory,redis")
    parser.add_argument("--max-keys", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="ferryman-budget-") as tmp:
        for name in args.backend.split(","):
            results[name] = asyncio.run(
                _measure(name, args.tenants, args.requests, Path(tmp), args.max_keys)
            )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, numbers in results.items():
        print(name, " ".join(f"{k}={v}" for k, v in numbers.items()))


if __name__ == "__main__":
    main()
