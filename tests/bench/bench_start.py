"""Start and footprint of ``ferryman serve``: the sidecar's case, and what each optional part adds.

Usage::

    python tests/bench/bench_start.py [--starts 5] [--requests 10000] [--cases sidecar,...]
                                      [--json]

Each case starts ``python -m ferryman serve`` on a copy of the repository's ``descriptors/``
as a child process, ``--starts`` times, and measures:

- **ready**: seconds from the exec to the first ShouldRateLimit answered on the gRPC port
  (the port is polled every 5 ms, then one call is sent on a new channel, again until one is
  answered); the median of the starts is printed, with the least and the most; and the CPU
  the process had used by then (user and system), the steadier figure on a busy machine;
- **idle**: the resident memory (VmRSS) and the threads of the process 2 s after it is ready;
- **after N**: the resident memory after ``--requests`` ShouldRateLimit calls (32 in flight,
  one channel, several descriptors and client addresses), 1 s after the last answer.

The cases: ``sidecar`` (the memory backend, every setting its default); ``prometheus``
(USE_PROMETHEUS), ``tracing`` (TRACING_ENABLED, no exporter), ``config-api``
(ADMIN_TOKENS_FILE) each on top of the sidecar; ``redis`` (BACKEND_TYPE=redis on a
redis-server started here); and ``all``: Redis, Prometheus, tracing and the config API, with
one call to each other protocol (ferryman.v1, Doorman, the quota service, Envoy's quota
service) before the requests, so that every API's servicer and messages are loaded.

A run of the defaults takes about two minutes; the figures depend on the machine (its CPU,
and how busy it is): compare cases of one run. This is a benchmark, not a test: pytest does
not collect this directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.ferryman.v1 import limiter_pb2, limiter_pb2_grpc
from ferryman._proto.quotaservice import quota_service_pb2, quota_service_pb2_grpc

from helpers.ports import free_port
from helpers.redis_procs import RedisProcess

REPO = Path(__file__).resolve().parents[2]
CASES = ("sidecar", "prometheus", "tracing", "config-api", "redis", "all")
IN_FLIGHT = 32


@dataclass
class Figures:
    case: str
    ready_s: float
    ready_min_s: float
    ready_max_s: float
    ready_cpu_s: float
    idle_mib: float
    threads: int
    after_requests_mib: float
    threads_after: int
    requests: int


def _status(pid: int) -> tuple[float, int]:
    """VmRSS (MiB) and the thread count of process ``pid``."""
    text = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def _cpu(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request(i: int) -> rls_pb2.RateLimitRequest:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry
    return rls_pb2.RateLimitRequest(
        domain="edge-proxy",
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[entry(key="remote_address", value=f"10.0.{i % 50}.{i % 200}")]
            ),
            ratelimit_pb2.RateLimitDescriptor(
                entries=[
                    entry(key="generic_key", value="slow-path"),
                    entry(key="path", value="/api/x"),
                ]
            ),
        ],
    )


def _answered(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.ShouldRateLimit(_request(0), timeout=1)
        except grpc.RpcError:
            return False
    return True


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_ready(proc: subprocess.Popen[bytes], port: int, started: float) -> float:
    while not (_listening(port) and _answered(port)):
        if proc.poll() is not None:
            raise SystemExit(f"ferryman serve exited with {proc.returncode}")
        if time.perf_counter() - started > 60:
            raise SystemExit("ferryman serve was not ready in 60 s")
        time.sleep(0.005)
    return time.perf_counter() - started


def _load(port: int, requests: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
        pending: list[grpc.Future[Any]] = []
        for i in range(requests):
            pending.append(stub.ShouldRateLimit.future(_request(i), timeout=30))
            if len(pending) >= IN_FLIGHT:
                pending.pop(0).result()
        for future in pending:
            future.result()


def _every_api(port: int) -> None:
    """One call to each protocol besides Envoy's RLS (answers or refusals alike)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        calls: list[Callable[[], object]] = [
            lambda: limiter_pb2_grpc.LimiterStub(channel).Request(  # type: ignore[no-untyped-call]
                limiter_pb2.RateRequest(
                    domain="cookbook", descriptor=[limiter_pb2.Entry(key="simple_user", value="a")]
                ),
                timeout=5,
            ),
            lambda: doorman_pb2_grpc.CapacityStub(channel).Discovery(  # type: ignore[no-untyped-call]
                doorman_pb2.DiscoveryRequest(), timeout=5
            ),
            lambda: quota_service_pb2_grpc.QuotaServiceStub(channel).Allow(  # type: ignore[no-untyped-call]
                quota_service_pb2.AllowRequest(namespace="n", bucket_name="b"), timeout=5
            ),
            lambda: list(
                rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel).StreamRateLimitQuotas(  # type: ignore[no-untyped-call]
                    iter([rlqs_pb2.RateLimitQuotaUsageReports(domain="edge-proxy")]), timeout=1
                )
            ),
        ]
        for call in calls:
            with suppress(grpc.RpcError):
                call()


def _one_start(
    env: dict[str, str], config: Path, requests: int, every_api: bool
) -> tuple[float, ...]:
    port = free_port()
    full = {"PATH": os.environ.get("PATH", ""), **env}
    if "PYTHONPATH" in os.environ:
        full["PYTHONPATH"] = os.environ["PYTHONPATH"]
    args = ["--config", str(config), "--grpc-port", str(port), "--http-port", "0"]
    args += ["--debug-port", "0"]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ferryman", "serve", *args],
        cwd=REPO,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = _wait_ready(proc, port, started)
        cpu = _cpu(proc.pid)
        time.sleep(2)
        idle, threads = _status(proc.pid)
        if every_api:
            _every_api(port)
        _load(port, requests)
        time.sleep(1)
        after, threads_after = _status(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return ready, idle, threads, after, threads_after, cpu


def _case_env(case: str, redis_url: str, tokens: Path) -> dict[str, str]:
    prometheus = {"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": f"127.0.0.1:{free_port()}"}
    redis = {"BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redis_url}
    config_api = {"ADMIN_TOKENS_FILE": str(tokens)}
    tracing = {"TRACING_ENABLED": "true"}
    return {
        "sidecar": {},
        "prometheus": prometheus,
        "tracing": tracing,
        "config-api": config_api,
        "redis": redis,
        "all": {**redis, **prometheus, **tracing, **config_api},
    }[case]


def measure(case: str, env: dict[str, str], config: Path, starts: int, requests: int) -> Figures:
    runs = [_one_start(env, config, requests, case == "all") for _ in range(starts)]
    ready = [r[0] for r in runs]
    return Figures(
        case=case,
        ready_s=round(statistics.median(ready), 3),
        ready_min_s=round(min(ready), 3),
        ready_max_s=round(max(ready), 3),
        ready_cpu_s=round(statistics.median(r[5] for r in runs), 3),
        idle_mib=round(statistics.median(r[1] for r in runs), 1),
        threads=int(statistics.median(r[2] for r in runs)),
        after_requests_mib=round(statistics.median(r[3] for r in runs), 1),
        threads_after=int(statistics.median(r[4] for r in runs)),
        requests=requests,
    )


@contextmanager
def _redis(workdir: Path, needed: bool) -> Iterator[str]:
    if not needed:
        yield ""
        return
    server = RedisProcess(workdir / "redis").start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"--cases: unknown {sorted(unknown)}; choose among {', '.join(CASES)}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens"
        tokens.write_text("bench-token bench write\n")
        tokens.chmod(0o600)
        # A copy: the config API keeps its history beside the files it serves.
        config = Path(tmp) / "descriptors"
        shutil.copytree(REPO / "descriptors", config)
        with _redis(Path(tmp), bool({"redis", "all"} & set(cases))) as redis_url:
            for case in cases:
                env = _case_env(case, redis_url, tokens)
                figures = measure(case, env, config, args.starts, args.requests)
                results.append(figures)
                if not args.json:
                    print(
                        f"{case:11} ready {figures.ready_s:.2f} s "
                        f"({figures.ready_min_s:.2f}-{figures.ready_max_s:.2f}, "
                        f"CPU {figures.ready_cpu_s:.2f} s), "
                        f"idle {figures.idle_mib:.1f} MiB {figures.threads} threads, "
                        f"after {figures.requests} requests {figures.after_requests_mib:.1f} MiB "
                        f"{figures.threads_after} threads",
                        flush=True,
                    )
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
