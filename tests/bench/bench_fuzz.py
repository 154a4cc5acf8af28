"""Random and mutated messages to every method of every gRPC API of a real `ferryman serve`
(memory backend): the codes they were answered with, the server's resident memory as the
run goes, and the tracebacks it logged (none expected). Prints a Markdown table.

    python tests/bench/bench_fuzz.py [--cases 100000] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the tests/ helpers

from helpers.fuzz import FAILURES, cases, send  # noqa: E402
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


def serve(work: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
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
        found = re.search(r"grpc :(\d+)", log.read_text(errors="replace"))
        if found:
            return proc, int(found.group(1)), log
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port, log = serve(Path(tmp))
        try:
            codes, failed, samples, elapsed = run(proc, port, args.cases, args.seed)
        finally:
            proc.terminate()
            proc.wait(20)
        text = log.read_text(errors="replace")
    print(
        f"{args.cases} cases in {elapsed:.1f} s ({args.cases / elapsed:.0f}/s), seed {args.seed}\n"
    )
    print("| answered | calls |\n|---|---|")
    for name, count in codes.most_common():
        print(f"| {name} | {count} |")
    print("\n| after cases | server RSS (MiB) |\n|---|---|")
    for n, kib in samples:
        print(f"| {n} | {kib / 1024:.1f} |")
    print(f"\ntracebacks logged: {text.count('Traceback')}")
    for line in failed:
        print("failed inside the server:", line)


if __name__ == "__main__":
    main()
