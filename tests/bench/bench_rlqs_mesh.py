"""Envoy's rate limit quota service at mesh scale, over real gRPC: a simulated mesh of Envoys
(tests/helpers/rlqs_mesh.py, N streams from this process) against a real ``ferryman serve``.

Usage::

    python tests/bench/bench_rlqs_mesh.py [--envoys 1000] [--buckets 100]
        [--share 1 --share 10 --share 100 --share 1000] [--seconds 30] [--interval 5]
        [--limit 10000]

For each ``--share K`` a fresh ferryman (memory backend, a descriptors dir written here,
loopback ports chosen by the kernel) serves N Envoys, each reporting M buckets every
``--interval`` seconds (staggered; a 0 s first report at once), each bucket shared by K
Envoys and limited to ``--limit`` per second. The same N x M entries are reported per second
whatever K. It prints:

- opening: streams accepted (and refused, with the status) and the seconds until every
  stream was answered;
- CPU: ferryman's whole process CPU (from /proc/<pid>/stat: gRPC, reports, ticks, pushes)
  over ``--seconds`` per bucket entry reported, and as a share of one core (goal: within
  1.5x from 1 to 1,000 Envoys per bucket; 1,000 Envoys x 100 buckets every 5 s under half
  a core); this process's own CPU beside it (it shares the machine);
- memory: ferryman's RSS with the streams open minus its RSS before, per stream and per
  (Envoy, bucket) pair; and again once every stream has closed and ferryman holds no
  stream and no pair (the seconds that took: an ended stream's share is held for its TTL);
- latency: from a report to the next message on its stream, and the share of the time
  ferryman was runnable but waited for a CPU (from /proc/<pid>/task/*/schedstat: the
  machine is shared);
- share used: under saturating demand (each Envoy 2 x limit / K), the sum over a bucket's
  Envoys of min(assigned, demand) as a share of the limit (goal >= 97%);
- convergence: every Envoy at limit / 2K, then half of each bucket's Envoys step up to
  twice the limit: the seconds until every Envoy holds its new max-min share (within 3%
  and half a token per second) (goal: within one report interval plus one tick);
- the highest sum of the token bucket rates the Envoys of a bucket hold at one instant, as
  a share of the limit (goal <= 102%), and the longest stretch above 102%: from the first
  reports through the steady load, and through the step.

A benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the process helpers

from envoy_procs import FerrymanProcess
from helpers.rlqs_mesh import BucketKey, Envoy, Held, Mesh, fair_shares

PORTS = ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
TICK = 1.0  # RLQS_TICK's default
TTL = 15.0  # an assignment's time to live: an ended stream's share is held that long


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def waited_seconds(pid: int) -> float:
    """Seconds the process's threads have waited for a CPU, runnable (from schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return total / 1e9


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def held_page(ferryman: FerrymanProcess) -> dict[str, Any]:
    """The debug port's /rlqs, but its buckets: streams, buckets and pairs held."""
    url = f"http://127.0.0.1:{ferryman.debug_port}/rlqs"
    with urllib.request.urlopen(url, timeout=60) as reply:
        page: dict[str, Any] = json.load(reply)
    return {
        "streams": len(page["streams"]),
        "buckets": page["bucket_count"],
        "pairs": page["pairs"],
    }


def config(limit: int) -> str:
    return (
        "domain: mesh\ndescriptors:\n  - key: tenant\n"
        f"    rate_limit: {{unit: second, requests_per_unit: {limit}}}\n"
    )


def buckets_of(envoys: int, buckets: int, share: int) -> list[list[dict[str, str]]]:
    """Envoy i's bucket ids: ``buckets`` of them, each shared by ``share`` Envoys."""
    distinct = max(1, envoys * buckets // share)
    return [
        [{"tenant": f"t{(i * buckets + b) % distinct}"} for b in range(buckets)]
        for i in range(envoys)
    ]


@dataclass
class Watch:
    """What the Envoys hold, watched as assignments come: each bucket's summed token bucket
    rates and its highest at any instant, and after a step which (Envoy, bucket) pairs do
    not hold their expected share yet."""

    limit: float
    sums: dict[BucketKey, float] = field(default_factory=dict)
    highest: float = 0.0
    expected: dict[tuple[int, BucketKey], float] = field(default_factory=dict)
    waiting: set[tuple[int, BucketKey]] = field(default_factory=set)
    converged_at: float | None = None
    converged: asyncio.Event = field(default_factory=asyncio.Event)
    # Since when each bucket's sum is over the limit plus 2%, and the longest such stretch.
    over_since: dict[BucketKey, float] = field(default_factory=dict)
    longest_over: float = 0.0

    def __call__(self, envoy: Envoy, bucket: BucketKey, old: Held | None, new: Held) -> None:
        was = 0.0 if old is None or old.tokens == 0 else old.rate or 0.0
        now = 0.0 if new.tokens == 0 else new.rate or 0.0
        total = self.sums[bucket] = self.sums.get(bucket, 0.0) + now - was
        self.highest = max(self.highest, total / self.limit)
        if total > 1.02 * self.limit:
            self.over_since.setdefault(bucket, new.at)
        elif bucket in self.over_since:
            stretch = new.at - self.over_since.pop(bucket)
            self.longest_over = max(self.longest_over, stretch)
        pair = (envoy.index, bucket)
        if pair in self.expected:
            if self._holds(pair, new):
                self.waiting.discard(pair)
                if not self.waiting and self.converged_at is None:
                    self.converged_at = new.at
                    self.converged.set()
            else:
                self.waiting.add(pair)

    def _holds(self, pair: tuple[int, BucketKey], held: Held | None) -> bool:
        want = self.expected[pair]
        rate = None if held is None else held.rate
        return rate is not None and abs(rate - want) <= 0.03 * want + 0.5

    def expect(self, mesh: Mesh, demands: dict[tuple[int, BucketKey], float]) -> None:
        """From now on: every pair's max-min share of its bucket under ``demands``."""
        by_bucket: dict[BucketKey, dict[tuple[int, BucketKey], float]] = {}
        for pair, demand in demands.items():
            by_bucket.setdefault(pair[1], {})[pair] = demand
        expected: dict[tuple[int, BucketKey], float] = {}
        for own in by_bucket.values():
            expected.update(fair_shares(self.limit, own))
        self.expected, self.converged_at = expected, None
        self.converged.clear()
        self.waiting = {
            pair
            for pair in expected
            if not self._holds(pair, mesh.envoys[pair[0]].held.get(pair[1]))
        }


def used(mesh: Mesh, limit: float) -> list[float]:
    """Per bucket: the sum over its Envoys of min(assigned, demand), over the limit."""
    sums: dict[BucketKey, float] = {}
    for envoy in mesh.envoys:
        for bucket, held in envoy.held.items():
            rate = held.rate if held.tokens else 0.0
            sums[bucket] = sums.get(bucket, 0.0) + min(rate or 0.0, envoy.demand(bucket))
    return [s / limit for s in sums.values()]


async def drive(args: argparse.Namespace, share: int, ferryman: FerrymanProcess) -> dict[str, Any]:
    """One ferryman, one mesh: every phase's figures."""
    assert ferryman.proc is not None
    pid, limit, interval = ferryman.proc.pid, float(args.limit), args.interval
    out: dict[str, Any] = {"share": share, "rss_start": rss_bytes(pid)}
    mesh = Mesh(
        f"127.0.0.1:{ferryman.grpc_port}",
        "mesh",
        buckets_of(args.envoys, args.buckets, share),
        interval=interval,
        demand=2 * limit / share,
    )
    watch = Watch(limit)
    mesh.listeners.append(watch)
    await mesh.start()
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(120):
                await mesh.answered.wait()
        out["opened_s"] = mesh.opened_seconds
        out["accepted"], out["refused"] = len(mesh.accepted), len(mesh.refused)
        out["refusals"] = sorted({f"{e.code}: {e.details}" for e in mesh.refused})[:3]
        await asyncio.sleep(interval + 2 * TICK)  # every Envoy has reported over time
        out["rss_open"] = rss_bytes(pid)
        cpu0, mine0, entries0, t0 = (
            cpu_seconds(pid),
            time.process_time(),
            mesh.entries,
            time.monotonic(),
        )
        waited0, lags0 = waited_seconds(pid), len(mesh.lags)
        await asyncio.sleep(args.seconds)
        wall = time.monotonic() - t0
        out["waited_s"], out["load"] = waited_seconds(pid) - waited0, os.getloadavg()[0]
        out["lags"] = sorted(mesh.lags[lags0:])
        out["cpu_s"], out["wall_s"] = cpu_seconds(pid) - cpu0, wall
        out["mine_s"], out["entries"] = time.process_time() - mine0, mesh.entries - entries0
        out["used"] = used(mesh, limit)
        out["highest_steady"], watch.highest = watch.highest, 0.0
        out["over_steady"], watch.longest_over = watch.longest_over, 0.0
        await step(mesh, watch, limit, share, out)
        out["highest_step"], out["over_step"] = watch.highest, watch.longest_over
    finally:
        await mesh.close()
    # Ended streams' shares are held until their TTL, then dropped.
    closed, left = time.monotonic(), held_page(ferryman)
    while left["pairs"] or left["streams"]:
        if time.monotonic() - closed > TTL + 60:
            break
        await asyncio.sleep(1)
        left = held_page(ferryman)
    out["freed_s"], out["left"] = time.monotonic() - closed, left
    out["rss_closed"] = rss_bytes(pid)
    return out


async def step(mesh: Mesh, watch: Watch, limit: float, share: int, out: dict[str, Any]) -> None:
    """Every Envoy at limit / 2K for three reports (the demand window), then half of each
    bucket's Envoys step up to twice the limit: seconds until every Envoy holds its share."""
    low, high = limit / (2 * share), 2 * limit
    mesh.set_demand(lambda e, b: low)
    await asyncio.sleep(3 * mesh.interval + 2 * TICK)
    sharing: dict[BucketKey, list[int]] = {}
    accepted = mesh.accepted  # a refused Envoy holds nothing, and is not divided for
    for e in accepted:
        for b in e.buckets:
            sharing.setdefault(b, []).append(e.index)
    # Every other Envoy of each bucket steps up (a bucket of one Envoy: that one).
    ups = {(i, b) for b, own in sharing.items() for i in own[::2]}
    demands = {
        (e.index, b): high if (e.index, b) in ups else low for e in accepted for b in e.buckets
    }
    watch.expect(mesh, demands)
    started = time.monotonic()
    mesh.set_demand(lambda e, b: demands[(e.index, b)], accepted)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(3 * mesh.interval + 5 * TICK):
            await watch.converged.wait()
    done = watch.converged_at
    out["converged_s"] = None if done is None else max(0.0, done - started)
    out["not_converged"] = len(watch.waiting)


def run(args: argparse.Namespace, share: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        descriptors = workdir / "config"
        descriptors.mkdir()
        (descriptors / "mesh.yaml").write_text(config(args.limit))
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        env.update(
            HOST="127.0.0.1",
            GRPC_HOST="127.0.0.1",
            DEBUG_HOST="127.0.0.1",
            USE_STATSD="false",
            BACKEND_TYPE="memory",
            # A first start: no Envoy held anything before it, so there is nothing to learn.
            RLQS_LEARNING="0",
        )
        ferryman = FerrymanProcess(
            workdir / "ferryman", ["--config", str(descriptors), *PORTS], env
        )
        ferryman.start()
        try:
            time.sleep(1)  # started: its RSS at rest
            result = asyncio.run(drive(args, share, ferryman))
        finally:
            ferryman.stop()
        logged = ferryman.log.read_text(errors="replace").splitlines()
        result["errors"] = [line for line in logged if "ERROR" in line or "Traceback" in line]
        return result


def show(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    n, m = args.envoys, args.buckets
    print(
        f"\n{n} Envoys x {m} buckets, a report every {args.interval:g} s (staggered), "
        f"limit {args.limit}/s per bucket, {args.seconds} s measured, ferryman ticking every "
        f"{TICK:g} s"
    )
    first = results[0]["cpu_s"] / max(1, results[0]["entries"])
    for r in results:
        per_entry = r["cpu_s"] / max(1, r["entries"])
        grown = r["rss_open"] - r["rss_start"]
        conv = r["converged_s"]
        print(f"  {r['share']} Envoys per bucket:")
        print(
            f"    streams: {r['accepted']} of {n} accepted, {r['refused']} refused "
            f"{r['refusals'] or ''}; every stream answered {r['opened_s']:.1f} s after the start"
        )
        print(
            f"    ferryman CPU: {per_entry * 1e6:.1f} us per bucket entry "
            f"(x{per_entry / first:.2f} the first row); "
            f"{r['cpu_s'] / r['wall_s']:.1%} of one core at "
            f"{r['entries'] / r['wall_s']:.0f} entries/s (planned {n * m / args.interval:.0f}); "
            f"this process {r['mine_s'] / r['wall_s']:.1%}"
        )
        print(
            f"    RSS: {r['rss_start'] / 2**20:.0f} MiB at start, +{grown / 2**20:.0f} MiB "
            f"with the streams open: {grown / n / 1024:.1f} kB per stream, "
            f"{grown / (n * m):.0f} B per pair; "
            f"{r['rss_closed'] / 2**20:.0f} MiB once the streams closed and ferryman held "
            f"{r['left']} ({r['freed_s']:.0f} s after the close)"
        )
        lags = r["lags"] or [0.0]
        print(
            f"    a report's answer came after {lags[len(lags) // 2] * 1e3:.0f} ms (median), "
            f"{lags[int(len(lags) * 0.99)] * 1e3:.0f} ms (99th), {lags[-1] * 1e3:.0f} ms (most); "
            f"ferryman waited for a CPU {r['waited_s'] / r['wall_s']:.0%} of the time "
            f"(load average {r['load']:.1f} on {os.cpu_count()} cores)"
        )
        print(
            f"    share used under saturating demand: mean {sum(r['used']) / len(r['used']):.1%}, "
            f"lowest {min(r['used']):.1%} over {len(r['used'])} buckets (goal >= 97%)"
        )
        print(
            "    convergence after a demand step: "
            + (f"{conv:.1f} s" if conv is not None else f"not reached ({r['not_converged']} pairs)")
            + f" (goal <= {args.interval + TICK:g} s)"
        )
        if r["errors"]:
            print(f"    ferryman logged {len(r['errors'])} errors, the first: {r['errors'][0]}")
        print(
            f"    highest sum held at once, as a share of the limit (goal <= 102%): "
            f"{r['highest_steady']:.1%} from the first reports to the end of the steady load, "
            f"{r['highest_step']:.1%} from then through the step; the longest stretch above "
            f"102%: {r['over_steady'] * 1e3:.0f} ms and {r['over_step'] * 1e3:.0f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envoys", type=int, default=1000, help="simulated Envoys (streams)")
    parser.add_argument("--buckets", type=int, default=100, help="buckets each Envoy reports")
    parser.add_argument("--share", type=int, action="append", help="Envoys per bucket (repeatable)")
    parser.add_argument("--seconds", type=int, default=30, help="seconds of CPU measured")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between reports")
    parser.add_argument("--limit", type=int, default=10_000, help="requests per second per bucket")
    args = parser.parse_args()
    results = []
    for share in args.share or (1, 10, 100, 1000):
        results.append(run(args, share))
        print(f"  ({share} Envoys per bucket done)", flush=True)
    show(args, results)


if __name__ == "__main__":
    main()
