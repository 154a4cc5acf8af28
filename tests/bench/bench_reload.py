"""How long a config change takes to be served: file operation -> new config in force.

Run: python tests/bench/bench_reload.py [--rounds N]

For each kind of change (in-place edit, new file, atomic rename over a file, ConfigMap
``..data`` symlink swap) it performs N changes against a running service and prints the
median and worst time until the service's config version moved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests/ helpers

from ferryman.server.app import Service
from ferryman.settings import Settings

from helpers.configmap import configmap_volume


def rule(limit: int) -> str:
    return (
        "domain: bench\ndescriptors:\n  - key: user\n"
        f"    rate_limit: {{unit: day, requests_per_unit: {limit}}}\n"
    )


def measure(service: Service, change: Callable[[int], object], rounds: int) -> list[float]:
    times = []
    for i in range(rounds):
        version = service.holder.version
        start = time.perf_counter()
        change(i)
        while service.holder.version == version:
            if time.perf_counter() - start > 10:
                raise RuntimeError("change not applied within 10 s")
            time.sleep(0.001)
        times.append(time.perf_counter() - start)
        time.sleep(0.1)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain"
        plain.mkdir()
        (plain / "bench.yaml").write_text(rule(1))
        cm = Path(tmp) / "configmap"
        cm.mkdir()
        configmap_volume(cm, {"bench.yaml": rule(1)}, "v0")
        for name, directory in (("plain", plain), ("configmap", cm)):
            settings = Settings(
                host="127.0.0.1", port=0, grpc_host="127.0.0.1", grpc_port=0,
                debug_host="127.0.0.1", debug_port=0, config_dir=directory,
            )  # fmt: skip
            service = Service(settings)
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, daemon=True)
            thread.start()
            asyncio.run_coroutine_threadsafe(service.start(), loop).result(10)
            try:
                if name == "plain":
                    results["edit in place"] = measure(
                        service,
                        lambda i: (plain / "bench.yaml").write_text(rule(i + 2)),
                        args.rounds,
                    )

                    def add(i: int) -> None:
                        (plain / f"extra{i}.yaml").write_text(
                            rule(5).replace("domain: bench", f"domain: extra{i}")
                        )

                    results["new file"] = measure(service, add, args.rounds)

                    def rename(i: int) -> None:
                        tmpfile = plain / ".bench.yaml.tmp"
                        tmpfile.write_text(rule(10_000 + i))
                        os.replace(tmpfile, plain / "bench.yaml")

                    results["rename over"] = measure(service, rename, args.rounds)
                else:
                    results["configmap swap"] = measure(
                        service,
                        lambda i: configmap_volume(cm, {"bench.yaml": rule(i + 100)}, f"v{i + 1}"),
                        args.rounds,
                    )
            finally:
                asyncio.run_coroutine_threadsafe(service.stop(1), loop).result(10)
                loop.call_soon_threadsafe(loop.stop)
                thread.join(5)
    for name, times in results.items():
        ms = [t * 1000 for t in times]
        print(
            f"{name:15s} n={len(ms):3d}  median {statistics.median(ms):6.1f} ms"
            f"  max {max(ms):6.1f} ms"
        )


if __name__ == "__main__":
    main()
