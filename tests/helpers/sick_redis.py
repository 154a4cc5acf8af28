"""Faults of a real redis-server under steady load, for the fault tests and the fault report
(tests/bench/bench_faults.py): a TCP proxy that can black-hole, refuse, close or slow the
connection; a ferryman Service on its own event loop (asyncio debug mode on); a load of
ShouldRateLimit calls at a steady rate, each with a client deadline; and one scenario per
fault that measures what the issue asks for."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import SystemClock
from ferryman.connections.redis import RedisConnection
from ferryman.server.app import Service
from ferryman.settings import Settings

from helpers.ports import free_port
from helpers.redis_procs import RedisCluster, RedisProcess
from helpers.server import rls_stub

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

CONFIG = """
domain: sick
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
"""

# Messages in a server's log that mean an exception or a coroutine was lost.
LOST = ("Task exception was never retrieved", "was never awaited")


class Proxy:
    """A TCP proxy to ``port`` on its own event loop, with a mode set at any time:

    - ``pass``: bytes flow both ways;
    - ``blackhole``: bytes are held (both ways) and delivered when the mode changes back,
      as TCP delivers after a network partition heals;
    - ``refuse``: the listening socket is closed (connects are refused) and every open
      connection is closed once the replies on their way have arrived;
    - ``close``: the same for open connections, and new ones are accepted and closed at
      once;
    - ``slow``: each chunk, either way, is delayed by ``delay`` seconds.
    """

    def __init__(self, target_port: int, delay: float = 0.1) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.delay = delay
        self.mode = "pass"
        self.accepted = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._released = asyncio.Event()
        self._call(self._listen())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "close":
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._links.update((writer, up_w))
        await asyncio.gather(self._pump(reader, up_w, True), self._pump(up_r, writer, False))
        for w in (writer, up_w):
            self._links.discard(w)
            w.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: bool
    ) -> None:
        # Chunks leave in the order they came, each at its own time: in ``slow`` mode
        # ``delay`` after it came (latency, not a narrower pipe), otherwise at once but never
        # before a delayed chunk ahead of it (TCP keeps order, whatever the mode changes).
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(_send(due, writer))
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(65536)
                if not data or (upstream and self.mode in ("refuse", "close")):
                    return
                while self.mode == "blackhole":
                    await self._released.wait()
                delay = self.delay if self.mode == "slow" else 0.0
                due.put_nowait((loop.time() + delay, data))
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            sender.cancel()
            writer.transport.abort()

    async def _set(self, mode: str) -> None:
        was, self.mode = self.mode, mode
        if was == "blackhole":
            self._released.set()
            self._released = asyncio.Event()
        if mode in ("refuse", "close"):
            # Commands stop at once; replies already on their way get a moment to arrive,
            # as when Redis itself closes (see the README for a cut in mid-reply).
            await asyncio.sleep(0.05)
            for w in list(self._links):
                w.transport.abort()
        if mode == "refuse" and self._server is not None:
            self._server.close()
            self._server = None
        if was == "refuse" and mode != "refuse":
            await self._listen()

    def set(self, mode: str) -> None:
        self._call(self._set(mode))

    def stop(self) -> None:
        async def end() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._links):
                w.transport.abort()

        self._call(end())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


async def _send(due: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
    """Writes each queued chunk, in order, once its time has come."""
    loop = asyncio.get_running_loop()
    while True:
        when, data = await due.get()
        wait = when - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if writer.transport.is_closing():
            return
        writer.write(data)
        await writer.drain()


class LogTrap(logging.Handler):
    """Keeps the records of the ferryman and asyncio loggers."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._loggers = [logging.getLogger("ferryman"), logging.getLogger("asyncio")]

    def __enter__(self) -> LogTrap:
        for logger in self._loggers:
            logger.addHandler(self)
            if logger.level == logging.NOTSET or logger.level > logging.INFO:
                logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        for logger in self._loggers:
            logger.removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, name: str) -> list[str]:
        return [
            r.getMessage()
            for r in self.records
            if r.name.startswith(name) and r.levelno >= logging.INFO
        ]


class DebugServer:
    """A ferryman Service on its own event loop (in asyncio debug mode with ``debug``); the
    loop's exception handler keeps every message it is given (lost task exceptions among
    them)."""

    def __init__(
        self, config_dir: Path, backend: RedisBackend, debug: bool = False, **overrides: Any
    ) -> None:
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "sick.yaml").write_text(CONFIG)
        settings = Settings(
            host="127.0.0.1",
            port=0,
            grpc_host="127.0.0.1",
            grpc_port=0,
            debug_host="127.0.0.1",
            debug_port=0,
            config_dir=config_dir,
        ).with_overrides(**overrides)
        self.loop = asyncio.new_event_loop()
        # Debug mode reports where a lost coroutine or task came from, but records a stack
        # for every callback: far too slow for the timing runs.
        self.loop.set_debug(debug)
        self.loop.slow_callback_duration = 10.0  # report lost work, not slowness
        self.problems: list[str] = []
        self.loop.set_exception_handler(self._handle)
        self.backend = backend
        self.service = Service(settings, clock=SystemClock(), backend=backend)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.run(self.service.start())
        self.target = f"127.0.0.1:{self.service.grpc_port}"
        self.channel = grpc.insecure_channel(self.target)
        self.stub = rls_stub(self.channel)

    def _handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.problems.append(str(context.get("message", "")))
        loop.default_exception_handler(context)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.channel.close()
        self.run(self.service.stop(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class Outcome:
    started: float
    ended: float
    code: grpc.StatusCode
    value: str


class Load:
    """ShouldRateLimit for ``sick``/``k=<value>`` at ``rate`` calls per second, each with
    ``deadline`` seconds, from a process of its own (so that the load and the server do not
    share a GIL); ``value`` may be changed while it runs."""

    def __init__(self, target: str, rate: float, deadline: float) -> None:
        self.deadline = deadline
        self.outcomes: list[Outcome] = []
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=_load, args=(child, target, rate, deadline), daemon=True
        )

    def __enter__(self) -> Load:
        self._process.start()
        if not self._pipe.poll(60) or self._pipe.recv() != "ready":
            raise RuntimeError("the load process did not start")
        return self

    @property
    def value(self) -> str:
        raise AttributeError("write-only")

    @value.setter
    def value(self, value: str) -> None:
        self._pipe.send(("value", value))

    def __exit__(self, *exc: object) -> None:
        self._pipe.send(("stop", ""))
        if not self._pipe.poll(self.deadline + 30):
            self._process.kill()
            raise RuntimeError("the load process did not report")
        self.outcomes = [
            Outcome(started, ended, grpc.StatusCode[code], value)
            for started, ended, code, value in self._pipe.recv()
        ]
        self._process.join(10)


def _load(pipe: Connection, target: str, rate: float, deadline: float) -> None:
    """The load process: calls until told to stop, then the outcomes back up the pipe."""
    channel = grpc.insecure_channel(target)
    stub = rls_stub(channel)
    lock = threading.Lock()
    outcomes: list[tuple[float, float, str, str]] = []
    pending = [0]

    def done(started: float, value: str) -> Callable[[Any], None]:
        def record(future: Any) -> None:
            code = future.code()
            with lock:
                outcomes.append((started, time.monotonic(), code.name, value))
                pending[0] -= 1

        return record

    value = "a"
    step = 1.0 / rate
    pipe.send("ready")
    due = time.monotonic()
    while True:
        if pipe.poll():
            what, arg = pipe.recv()
            if what == "stop":
                break
            value = arg
        request = rls_pb2.RateLimitRequest(
            domain="sick",
            descriptors=[
                ratelimit_pb2.RateLimitDescriptor(
                    entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="k", value=value)]
                )
            ],
        )
        with lock:
            pending[0] += 1
        started = time.monotonic()
        future = stub.ShouldRateLimit.future(request, timeout=deadline)
        future.add_done_callback(done(started, value))
        due += step
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    end = time.monotonic() + deadline + 5
    while pending[0] and time.monotonic() < end:
        time.sleep(0.01)
    with lock:
        pipe.send(list(outcomes))
    channel.close()


@dataclass
class Report:
    """What one fault run measured."""

    fault: str
    seconds: float
    calls: int = 0
    answered_in_time: float = 0.0  # share of calls answered before the client's deadline
    policy_ok: bool = True  # every answer during the fault was OK or the policy's
    hits_exact: bool = True  # hits in Redis == calls answered OK, per descriptor value
    # value: (hits in redis, calls answered OK, calls the client gave up on)
    counted: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    connects_per_second: float = 0.0  # connection attempts while the fault lasted
    recovery: float | None = None  # fault end -> first OK answer (seconds)
    late_scripts: int = 0
    refused_calls: int = 0
    transitions: list[str] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # lost task exceptions and coroutines
    codes: dict[str, int] = field(default_factory=dict)


FAULTS = ("sigstop", "blackhole", "refuse", "close", "slow", "kill")


def _heap_set_aside(run: Callable[P, R]) -> Callable[P, R]:
    """``run`` with the test session's heap set aside (``gc.freeze``): the server runs in
    this process, beside everything the session has built up, and a full collection of that
    heap can stall its loop past callers' deadlines, which a ferryman process would not see."""

    @functools.wraps(run)
    def frozen(*args: P.args, **kwargs: P.kwargs) -> R:
        gc.collect()
        gc.freeze()
        try:
            return run(*args, **kwargs)
        finally:
            gc.unfreeze()

    return frozen


@_heap_set_aside
def run_fault(
    fault: str,
    workdir: Path,
    *,
    seconds: float = 1.5,
    rate: float = 100.0,
    deadline: float = 0.3,
    redis_timeout: float = 1.0,
    fail_open: bool = False,
    slow_delay: float = 0.05,
    settle: float = 2.0,
    debug: bool = False,
) -> Report:
    """Steady load for a second, ``fault`` for ``seconds``, then load for ``settle`` more
    seconds of recovery; measured as a Report."""
    proc = RedisProcess(workdir / "redis").start()
    proxy = Proxy(proc.port, slow_delay)
    backend = RedisBackend(
        parse_backend_url(f"redis://127.0.0.1:{proxy.port}", timeout=redis_timeout)
    )
    connection = backend.connection
    report = Report(fault, seconds)
    server: DebugServer | None = None
    try:
        with LogTrap() as trap:
            server = DebugServer(workdir / "config", backend, debug, fail_open=fail_open)
            _wait(lambda: connection.state == "up", 5)
            with Load(server.target, rate, deadline) as load:
                time.sleep(1.0)
                connects = connection.connects
                began = time.monotonic()
                _start(fault, proc, proxy)
                fault_in_place = time.monotonic()
                time.sleep(seconds)
                report.connects_per_second = (connection.connects - connects) / seconds
                if fault == "kill":
                    load.value = "b"  # the counters of "a" went with the killed Redis
                _end(fault, proc, proxy)
                ended = time.monotonic()
                time.sleep(settle)
            time.sleep(0.5)  # late scripts reach Redis and are refused there
            lines = trap.lines("ferryman.redis")
            report.lost = [
                r.getMessage() for r in trap.records if any(m in r.getMessage() for m in LOST)
            ]
        report.lost += [p for p in server.problems if any(m in p for m in LOST)]
        outcomes = load.outcomes
        _summarize(report, outcomes, fail_open, ended)
        with proc.client() as client:
            prefix = "sick_k_"
            for value in sorted({o.value for o in outcomes}):
                if fault == "kill" and value == "a":
                    continue
                stored = sum(int(client.get(key) or 0) for key in client.keys(f"{prefix}{value}_*"))
                ok = sum(o.code is grpc.StatusCode.OK and o.value == value for o in outcomes)
                missed = sum(
                    o.value == value
                    and o.code is not grpc.StatusCode.OK
                    and (
                        o.code is grpc.StatusCode.DEADLINE_EXCEEDED
                        or (o.started <= fault_in_place and o.ended >= began)
                    )
                    for o in outcomes
                )
                report.counted[value] = (stored, ok, missed)
        # Exact for every answer the client saw; a call the client gave up on may have
        # been answered OK too late to be seen (counted, rightly, by the server), and a call
        # in flight as the fault began may have reached Redis before it, its reply lost to
        # it: counted by Redis, answered with the failure policy. Such an outcome is
        # undecidable in any partition, so neither kind is held against the count.
        if fail_open:
            # Fail-open answers OK without counting: Redis holds at most the OK answers.
            report.hits_exact = all(s <= ok + m for s, ok, m in report.counted.values())
        else:
            report.hits_exact = all(ok <= s <= ok + m for s, ok, m in report.counted.values())
        _connection_figures(report, connection)
        report.log_lines = lines
    finally:
        if server is not None:
            server.stop()
        proxy.stop()
        if proc.proc is not None:
            with contextlib.suppress(OSError):
                os.kill(proc.proc.pid, signal.SIGCONT)
        proc.stop()
    return report


def _summarize(report: Report, outcomes: list[Outcome], fail_open: bool, ended: float) -> None:
    """Codes, the share answered in time, the policy, and recovery after ``ended``."""
    report.calls = len(outcomes)
    report.codes = {}
    for o in outcomes:
        report.codes[o.code.name] = report.codes.get(o.code.name, 0) + 1
    in_time = [o for o in outcomes if o.code is not grpc.StatusCode.DEADLINE_EXCEEDED]
    report.answered_in_time = len(in_time) / max(1, len(outcomes))
    policy = grpc.StatusCode.OK if fail_open else grpc.StatusCode.UNAVAILABLE
    report.policy_ok = all(
        o.code in (grpc.StatusCode.OK, policy, grpc.StatusCode.DEADLINE_EXCEEDED) for o in outcomes
    )
    if fail_open:
        report.policy_ok = report.policy_ok and all(o.code is grpc.StatusCode.OK for o in in_time)
    recovered = [o.ended for o in outcomes if o.started >= ended and o.code is grpc.StatusCode.OK]
    report.recovery = min(recovered) - ended if recovered else None


def _connection_figures(report: Report, connection: RedisConnection) -> None:
    report.late_scripts = connection.late
    report.refused_calls = connection.refused
    report.transitions = [
        f"{state} ({kind}) x{n}" for (state, kind), n in sorted(connection.transitions.items())
    ]


def _start(fault: str, proc: RedisProcess, proxy: Proxy) -> None:
    assert proc.proc is not None
    if fault == "sigstop":
        os.kill(proc.proc.pid, signal.SIGSTOP)
    elif fault == "kill":
        proc.kill()
    else:
        proxy.set(fault)


def _end(fault: str, proc: RedisProcess, proxy: Proxy) -> None:
    if fault == "sigstop":
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGCONT)
    elif fault == "kill":
        proc.start()
    else:
        proxy.set("pass")


def _wait(predicate: Callable[[], bool], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("not within the time allowed")
        time.sleep(0.01)


def run_cluster_kill(
    workdir: Path,
    *,
    rate: float = 100.0,
    deadline: float = 0.3,
    redis_timeout: float = 1.0,
    settle: float = 3.0,
) -> Report:
    """Steady load on one key of a replicated Cluster; its master is killed; load goes on
    until the replica has taken over and for ``settle`` seconds more."""
    cluster = RedisCluster(workdir / "cluster", replicas=1, node_timeout_ms=1000).start()
    backend = RedisBackend(parse_backend_url(cluster.url, timeout=redis_timeout))
    connection = backend.connection
    report = Report("cluster master kill", 0.0)
    server: DebugServer | None = None
    try:
        with LogTrap() as trap:
            server = DebugServer(workdir / "config", backend)
            _wait(lambda: connection.state == "up", 10)
            with Load(server.target, rate, deadline) as load:
                time.sleep(1.0)
                window = int(time.time()) // 3600 * 3600
                master = cluster.master_of(f"sick_k_a_{window}")
                connects = connection.connects
                began = time.monotonic()
                master.kill()
                _wait(lambda: cluster.master_of(f"sick_k_a_{window}") is not master, 30)
                cluster.wait_ok()  # the replica is promoted and the cluster agrees
                ended = time.monotonic()
                report.seconds = ended - began
                report.connects_per_second = (connection.connects - connects) / report.seconds
                time.sleep(settle)
            time.sleep(0.5)
            report.log_lines = trap.lines("ferryman.redis")
            report.lost = [
                r.getMessage() for r in trap.records if any(m in r.getMessage() for m in LOST)
            ]
        report.lost += [p for p in server.problems if any(m in p for m in LOST)]
        _summarize(report, load.outcomes, False, ended)
        key = f"sick_k_a_{window}"
        with cluster.master_of(key).client() as client:
            stored = int(client.get(key) or 0)
        ok = sum(o.code is grpc.StatusCode.OK for o in load.outcomes)
        missed = sum(o.code is grpc.StatusCode.DEADLINE_EXCEEDED for o in load.outcomes)
        report.counted = {"a": (stored, ok, missed)}
        report.hits_exact = ok <= stored <= ok + missed
        _connection_figures(report, connection)
    finally:
        if server is not None:
            server.stop()
        cluster.stop()
    return report
