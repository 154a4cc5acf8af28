"""Real ``ferryman serve`` processes and Doorman clients for the capacity lease tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc

RESOURCES = """
resources:
  - identifier_glob: fair*
    capacity: {capacity}
    description: a capacity shared fairly
    algorithm:
      kind: FAIR_SHARE
      lease_length: {lease}
      refresh_interval: 1
      learning_mode_duration: {learning}
  - identifier_glob: prop*
    capacity: {capacity}
    algorithm: {{kind: PROPORTIONAL_SHARE, lease_length: {lease}, refresh_interval: 1,
                learning_mode_duration: {learning}}}
"""


def resources_yaml(capacity: float = 120, lease: int = 3, learning: int = 0) -> str:
    return RESOURCES.format(capacity=capacity, lease=lease, learning=learning)


class Ferryman:
    """A ``python -m ferryman serve`` process on free ports; stderr goes to a file."""

    def __init__(
        self,
        workdir: Path,
        config: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "stderr.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        # On loopback the advertised address is 127.0.0.1:<grpc port>, what clients dial.
        full_env.update(
            {"DOORMAN_MINIMUM_REFRESH_INTERVAL": "0", "LOG_LEVEL": "info", "GRPC_HOST": "127.0.0.1"}
        )
        # No drain on SIGTERM unless ``env`` gives one: a stop would wait it out.
        full_env["FERRYMAN_SHUTDOWN_DRAIN"] = "0"
        full_env.update(env or {})
        command = [sys.executable, "-m", "ferryman", "serve", "--config", str(config)]
        command += ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0", *args]
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                command, env=full_env, stdout=subprocess.DEVNULL, stderr=err
            )
        deadline = time.monotonic() + 30
        while True:
            match = re.search(r"grpc :(\d+), http :\d+, debug :(\d+)", self.log.read_text())
            if match:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError("ferryman serve did not start:\n" + self.log.read_text())
            time.sleep(0.05)
        self.grpc_port, self.debug_port = int(match.group(1)), int(match.group(2))
        self.address = f"127.0.0.1:{self.grpc_port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = doorman_pb2_grpc.CapacityStub(self.channel)  # type: ignore[no-untyped-call]

    def capacity_page(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.debug_port}/capacity"
        with urllib.request.urlopen(url, timeout=5) as response:
            page: dict[str, Any] = json.load(response)
        return page

    def status_page(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.debug_port}/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            page: dict[str, Any] = json.load(response)
        return page

    def is_master(self) -> bool:
        reply = self.stub.Discovery(doorman_pb2.DiscoveryRequest(), timeout=5)
        return bool(reply.is_master)

    def sum_leases(self, resource_id: str) -> float:
        for resource in self.capacity_page()["resources"]:
            if resource["resource_id"] == resource_id:
                return float(resource["sum_leases"])
        return 0.0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if hasattr(self, "channel"):
            self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class LeaseClient:
    """A Doorman client: asks for resources and follows ``mastership`` to the master."""

    def __init__(self, client_id: str, addresses: Sequence[str]) -> None:
        self.client_id = client_id
        self.addresses = list(addresses)
        self.target = self.addresses[0]
        self.leases: dict[str, doorman_pb2.Lease] = {}
        self.safe: dict[str, float] = {}
        self._channels: dict[str, grpc.Channel] = {}

    def _stub(self, target: str) -> doorman_pb2_grpc.CapacityStub:
        if target not in self._channels:
            self._channels[target] = grpc.insecure_channel(target)
        return doorman_pb2_grpc.CapacityStub(self._channels[target])  # type: ignore[no-untyped-call]

    def ask(self, wants: Mapping[str, float], priority: int = 0) -> dict[str, float]:
        """One refresh of every resource in ``wants``: their capacities (empty: no master)."""
        request = doorman_pb2.GetCapacityRequest(client_id=self.client_id)
        for resource_id, amount in wants.items():
            item = request.resource.add(resource_id=resource_id, priority=priority, wants=amount)
            if resource_id in self.leases:
                item.has.CopyFrom(self.leases[resource_id])
        for _ in range(2 * len(self.addresses) + 1):
            try:
                reply = self._stub(self.target).GetCapacity(request, timeout=5)
            except grpc.RpcError:
                self._next_address()
                continue
            if reply.response or not reply.HasField("mastership"):
                break
            master = reply.mastership.master_address
            if master:
                self.target = master
            else:
                self._next_address()
        else:
            return {}
        for item in reply.response:
            self.leases[item.resource_id] = item.gets
            self.safe[item.resource_id] = item.safe_capacity
        return {item.resource_id: item.gets.capacity for item in reply.response}

    def _next_address(self) -> None:
        i = self.addresses.index(self.target) if self.target in self.addresses else -1
        self.target = self.addresses[(i + 1) % len(self.addresses)]

    def release(self, *resource_ids: str) -> None:
        request = doorman_pb2.ReleaseCapacityRequest(
            client_id=self.client_id, resource_id=list(resource_ids)
        )
        self._stub(self.target).ReleaseCapacity(request, timeout=5)
        for resource_id in resource_ids:
            self.leases.pop(resource_id, None)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


class Fleet:
    """The servers and clients of one test, all stopped at its end."""

    def __init__(self, workdir: Path, config: Path) -> None:
        self.workdir = workdir
        self.config = config
        self.servers: list[Ferryman] = []
        self.clients: list[LeaseClient] = []

    def server(self, *args: str, env: Mapping[str, str] | None = None) -> Ferryman:
        name = f"server{len(self.servers)}"
        server = Ferryman(self.workdir / name, self.config, *args, env=env)
        self.servers.append(server)
        return server

    def client(self, client_id: str, *servers: Ferryman) -> LeaseClient:
        client = LeaseClient(client_id, [s.address for s in servers])
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.stop()
