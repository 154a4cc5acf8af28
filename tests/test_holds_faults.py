"""Held copies under real faults: killed clients, killed servers, and a concurrent stress run.

Everything here is a real process: each test starts its own redis-server and one or two
``python -m ferryman serve`` processes on it (with HOLD_LEASE_SECONDS=1), and the faults are
SIGKILLs. The counts are read straight from Redis: the node's counts hash is
``{<node>}:n`` with node = CACHE_KEY_PREFIX + "ferryman_copies_" + "jobs.tenant"
(``RateLimitEngine.copies_node``), and a server's contributions are ``{<node>}:c:<id>``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

import ferryman
from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.algorithms.copies import node_name

from helpers.redis_procs import RedisProcess
from helpers.server import limiter_stub, wait_for

LEASE = 1.0
PREFIX = "fx_"
NODE = f"{PREFIX}ferryman_copies_jobs.tenant"
TAG = "{" + NODE + "}"
COUNTS = f"{TAG}:n"
LEASES = f"{TAG}:srv"
DEAD = f"{TAG}:dead"

TENANT_LIMIT = 6
GLOBAL_LIMIT = 16
GROUP_LIMITS = {"odd": 10, "even": 12, "late": 7}
# t0: even; t1: odd; t2: even + late; t3: odd + late (two tenants in two groups each).
CONFIG = f"""
domain: jobs
descriptors:
  - key: tenant
    copies:
      limit: {TENANT_LIMIT}
      global_limit: {GLOBAL_LIMIT}
      groups:
        - {{name: odd, limit: {GROUP_LIMITS["odd"]}, members: [t1, t3]}}
        - {{name: even, limit: {GROUP_LIMITS["even"]}, members: [t0, t2]}}
        - {{name: late, limit: {GROUP_LIMITS["late"]}, members: [t2, t3]}}
"""
LIMITS = {
    "all": GLOBAL_LIMIT,
    **{f"d:t{i}": TENANT_LIMIT for i in range(4)},
    **{f"g:{name}": limit for name, limit in GROUP_LIMITS.items()},
}

# A client process: opens a Session on the server, reserves, says "held", and waits to die.
CLIENT = """
import queue, sys, time
import grpc
from ferryman._proto.ferryman.v1 import limiter_pb2 as pb, limiter_pb2_grpc

channel = grpc.insecure_channel(f"127.0.0.1:{int(sys.argv[1])}")
stub = limiter_pb2_grpc.LimiterStub(channel)
out = queue.Queue()
stream = stub.Session(iter(out.get, None))
out.put(pb.SessionRequest(open=pb.SessionRequest.Open(client_name="doomed")))
md = (("ferryman-session", next(stream).opened.session_id),)
for tenant, copies in (("t1", 3), ("t2", 2)):
    entry = pb.Entry(key="tenant", value=tenant)
    request = pb.ReserveRequest(domain="jobs", descriptor=[entry], copies=copies)
    reply = stub.Reserve(request, metadata=md, timeout=5)
    assert reply.granted == copies, reply
print("held", reply.global_held, flush=True)
time.sleep(600)
"""


def test_node_name_is_the_engines() -> None:
    """NODE, whose keys these tests read, is what RateLimitEngine.copies_node names."""
    from dataclasses import dataclass

    from ferryman.backends.memory import MemoryBackend
    from ferryman.clock import SystemClock
    from ferryman.config.loader import load_sources
    from ferryman.config.model import Config
    from ferryman.engine import EngineOptions, RateLimitEngine
    from ferryman.stats import Stats

    @dataclass
    class Source:
        config: Config | None

    clock = SystemClock()
    engine = RateLimitEngine(
        Source(load_sources([("jobs.yaml", CONFIG)])), MemoryBackend(clock), clock, Stats(),
        EngineOptions(cache_key_prefix=PREFIX),
    )  # fmt: skip
    rule = engine.resolve("jobs", [("tenant", "t1")], ("copies",), "copies")[-1]
    assert node_name(engine.options.cache_key_prefix, rule) == NODE


class Processes:
    """Every child process a test starts; all are killed at teardown, whatever happened."""

    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.tmp = tmp
        self.redis_url = redis_url
        self.procs: list[subprocess.Popen[Any]] = []
        self.servers: list[Ferryman] = []
        config = tmp / "config"
        config.mkdir(exist_ok=True)
        (config / "jobs.yaml").write_text(CONFIG)
        self.config = config
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        self.env.update(HOLD_LEASE_SECONDS=str(LEASE), CACHE_KEY_PREFIX=PREFIX)
        # No drain on SIGTERM: these tests do not test it, and would wait it out.
        self.env["FERRYMAN_SHUTDOWN_DRAIN"] = "0"

    def ferryman(self, name: str) -> Ferryman:
        """Start ``ferryman serve`` on the test's Redis; returns once it serves."""
        log = self.tmp / f"{name}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ferryman", "serve", "--config", str(self.config),
                 "--backend", self.redis_url, "--grpc-port", "0", "--http-port", "0",
                 "--debug-port", "0"],
                env=self.env, stdout=subprocess.DEVNULL, stderr=sink,
            )  # fmt: skip
        self.procs.append(proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            match = re.search(r"ferryman serving: grpc :(\d+)", log.read_text())
            if match:
                self.servers.append(Ferryman(name, proc, int(match.group(1))))
                return self.servers[-1]
            time.sleep(0.02)
        raise AssertionError(f"ferryman {name} did not start:\n{log.read_text()}")

    def client(self, port: int) -> subprocess.Popen[str]:
        """Start the client script against a server's gRPC port."""
        script = self.tmp / "client.py"
        script.write_text(CLIENT)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(port)],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for server in self.servers:
            server.channel.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


class Ferryman:
    """A ``ferryman serve`` process and a channel to its gRPC port."""

    def __init__(self, name: str, proc: subprocess.Popen[Any], port: int) -> None:
        self.name = name
        self.proc = proc
        self.port = port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


class Holder:
    """A client with an open Session stream on one server (the sync stub, as in test_holds)."""

    def __init__(self, channel: grpc.Channel, name: str = "test") -> None:
        self.stub = limiter_stub(channel)
        self._out: queue.Queue[limiter_pb2.SessionRequest | None] = queue.Queue()
        self._stream = self.stub.Session(iter(self._out.get, None))
        self._out.put(
            limiter_pb2.SessionRequest(open=limiter_pb2.SessionRequest.Open(client_name=name))
        )
        self.session_id = next(self._stream).opened.session_id
        assert self.session_id
        self.md = (("ferryman-session", self.session_id),)

    @staticmethod
    def _entries(tenant: str) -> list[limiter_pb2.Entry]:
        return [limiter_pb2.Entry(key="tenant", value=tenant)]

    def reserve(self, tenant: str, copies: int, min_copies: int | None = None) -> Any:
        request = limiter_pb2.ReserveRequest(
            domain="jobs", descriptor=self._entries(tenant), copies=copies
        )
        if min_copies is not None:
            request.min_copies = min_copies
        return self.stub.Reserve(request, metadata=self.md, timeout=5)

    def release(self, tenant: str, copies: int, groups: Any) -> None:
        request = limiter_pb2.ReleaseRequest(
            domain="jobs", descriptor=self._entries(tenant), copies=copies, groups=list(groups)
        )
        self.stub.Release(request, metadata=self.md, timeout=5)

    def transfer(self, tenant: str, copies: int, groups: Any, ttl: float) -> str:
        request = limiter_pb2.TransferRequest(
            domain="jobs", descriptor=self._entries(tenant), copies=copies, groups=list(groups)
        )
        request.ttl.FromMilliseconds(int(ttl * 1000))
        return str(self.stub.Transfer(request, metadata=self.md, timeout=5).transfer_id)

    def seize(self, transfer_id: str) -> Any:
        request = limiter_pb2.SeizeRequest(transfer_id=transfer_id)
        return self.stub.Seize(request, metadata=self.md, timeout=5)

    def close(self) -> list[Any]:
        """End the stream (half-close) and read it to its end; the events after `opened`."""
        self._out.put(None)
        return list(self._stream)

    def cancel(self) -> None:
        """Cancel the stream, as a client that goes away without closing it."""
        self._stream.cancel()
        self._out.put(None)

    def abandon(self) -> None:
        """Drop a stream whose server is gone."""
        self._out.put(None)
        with contextlib.suppress(grpc.RpcError):
            for _ in self._stream:
                pass


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own."""
    server = RedisProcess(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def procs(tmp_path: Path, store: RedisProcess) -> Iterator[Processes]:
    """Start ferryman servers and clients; kills every one of them at teardown."""
    started = Processes(tmp_path, store.url)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def db(store: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the test's Redis, decoding strings."""
    client = redis.Redis(port=store.port, socket_timeout=5, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def _counts(db: redis.Redis) -> dict[str, int]:
    return {str(k): int(v) for k, v in db.hgetall(COUNTS).items()}


def _leftovers(db: redis.Redis) -> list[str]:
    """Contribution hashes, staged transfers and Envoy holds still in Redis."""
    keys = [k for k in db.keys(f"{TAG}:*") if k not in (COUNTS, LEASES, DEAD)]
    return sorted(str(k) for k in keys if db.type(k) != "zset" or db.zcard(k) > 0)


def test_killed_client_process_copies_come_back(procs: Processes, db: redis.Redis) -> None:
    """A client process SIGKILLed while holding copies: its server releases them at once."""
    a = procs.ferryman("a")
    client = procs.client(a.port)
    assert client.stdout is not None
    ready, _, _ = select.select([client.stdout], [], [], 15)
    line = client.stdout.readline() if ready else ""
    assert line.split() == ["held", "5"], line + (client.stderr.read() if client.stderr else "")
    # The key names are the server's: the hash shows exactly what the client holds.
    assert _counts(db) == {"d:t1": 3, "d:t2": 2, "all": 5, "g:odd": 3, "g:even": 2, "g:late": 2}
    observer = Holder(a.channel, "observer")
    seen = observer.reserve("t1", 1)
    assert (seen.granted, seen.tenant_held, seen.global_held) == (1, 4, 6)
    observer.release("t1", 1, [g.name for g in seen.groups])

    client.send_signal(signal.SIGKILL)
    client.wait(10)
    killed = time.monotonic()

    def back() -> bool:
        reply = observer.reserve("t2", 1)
        groups = [g.name for g in reply.groups]
        observer.release("t2", 1, groups)
        held = {g.name: g.held for g in reply.groups}
        return bool(
            reply.granted == 1 and reply.tenant_held == 1 and reply.global_held == 1
            and held == {"even": 1, "late": 1}
        )  # fmt: skip

    wait_for("the killed client's copies", back, timeout=5, interval=0.05)
    took = time.monotonic() - killed
    print(f"killed client: copies back after {took:.3f}s")
    assert took < 3
    assert observer.close() == []
    wait_for("empty counts", lambda: not _counts(db), timeout=3)
    assert _leftovers(db) == []


def test_a_frozen_server_ends_the_clients_session_after_the_keepalive(procs: Processes) -> None:
    """SIGSTOP the server: its host still acknowledges TCP, but nothing answers HTTP/2 pings,
    as when a host dies silently. The client's keepalive closes the connection: the session
    is lost and the hold says so, rather than being believed held."""
    a = procs.ferryman("a")
    client = ferryman.Client(f"127.0.0.1:{a.port}", timeout=2, keepalive=1)
    try:
        with client.hold_copy("jobs", {"tenant": "t1"}, copies=2) as hold:
            assert hold.success and hold.copies == 2 and not hold.lost
            a.proc.send_signal(signal.SIGSTOP)
            try:
                wait_for("the lost session", lambda: client.stats().sessions_lost == 1, 20)
            finally:
                a.proc.send_signal(signal.SIGCONT)
            assert hold.lost
    finally:
        client.close()


def test_killed_server_copies_are_freed_by_the_other_after_the_lease(
    procs: Processes, db: redis.Redis
) -> None:
    """Server A SIGKILLed while its clients hold copies: B frees them once A's lease lapsed."""
    a, b = procs.ferryman("a"), procs.ferryman("b")
    h1, h2 = Holder(a.channel, "h1"), Holder(a.channel, "h2")
    assert h1.reserve("t1", 3).granted == 3
    assert h2.reserve("t2", 2).granted == 2
    observer = Holder(b.channel, "observer")
    contributions = db.keys(f"{TAG}:c:*")
    assert len(contributions) == 1  # A's; B holds nothing yet
    a_id = str(contributions[0]).rsplit(":", 1)[1]

    a.kill()
    killed, killed_wall = time.monotonic(), time.time()
    # A renewed its lease every lease/3 s up to the kill, so most of it is still to run.
    expiry_ms = int(db.hget(LEASES, a_id) or 0)
    assert expiry_ms / 1000 - killed_wall > LEASE / 3, (expiry_ms, killed_wall)

    def observe() -> tuple[int, float]:
        reply = observer.reserve("t0", 1)
        answered = time.time() * 1000
        assert reply.granted == 1, reply
        observer.release("t0", 1, [g.name for g in reply.groups])
        return int(reply.global_held), answered

    # Right after the kill A's copies still count: its lease has not lapsed.
    held, answered = observe()
    assert answered < expiry_ms
    assert held == 6
    while True:
        held, answered = observe()
        if held == 1:
            break
        assert held == 6
        assert time.monotonic() - killed < LEASE + 2, "A's copies were never freed"
        time.sleep(0.05)
    took = time.monotonic() - killed
    print(f"killed server: copies freed {took:.3f}s after the kill (lease {LEASE}s)")
    # Not before A's lease could have lapsed, and soon after it did.
    assert answered >= expiry_ms - 2, (answered, expiry_ms)
    assert answered - expiry_ms < 1000
    assert took < LEASE + 1.5
    assert db.zscore(DEAD, a_id) is not None
    assert not db.exists(f"{TAG}:c:{a_id}")
    assert not db.hexists(LEASES, a_id)
    assert observer.close() == []
    h1.abandon()
    h2.abandon()
    wait_for("empty counts", lambda: not _counts(db), timeout=3)
    assert _leftovers(db) == []
    assert b.proc.poll() is None


class Stress:
    """Shared state of the stress run: what went wrong, counts of what was done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.done: dict[str, int] = {}
        # Transfer ids waiting for a session on the named server to seize them.
        self.staged: dict[str, queue.Queue[str]] = {"a": queue.Queue(), "b": queue.Queue()}

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.done[what] = self.done.get(what, 0) + n

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)


def _check_reply(stress: Stress, tenant: str, copies: int, least: int, reply: Any) -> None:
    """No count above its limit; the grant within [min_copies, copies] or 0."""
    problems = []
    if not (reply.granted == 0 or least <= reply.granted <= copies):
        problems.append(f"granted {reply.granted} outside [{least}, {copies}]")
    if reply.limit != TENANT_LIMIT or reply.tenant_held > TENANT_LIMIT:
        problems.append(f"tenant {reply.tenant_held}/{reply.limit}")
    if reply.global_limit != GLOBAL_LIMIT or reply.global_held > GLOBAL_LIMIT:
        problems.append(f"global {reply.global_held}/{reply.global_limit}")
    for group in reply.groups:
        if group.limit != GROUP_LIMITS[group.name] or group.held > group.limit:
            problems.append(f"group {group.name} {group.held}/{group.limit}")
    if problems:
        stress.violation(f"reserve {tenant} {copies} (min {least}): {', '.join(problems)}")


def _worker(stress: Stress, server: Ferryman, other: str, seed: int, until: float) -> None:
    """Reserve, release, transfer, seize and drop sessions at random until ``until``."""
    rng = random.Random(seed)
    holder = Holder(server.channel, f"worker-{seed}")
    holds: dict[tuple[str, tuple[str, ...]], int] = {}
    try:
        while time.monotonic() < until:
            roll = rng.random()
            staged = None
            if roll < 0.15:  # whether or not this session holds anything
                with contextlib.suppress(queue.Empty):
                    staged = stress.staged[server.name].get_nowait()
            if staged is not None:
                seized = holder.seize(staged)
                key = (seized.descriptor[0].value, tuple(seized.groups))
                holds[key] = holds.get(key, 0) + seized.copies
                stress.count("seized")
            elif roll < 0.5 or not holds:
                tenant = f"t{rng.randrange(4)}"
                copies = rng.randint(1, 3)
                least = rng.randint(1, copies)
                reply = holder.reserve(tenant, copies, least)
                _check_reply(stress, tenant, copies, least, reply)
                if reply.granted:
                    key = (tenant, tuple(g.name for g in reply.groups))
                    holds[key] = holds.get(key, 0) + reply.granted
                stress.count("reserve_granted" if reply.granted else "reserve_rejected")
                if not reply.granted:
                    time.sleep(rng.uniform(0, 0.01))  # back off: let the holders release
            elif roll < 0.8:
                key = rng.choice(sorted(holds))
                n = rng.randint(1, holds[key])
                holder.release(key[0], n, key[1])
                holds[key] -= n
                if not holds[key]:
                    del holds[key]
                stress.count("released")
            elif roll < 0.9:
                key = rng.choice(sorted(holds))
                n = rng.randint(1, holds[key])
                stress.staged[other].put(holder.transfer(key[0], n, key[1], ttl=60))
                holds[key] -= n
                if not holds[key]:
                    del holds[key]
                stress.count("transferred")
            else:
                # Drop the session while it holds copies, cleanly or by cancelling the
                # stream (RST_STREAM); the server must release them either way.
                if rng.random() < 0.5:
                    holder.cancel()
                    stress.count("sessions_cancelled_holding")
                elif holder.close():
                    stress.violation("a session got events besides opened")
                holds.clear()
                holder = Holder(server.channel, f"worker-{seed}")
                stress.count("sessions_dropped_holding")
    except Exception:
        with stress.lock:
            stress.errors.append(traceback.format_exc())
    finally:
        with contextlib.suppress(grpc.RpcError):
            holder.close()


def _monitor(stress: Stress, db: redis.Redis, stop: threading.Event) -> None:
    """Read the counts hash over and over: never a count above its limit."""
    try:
        while not stop.is_set():
            for name, value in _counts(db).items():
                stress.count("monitor_nonempty")
                if not 0 < value <= LIMITS[name]:
                    stress.violation(f"redis {name} = {value}")
            time.sleep(0.005)
    except Exception:
        with stress.lock:
            stress.errors.append(traceback.format_exc())


def test_stress_random_holds_across_two_servers_end_at_zero(
    procs: Processes, db: redis.Redis
) -> None:
    """16 sessions on two servers hold at random; no count ever over; all zero at the end."""
    servers = {"a": procs.ferryman("a"), "b": procs.ferryman("b")}
    stress = Stress()
    stop = threading.Event()
    monitor = threading.Thread(target=_monitor, args=(stress, db, stop), daemon=True)
    monitor.start()
    until = time.monotonic() + 4
    workers = [
        threading.Thread(
            target=_worker,
            args=(stress, servers["ab"[seed % 2]], "ba"[seed % 2], seed, until),
            daemon=True,
        )
        for seed in range(16)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert not any(w.is_alive() for w in workers)
    # Transfers staged but not seized by the end: seize them now, exactly once each.
    for name, server in servers.items():
        drain = Holder(server.channel, "drain")
        while True:
            try:
                transfer_id = stress.staged[name].get_nowait()
            except queue.Empty:
                break
            drain.seize(transfer_id)
            stress.count("seized_at_end")
        assert drain.close() == []
    try:
        wait_for("every count at zero", lambda: not _counts(db), timeout=5)
    finally:
        stop.set()
        monitor.join(5)
    print(f"stress: {stress.done}")
    assert stress.errors == [], stress.errors[0]
    assert stress.violations == [], stress.violations[:10]
    assert _counts(db) == {}
    assert _leftovers(db) == []
    assert not db.exists(DEAD)  # no server ever lost its lease
    done = stress.done
    assert done.get("reserve_granted", 0) > 100
    assert done.get("reserve_rejected", 0) > 0  # the limits were reached
    assert done.get("seized", 0) > 0
    assert done.get("sessions_dropped_holding", 0) > 0
    assert done.get("sessions_cancelled_holding", 0) > 0
    assert done.get("monitor_nonempty", 0) > 0
    assert all(s.proc.poll() is None for s in servers.values())


# Calls racing their own session. Both tests fail today (see the reasons); they pass once
# HoldManager serializes a session's calls with its close (e.g. a per-session asyncio.Lock
# around check -> backend call -> hold update, taken by close() before it snapshots).
def test_calls_in_flight_when_the_session_ends_leak_nothing(
    procs: Processes, db: redis.Redis
) -> None:
    """Reserve/Release in flight while the client closes its stream: all copies come back."""
    a = procs.ferryman("a")
    rng = random.Random(7)
    for attempt in range(40):
        holder = Holder(a.channel, "racer")
        ended: list[str] = []

        def hammer(h: Holder = holder, out: list[str] = ended) -> None:
            try:
                groups = [g.name for g in h.reserve("t0", 2).groups]
                while True:
                    h.release("t0", 1, groups)
                    h.reserve("t0", 1)
            except grpc.RpcError as exc:
                out.append(f"{exc.code()}: {exc.details()}")

        thread = threading.Thread(target=hammer, daemon=True)
        thread.start()
        time.sleep(rng.uniform(0.002, 0.02))
        with contextlib.suppress(grpc.RpcError):
            holder.close()
        thread.join(10)
        with contextlib.suppress(AssertionError):
            wait_for("every count at zero", lambda: not _counts(db), timeout=2)
        assert _counts(db) == {}, f"attempt {attempt}: leaked {_counts(db)} ({ended})"


def test_concurrent_releases_cannot_free_more_than_the_session_holds(
    procs: Processes, db: redis.Redis
) -> None:
    """Two Releases of 2 at once by a session holding 3: one is refused; nothing leaks."""
    a = procs.ferryman("a")
    for attempt in range(20):
        x, y = Holder(a.channel, "x"), Holder(a.channel, "y")
        groups = [g.name for g in x.reserve("t0", 3).groups]
        assert y.reserve("t0", 3).granted == 3
        request = limiter_pb2.ReleaseRequest(
            domain="jobs", descriptor=Holder._entries("t0"), copies=2, groups=groups
        )
        calls = [x.stub.Release.future(request, metadata=x.md, timeout=5) for _ in range(2)]
        refused = [c for c in calls if c.exception() is not None]
        assert len(refused) == 1, f"attempt {attempt}: session x released 4 of its 3 copies"
        assert x.close() == []
        assert y.close() == []
        with contextlib.suppress(AssertionError):
            wait_for("every count at zero", lambda: not _counts(db), timeout=2)
        assert _counts(db) == {}, f"attempt {attempt}: leaked {_counts(db)}"
