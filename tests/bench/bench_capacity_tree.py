"""Capacity lease trees: the root's load for K clients, flat or behind child servers.

Usage::

    python tests/bench/bench_capacity_tree.py [--clients K] [--children C] [--seconds N]

Starts ``ferryman serve`` processes (memory backend): a root with one FAIR_SHARE template
(refresh_interval 2 s), then, for the tree, C children with ``--parent`` the root. K
simulated clients (1,000 by default) each refresh their lease as often as its
``refresh_interval`` says, for N seconds: first all against the root (flat), then spread
over the children (tree; each child hands its clients half the root's interval). Printed per
scenario: the GetCapacity / GetServerCapacity calls the root answered per second, the root's
CPU (its process's user + system time over the wall time), and the sum of the clients'
leases against the capacity. Client and servers share the machine's cores: compare runs on
one machine. This is a benchmark, not a test: pytest does not collect this directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc

RESOURCES = """
resources:
  - identifier_glob: "*"
    capacity: 1000
    algorithm: {kind: FAIR_SHARE, lease_length: 20, refresh_interval: 2,
                learning_mode_duration: 0}
"""


class Proc:
    """One ``ferryman serve`` on free ports."""

    def __init__(self, config: Path, log: Path, *args: str) -> None:
        env = dict(os.environ, DOORMAN_MINIMUM_REFRESH_INTERVAL="0", GRPC_HOST="127.0.0.1")
        command = [sys.executable, "-m", "ferryman", "serve", "--config", str(config)]
        command += ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0", *args]
        with log.open("w") as err:
            self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            match = re.search(r"grpc :(\d+), http :\d+, debug :(\d+)", log.read_text())
            if match:
                self.port, self.debug = int(match.group(1)), int(match.group(2))
                return
            time.sleep(0.05)
        self.proc.kill()
        raise SystemExit("ferryman serve did not start:\n" + log.read_text())

    def cpu(self) -> float:
        """User + system seconds the process has used."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def exchanges(self) -> int:
        """GetServerCapacity calls this child made to its parent."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.debug}/capacity") as page:
            status = json.load(page)
        return int(status["parent"]["exchanges"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def clients(ports: list[int], k: int, seconds: float) -> tuple[float, int]:
    """K clients refreshing at their lease's interval: the sum of their last leases, and
    the calls they made."""
    rng = random.Random(7)
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in ports]
    stubs = [doorman_pb2_grpc.CapacityStub(c) for c in channels]  # type: ignore[no-untyped-call]
    held = [0.0] * k
    calls = 0
    end = time.monotonic() + seconds

    async def client(i: int) -> None:
        stub = stubs[i % len(stubs)]
        wants = rng.uniform(0.5, 2.0)
        await asyncio.sleep(rng.uniform(0, 1))
        nonlocal calls
        while time.monotonic() < end:
            calls += 1
            request = doorman_pb2.GetCapacityRequest(client_id=f"c{i}")
            request.resource.add(resource_id="api", priority=0, wants=wants)
            reply = await stub.GetCapacity(request, timeout=10)
            gets = reply.response[0].gets
            held[i] = gets.capacity
            await asyncio.sleep(max(0.5, gets.refresh_interval))

    await asyncio.gather(*(client(i) for i in range(k)))
    for channel in channels:
        await channel.close(None)
    return sum(held), calls


def scenario(root: Proc, children: list[Proc], k: int, seconds: float) -> str:
    """The root's calls per second: the clients' own (flat), or its children's exchanges."""
    before = sum(c.exchanges() for c in children)
    cpu, began = root.cpu(), time.monotonic()
    ports = [c.port for c in children] or [root.port]
    leased, calls = asyncio.run(clients(ports, k, seconds))
    wall = time.monotonic() - began
    at_root = sum(c.exchanges() for c in children) - before if children else calls
    rate = at_root / wall
    share = (root.cpu() - cpu) / wall
    return f"root {rate:8.1f} calls/s  root CPU {share:6.1%}  leased {leased:7.1f} of 1000"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--children", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "config"
        config.mkdir()
        (config / "resources.yaml").write_text(RESOURCES)
        root = Proc(config, work / "root.log")
        children: list[Proc] = []
        try:
            print(f"{args.clients} clients, {args.seconds:.0f} s each")
            print("flat:", scenario(root, [], args.clients, args.seconds))
            address = f"127.0.0.1:{root.port}"
            children = [
                Proc(config, work / f"child{i}.log", "--parent", address)
                for i in range(args.children)
            ]
            tree = scenario(root, children, args.clients, args.seconds)
            print(f"tree ({args.children} children):", tree)
        finally:
            for proc in [*children, root]:
                proc.stop()


if __name__ == "__main__":
    main()
