"""What ferryman does when Redis is sick: one row per fault, under steady load.

Usage::

    python tests/bench/bench_faults.py [--seconds 5] [--rate 200] [--deadline 1.0]
                                       [--redis-timeout 10] [--fault sigstop,...] [--json]

For each fault (SIGSTOP of redis-server; a TCP proxy that black-holes, refuses, closes or
slows the connection; SIGKILL and restart; ``cluster``: a master of a replicated Cluster
killed until its replica takes over) a real redis-server and an in-process ferryman
get ShouldRateLimit calls at ``--rate`` per second, each with a client deadline of
``--deadline`` seconds: one second of steady load, the fault for ``--seconds``, then three
seconds of recovery. Defaults are the campaign of issue 26: 200 calls/s, a 1 s deadline
and the default REDIS_TIMEOUT of 10 s. Printed per fault:

- the share of calls answered before the client's deadline, and the answers' codes;
- whether the hits stored in Redis equal the calls answered OK (per descriptor value;
  after a kill only the counters written after the restart are compared);
- connection attempts per second while the fault lasted;
- recovery: from the end of the fault to the first OK answer;
- scripts refused by Redis as late, calls refused by the open breaker, and the state
  transitions and log lines seen.

This is a report, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.sick_redis import FAULTS, Report, run_cluster_kill, run_fault


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--deadline", type=float, default=1.0)
    parser.add_argument("--redis-timeout", type=float, default=10.0)
    parser.add_argument("--slow-delay", type=float, default=0.3)
    parser.add_argument("--fault", default=",".join((*FAULTS, "cluster")))
    parser.add_argument("--fail-open", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reports: list[Report] = []
    for fault in args.fault.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if fault == "cluster":
                reports.append(
                    run_cluster_kill(
                        Path(tmp),
                        rate=args.rate,
                        deadline=args.deadline,
                        redis_timeout=args.redis_timeout,
                    )
                )
                continue
            reports.append(
                run_fault(
                    fault,
                    Path(tmp),
                    seconds=args.seconds,
                    rate=args.rate,
                    deadline=args.deadline,
                    redis_timeout=args.redis_timeout,
                    fail_open=args.fail_open,
                    slow_delay=args.slow_delay / 2,
                    settle=3.0,
                )
            )
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in reports], indent=2))
        return
    print(
        f"{args.rate:g} calls/s, client deadline {args.deadline:g}s, REDIS_TIMEOUT "
        f"{args.redis_timeout:g}s, faults of {args.seconds:g}s, "
        f"{'FAIL_OPEN' if args.fail_open else 'fail-closed'}"
    )
    print(
        "| fault | calls | answered in time | codes | hits in Redis = OK answers | "
        "connects/s | recovery | late scripts | breaker refusals | transitions |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in reports:
        codes = ", ".join(f"{k} {v}" for k, v in sorted(r.codes.items()))
        counted = "; ".join(
            f"{s} = {ok}" + (f" (+{m} unseen)" if m else "") for s, ok, m in r.counted.values()
        )
        recovery = "-" if r.recovery is None else f"{r.recovery:.2f}s"
        print(
            f"| {r.fault} | {r.calls} | {r.answered_in_time:.1%} | {codes} | "
            f"{'yes' if r.hits_exact else 'NO'} ({counted}) | {r.connects_per_second:.1f} | "
            f"{recovery} | {r.late_scripts} | {r.refused_calls} | "
            f"{', '.join(r.transitions)} |"
        )
    for r in reports:
        print(f"\n{r.fault}: {len(r.log_lines)} log lines, lost exceptions: {len(r.lost)}")
        for line in r.log_lines:
            print(f"  {line}")


if __name__ == "__main__":
    main()
