"""A soak: two `ferryman serve` replicas on real Redis for N minutes, under mixed traffic and
the faults a long-running deployment meets.

Usage::

    python tests/bench/bench_soak.py --minutes 10 [--rate 40] [--json]

The replicas share a Redis master with a replica and a Sentinel (tests/helpers/soak.py) and
receive, all the time: ShouldRateLimit at ``--rate`` calls per second (half of them on an
hourly fixed window whose value names the 10 s period they were sent in, the rest spread
over a minute window, a sliding window, a token bucket and GCRA), held copies through the
Python client (four holders, each holding 2 copies for 0.3-0.6 s then releasing), quota
``Allow`` at 10 per second, one RLQS stream per replica reporting every second, and three
capacity clients holding leases. Meanwhile: the descriptors file rewritten every 10 s, a
config API write every 30 s, the Redis master restarted (empty: no persistence) every
``--redis-every`` seconds, one Sentinel failover halfway, and a rolling restart (SIGTERM,
then ``ferryman serve`` again on the same ports, one replica after the other) at three
quarters.

Printed per minute: the faults in it, answers by call and code, ShouldRateLimit p50/p99,
and each replica's resident memory, open file descriptors (/proc/<pid>/fd) and asyncio
tasks (/status). At the end: hits lost or counted twice (per 10 s period, the fixed-window
counters in Redis against the OK answers; a period within 3 s of a Redis restart or
failover is left out, since the docs say hits may be forgotten there, and named), copies
still held and leases still out once every client let go, and the goals met or not.

This is a report, not a test: pytest does not collect this directory
(``tests/test_soak_short.py`` runs a short soak and asserts only what is not timing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.soak import PERIOD, Outcome, Plan, Soak, leaked


def plan_for(minutes: float, rate: float, redis_every: float) -> Plan:
    seconds = minutes * 60
    restarts, at = [], redis_every
    while at < seconds - 30:
        restarts.append(at)
        at += redis_every
    return Plan(
        seconds=seconds,
        rate=rate,
        redis_restarts=tuple(restarts),
        failover_at=seconds * 0.5 + 15,
        rolling_at=seconds * 0.75,
    )


def goals(outcome: Outcome) -> list[tuple[str, bool, str]]:
    """Each goal, whether it was met, and the figures behind it."""
    out: list[tuple[str, bool, str]] = []
    rss = []
    for final in outcome.finals:
        base = outcome.baseline(final.replica, final.incarnation)
        if base is not None:
            rss.append(
                f"r{final.replica}: {base.rss_kib / 1024:.1f} -> {final.rss_kib / 1024:.1f} MiB"
                f" ({(final.rss_kib / base.rss_kib - 1) * 100:+.1f}%)"
            )
    rss_ok = all(
        (b := outcome.baseline(f.replica, f.incarnation)) is not None
        and abs(f.rss_kib / b.rss_kib - 1) <= 0.05
        for f in outcome.finals
    )
    out.append(("RSS within 5% of its value after warm-up", rss_ok, "; ".join(rss)))
    leaks = leaked(outcome)
    out.append(("descriptors and tasks flat", not leaks, "; ".join(leaks) or "within 8"))
    lost, doubled, _ = outcome.accounting()
    out.append(
        (
            "nothing lost or doubled",
            not lost and not doubled,
            f"lost in periods {lost}, doubled in {doubled}",
        )
    )
    first = outcome.minutes[0]["p99_ms"] if outcome.minutes else 0.0
    slow = [m["minute"] for m in outcome.minutes[1:] if not m["faults"] and m["p99_ms"] > 2 * first]
    out.append(
        (
            "no p99 above twice the first minute's outside a fault",
            not slow,
            f"first {first:.1f} ms; over it: minutes {slow}",
        )
    )
    out.append(
        (
            "no copy held, no lease out at the end",
            outcome.copies_held == 0 and outcome.leases_out == 0,
            f"copies {outcome.copies_held}, sessions {outcome.sessions},"
            f" leases {outcome.leases_out:g}",
        )
    )
    return out


def report(outcome: Outcome) -> dict[str, Any]:
    lost, doubled, skipped = outcome.accounting()
    ok = sum(outcome.ok.values())
    stored = sum(outcome.stored.values())
    return {
        "minutes": outcome.minutes,
        "faults": [dataclasses.asdict(f) for f in outcome.faults],
        "periods": len(set(outcome.ok) | set(outcome.stored)),
        "periods_left_out": {str(p): f for p, f in skipped.items()},
        "ok_answers": ok,
        "stored_hits": stored,
        "errors": sum(outcome.unknown.values()),
        "lost_periods": lost,
        "doubled_periods": doubled,
        "holds": outcome.holds,
        "copies_held": outcome.copies_held,
        "sessions": outcome.sessions,
        "leases_out": outcome.leases_out,
        "leases_later": outcome.leases_later,
        "lease_detail": outcome.lease_detail,
        "goals": [{"goal": g, "met": m, "figures": f} for g, m, f in goals(outcome)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--redis-every", type=float, default=180.0)
    parser.add_argument("--replicas", type=int, default=2, choices=[2])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    plan = plan_for(args.minutes, args.rate, args.redis_every)
    # A session that ends at a restart is expected here; its warning is not a finding.
    logging.getLogger("ferryman.client").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        soak = Soak(Path(tmp), plan, log=(lambda _: None) if args.json else print)
        try:
            outcome = soak.run()
        finally:
            soak.close()
    result = report(outcome)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"\nfixed-window hits: {result['ok_answers']} OK answers, {result['stored_hits']} in"
        f" Redis, {result['errors']} calls answered with an error; {result['periods']} periods"
        f" of {PERIOD} s, left out for a Redis fault: {result['periods_left_out'] or 'none'}"
    )
    print(f"lost in periods: {result['lost_periods']}; doubled in: {result['doubled_periods']}")
    print(
        f"holds granted {result['holds']}; copies still held {result['copies_held']}"
        f" (sessions open {result['sessions']}); leases still out {result['leases_out']:g}"
    )
    if result["leases_out"]:
        print(f"  still leased: {'; '.join(result['lease_detail'])}")
        print(f"  {result['leases_later']:g} still leased a lease's length later")
    for goal in result["goals"]:
        print(f"{'met    ' if goal['met'] else 'NOT met'}  {goal['goal']}: {goal['figures']}")


if __name__ == "__main__":
    main()
