"""Replay's rate: decisions per second of ``ferryman replay`` on a generated decision log.

Usage::

    python tests/bench/bench_replay.py [--lines 1000000] [--tenants 1000] [--rate 2000]

Writes a decision log of ``--lines`` requests (``--rate`` per simulated second, each from
one of ``--tenants`` tenants, with a per-tenant and a per-path descriptor), then replays it
through the library (``ferryman.replay``) against the example below and prints the
decisions per second (of the wall clock, and of this process's CPU time, which a busy
machine disturbs less), reading the log included. The log is the one
``DECISION_LOG`` writes, made here without a server so that a million lines take seconds.
This is a benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

from ferryman.config.loader import load_sources
from ferryman.replay.decision_log import read_log
from ferryman.replay.replay import replay

CONFIG = """
domain: web
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 500}
"""


def write_log(path: Path, lines: int, tenants: int, rate: int) -> None:
    rng = random.Random(7)
    start = 1_700_006_400.0
    with path.open("w") as f:
        for i in range(lines):
            line = {
                "t": start + i / rate,
                "domain": "web",
                "hits": 0,
                "descriptors": [
                    {"entries": [["tenant", f"t{rng.randrange(tenants)}"]]},
                    {"entries": [["path", f"/api/{rng.randrange(20)}"]]},
                ],
                "rules": [None, None],
                "codes": ["OK", "OK"],
                "code": "OK",
            }
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=2000)
    args = parser.parse_args()
    config = load_sources([("web.yaml", CONFIG)])
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "decisions.jsonl"
        write_log(log, args.lines, args.tenants, args.rate)
        started, cpu = time.perf_counter(), time.process_time()
        outcome = asyncio.run(replay(read_log(log), config))
        total, used = time.perf_counter() - started, time.process_time() - cpu
    refused = sum(r.refused for r in outcome.config.results())
    print(
        f"replayed {outcome.decisions} decisions in {total:.2f} s: "
        f"{outcome.decisions / total:,.0f} decisions/s including reading the log, "
        f"{outcome.decisions / used:,.0f} per CPU second ({refused} descriptors refused)"
    )


if __name__ == "__main__":
    main()
