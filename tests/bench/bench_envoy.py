"""Latency Envoy adds with ferryman in the path, against the same Envoy without the filter.

Usage::

    python tests/bench/bench_envoy.py [--seconds N] [--connections 1,16] [--rounds R]
                                      [--tool wrk|python] [--json]

Two Envoys run side by side from envoy/front-proxy.yaml (ports mapped to free loopback
ports): one as committed (the rate limit filter asks ferryman about every request: one
``remote_address`` descriptor, a fixed-window counter in ferryman's in-memory backend, with a
limit never reached), one with the filter removed. Both forward to the same upstream, a third
Envoy answering 200 from a direct_response, so the upstream costs little and the same for
both. For each connection count and round, the load runs against one Envoy and then the
other (closed loop: each connection sends its next request when the answer arrives), and the
median and p99 latency of each are reported with their difference, the filter's cost.

``wrk`` (Debian's package) is used when it is on PATH, else a Python load generator
(threads with keep-alive connections; its own overhead is in both columns alike). Everything
runs on one machine: the load generator, Envoy and ferryman share the cores, so compare
numbers from one run, not across machines. A benchmark, not a test: pytest does not collect
this directory.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    UPSTREAM,
    Client,
    EnvoyProcess,
    FerrymanProcess,
    render,
    request,
)
from helpers.ports import free_port

# Limits that are counted but never reached, so every answer is 200 and comes from upstream.
BENCH_DESCRIPTORS = """\
domain: edge-proxy
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"""


def upstream_config(port: int, admin: int) -> dict[str, Any]:
    """An Envoy answering 200 to everything on ``port``: a cheap, steady upstream."""
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "upstream",
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
                        }
                    ],
                }
            ]
        },
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "upstream",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }


def without_filter(tree: dict[str, Any]) -> dict[str, Any]:
    for listener in tree["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                config = network_filter["typed_config"]
                config["http_filters"] = [
                    f for f in config["http_filters"] if f["name"] != "envoy.filters.http.ratelimit"
                ]
    return tree


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    assert match, text
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(port: int, connections: int, seconds: float) -> dict[str, float]:
    threads = min(connections, 2)
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            f"http://127.0.0.1:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError("non-200 answers during the run:\n" + out)
    percentiles = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.MULTILINE))
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert rps and len(percentiles) == 2, out
    return {
        "p50_ms": _ms(percentiles["50"]),
        "p99_ms": _ms(percentiles["99"]),
        "rps": float(rps.group(1)),
    }


def run_python(port: int, connections: int, seconds: float) -> dict[str, float]:
    samples: list[list[float]] = [[] for _ in range(connections)]
    errors: list[str] = []
    stop = time.monotonic() + seconds

    def worker(out: list[float]) -> None:
        with Client(port) as client:
            while time.monotonic() < stop:
                start = time.perf_counter()
                status, _, _ = client.get("/")
                out.append(time.perf_counter() - start)
                if status != 200:
                    errors.append(str(status))
                    return

    threads = [threading.Thread(target=worker, args=(s,)) for s in samples]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"non-200 answers during the run: {errors[:5]}")
    latencies = sorted(x for s in samples for x in s)
    q = statistics.quantiles(latencies, n=100)
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "rps": len(latencies) / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tool", choices=["wrk", "python"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tool = args.tool or ("wrk" if shutil.which("wrk") else "python")
    load = run_wrk if tool == "wrk" else run_python
    counts = [int(c) for c in args.connections.split(",")]

    with tempfile.TemporaryDirectory(prefix="bench-envoy-") as tmp:
        work = Path(tmp)
        config = work / "config"
        config.mkdir()
        (config / "bench.yaml").write_text(BENCH_DESCRIPTORS)
        ferryman = FerrymanProcess(
            work / "ferryman",
            ["--config", str(config), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"],
        ).start()
        envoys: list[EnvoyProcess] = []
        try:
            up_port, up_admin = free_port(), free_port()
            envoys.append(
                EnvoyProcess(upstream_config(up_port, up_admin), work / "up", up_admin).start()
            )
            ports: dict[str, int] = {}
            for variant in ("ferryman", "no filter"):
                admin, listener = free_port(), free_port()
                mapping = {
                    ADMIN: admin,
                    LISTENER: listener,
                    UPSTREAM: up_port,
                    FERRYMAN: ferryman.grpc_port,
                }
                tree = render(ENVOY_DIR / "front-proxy.yaml", mapping)
                if variant == "no filter":
                    tree = without_filter(tree)
                envoys.append(EnvoyProcess(tree, work / variant.replace(" ", "-"), admin).start())
                ports[variant] = listener
            for port in ports.values():  # warm-up: connections, caches
                load(port, max(counts), 1.0)
            results: dict[int, dict[str, list[dict[str, float]]]] = {
                c: {v: [] for v in ports} for c in counts
            }
            for _ in range(args.rounds):
                for c in counts:
                    for variant, port in ports.items():
                        results[c][variant].append(load(port, c, args.seconds))
            _, _, stats = request(ferryman.debug_port, "/stats")
            calls = re.search(rb"ShouldRateLimit\.total_requests: (\d+)", stats)
        finally:
            for envoy in envoys:
                envoy.stop()
            ferryman.stop()

    summary = []
    for c in counts:
        row: dict[str, Any] = {"connections": c}
        for variant in ports:
            runs = results[c][variant]
            row[variant] = {
                key: statistics.median(r[key] for r in runs) for key in ("p50_ms", "p99_ms", "rps")
            }
        row["added_p50_ms"] = row["ferryman"]["p50_ms"] - row["no filter"]["p50_ms"]
        row["added_p99_ms"] = row["ferryman"]["p99_ms"] - row["no filter"]["p99_ms"]
        summary.append(row)
    checked = int(calls.group(1)) if calls else 0
    if args.json:
        print(json.dumps({"tool": tool, "ferryman_calls": checked, "results": summary}, indent=2))
        return 0
    print(
        f"load: {tool}, {args.rounds} round(s) x {args.seconds:g}s per variant and connection "
        f"count, medians of the rounds; ferryman answered {checked} ShouldRateLimit calls"
    )
    print(f"{'conns':>5}  {'variant':<10} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>9}")
    for row in summary:
        for variant in ports:
            r = row[variant]
            print(
                f"{row['connections']:>5}  {variant:<10} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f}"
                f" {r['rps']:>9.0f}"
            )
        print(f"{'':>5}  {'added':<10} {row['added_p50_ms']:>8.3f} {row['added_p99_ms']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
