"""Random and mutated messages to every method of every gRPC API of a real `ferryman serve`
(memory backend), then random and mutated requests to every route of its HTTP and debug
ports (the config API's aside), then 200 connections that announce a 1 MiB body and stall:
the codes they were answered with, the server's resident memory as the run goes, and the
tracebacks it logged (none expected). Prints Markdown tables.

    python tests/bench/bench_fuzz.py [--cases 100000] [--http-cases 100000] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the tests/ helpers

from helpers.fuzz import FAILURES, cases, http_cases, http_failed, http_send, send  # noqa: E402
from helpers.holds import JOBS_CONFIG  # noqa: E402
from helpers.server import MIXED  # noqa: E402

QUOTA = """
namespaces:
  users:
    dynamic_bucket_template: {size: 10, fill_rate: 1, max_idle_millis: 1000}
    max_dynamic_buckets: 100
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def serve(work: Path) -> tuple[subprocess.Popen[bytes], dict[str, int], Path]:
    """A started ``ferryman serve`` on free ports: the process, its ports by name, its log."""
    config = work / "config"
    config.mkdir()
    (config / "mixed.yaml").write_text(MIXED)
    (config / "jobs.yaml").write_text(JOBS_CONFIG)
    (config / "quota.yaml").write_text(QUOTA)
    log = work / "serve.log"
    env = {**os.environ, "DOORMAN_MINIMUM_REFRESH_INTERVAL": "0", "USE_STATSD": "false"}
    ports = ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ferryman", "serve", "--config", str(config), *ports],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"grpc :(\d+), http :(\d+), debug :(\d+)", log.read_text("latin-1"))
        if found:
            named = zip(("grpc", "http", "debug"), map(int, found.groups()), strict=True)
            return proc, dict(named), log
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("ferryman serve did not start:\n" + log.read_text())


def run(
    proc: subprocess.Popen[bytes], port: int, count: int, seed: int
) -> tuple[collections.Counter[str], list[str], list[tuple[int, int]], float]:
    """Send ``count`` cases: the codes, the failures, RSS samples and the seconds taken."""
    codes: collections.Counter[str] = collections.Counter()
    failed: list[str] = []
    samples = [(0, rss_kib(proc.pid))]
    start = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for n, (target, payload) in enumerate(cases(seed, count), start=1):
            code = send(channel, target, payload)
            codes[code.name] += 1
            if code in FAILURES and len(failed) < 10:
                failed.append(f"{target.path} {payload!r}: {code.name}")
            if n % max(1, count // 5) == 0:
                samples.append((n, rss_kib(proc.pid)))
    return codes, failed, samples, time.monotonic() - start


def run_http(
    proc: subprocess.Popen[bytes], ports: dict[str, int], count: int, seed: int
) -> tuple[collections.Counter[str], list[str], list[tuple[int, int]], float]:
    """Send ``count`` HTTP cases on kept-alive connections, one per port: the statuses,
    the failures, RSS samples and the seconds taken."""
    codes: collections.Counter[str] = collections.Counter()
    failed: list[str] = []
    samples = [(0, rss_kib(proc.pid))]
    conns = {
        name: http.client.HTTPConnection("127.0.0.1", ports[name], timeout=10) for name in ports
    }
    start = time.monotonic()
    for n, (route, target, body) in enumerate(http_cases(seed, count), start=1):
        status = http_send(conns[route.port], route, target, body)
        codes[str(status)] += 1
        if http_failed(status) and len(failed) < 10:
            failed.append(f"{route.method} {target[:80]} {body[:80]!r}: {status}")
        if n % max(1, count // 5) == 0:
            samples.append((n, rss_kib(proc.pid)))
    for conn in conns.values():
        conn.close()
    return codes, failed, samples, time.monotonic() - start


def stall(
    proc: subprocess.Popen[bytes], port: int, clients: int = 200, sent: int = (1 << 20) - 1
) -> list[tuple[str, int]]:
    """``clients`` connections that each announce a 1 MiB body to /json, send ``sent``
    bytes of it and stall: the server's RSS before, while they stall, and after it cut
    them (with what each was answered)."""
    samples = [("before", rss_kib(proc.pid))]
    head = b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
    socks = []
    refused = 0
    for _ in range(clients):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            sock.sendall(head + b"[" * sent)
        except OSError:
            refused += 1
        socks.append(sock)
    time.sleep(1)
    samples.append((f"{clients} stalled ({refused} refused while sending)", rss_kib(proc.pid)))
    answers: collections.Counter[str] = collections.Counter()
    start = time.monotonic()
    for sock in socks:
        try:
            first = sock.recv(64).split(b" ")[1:2]
            answers[first[0].decode() if first else "closed"] += 1
        except OSError:
            answers["reset"] += 1
        sock.close()
    cut = time.monotonic() - start
    shown = ", ".join(f"{k} x{v}" for k, v in answers.most_common())
    samples.append((f"all cut {cut:.1f} s later ({shown})", rss_kib(proc.pid)))
    return samples


def report(
    title: str, codes: collections.Counter[str], samples: list[tuple[int, int]], failed: list[str]
) -> None:
    print(f"| {title} | calls |\n|---|---|")
    for name, count in codes.most_common():
        print(f"| {name} | {count} |")
    print("\n| after cases | server RSS (MiB) |\n|---|---|")
    for n, kib in samples:
        print(f"| {n} | {kib / 1024:.1f} |")
    for line in failed:
        print("failed inside the server:", line)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--http-cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log", type=Path, help="where to keep the server's log")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, ports, log = serve(Path(tmp))
        try:
            codes, failed, samples, elapsed = run(proc, ports["grpc"], args.cases, args.seed)
            web = {k: v for k, v in ports.items() if k != "grpc"}
            http_run = run_http(proc, web, args.http_cases, args.seed)
            stalled = stall(proc, ports["http"])
        finally:
            proc.terminate()
            proc.wait(20)
        text = log.read_text(errors="replace")
        if args.log is not None:
            args.log.write_text(text)
    print(f"gRPC: {args.cases} cases in {elapsed:.1f} s, seed {args.seed}\n")
    report("answered", codes, samples, failed)
    http_codes, http_failures, http_samples, http_elapsed = http_run
    print(f"HTTP: {args.http_cases} cases in {http_elapsed:.1f} s, seed {args.seed}\n")
    report("HTTP status", http_codes, http_samples, http_failures)
    print("| stalled bodies | server RSS (MiB) |\n|---|---|")
    for what, kib in stalled:
        print(f"| {what} | {kib / 1024:.1f} |")
    print(f"\ntracebacks logged: {text.count('Traceback')}")
    print(f"lines logged: {len(text.splitlines())}")


if __name__ == "__main__":
    main()
