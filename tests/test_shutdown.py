"""Graceful shutdown: in-flight calls finish, new calls are refused, the process exits 0."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.algorithms.fixed_window.memory import MemoryFixedWindows
from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult
from ferryman.apis import APIS
from ferryman.apis.api import health_names
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import Clock

from helpers.redis_procs import RedisProcess
from helpers.serve_process import ServeProcess
from helpers.server import (
    ConfigDir,
    ServerFactory,
    descriptor,
    limiter_stub,
    quota_events_stub,
    rls_stub,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
)


class SlowWindows(MemoryFixedWindows):
    """Memory fixed windows that take ``delay`` seconds per call, so a call can be in flight."""

    # Every call goes through the slow apply: none is answered at once.
    at_once = False

    def __init__(self, clock: Clock, delay: float) -> None:
        super().__init__(clock)
        self.delay = delay
        self.entered = threading.Event()

    async def apply(self, ops: Sequence[CounterOp], *, stop_when_over: bool) -> list[CounterResult]:
        self.entered.set()
        await asyncio.sleep(self.delay)
        return self.apply_now(ops, stop_when_over=stop_when_over)


class SlowBackend(MemoryBackend):
    """A memory backend whose fixed windows are slow."""

    def __init__(self, clock: Clock, delay: float) -> None:
        super().__init__(clock)
        self._stores["fixed_window"] = self.slow = SlowWindows(clock, delay)


def test_stop_lets_the_call_in_flight_finish_and_refuses_new_ones(
    config_dir: ConfigDir, make_server: ServerFactory, clock: Clock
) -> None:
    """A call started before shutdown completes OK; a call after it is refused."""
    config_dir.write("d.yaml", CONFIG)
    backend = SlowBackend(clock, delay=0.5)
    server = make_server(backend=backend)
    request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "v")])])
    in_flight = server.stub.ShouldRateLimit.future(request, timeout=10)
    assert backend.slow.entered.wait(5)
    stopping = server.submit(server.service.stop(grace=5))
    time.sleep(0.1)
    with grpc.insecure_channel(f"127.0.0.1:{server.service.grpc_port}") as late:
        stub = rls_stub(late)
        with pytest.raises(grpc.RpcError) as info:
            stub.ShouldRateLimit(request, timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    reply = in_flight.result(timeout=10)
    assert reply.overall_code == rls_pb2.RateLimitResponse.OK
    stopping.result(timeout=10)


def _start(
    args: list[str], cwd: Path, env: dict[str, str], program: Sequence[str] = ("-m", "ferryman")
) -> tuple[subprocess.Popen[str], int]:
    # No drain unless the test gives one: the tests that do not test it would wait it out.
    env = {"FERRYMAN_SHUTDOWN_DRAIN": "0", **env}
    proc = subprocess.Popen(
        [sys.executable, *program, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        match = re.search(r"grpc :(\d+)", line)
        if match:
            return proc, int(match.group(1))
    proc.kill()
    rest = proc.stderr.read()
    proc.stderr.close()
    proc.wait()
    raise AssertionError("ferryman serve did not start: " + rest)


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    proc.stderr.close()


def test_serve_on_the_default_config_answers_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    """`ferryman serve` from the repo root loads descriptors/, answers, and exits 0 on SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    proc, port = _start(
        ["serve", "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"], ROOT, env
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = rls_stub(channel)
            request = rls_pb2.RateLimitRequest(
                domain="messaging",
                descriptors=[descriptor([("message_type", "marketing"), ("to_number", "1")])],
            )
            reply = stub.ShouldRateLimit(request, timeout=5)
            assert reply.statuses[0].current_limit.requests_per_unit == 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        _end(proc)


# ``ferryman serve`` whose stop never ends, with a short margin: it blocks the event loop, or
# it waits on the loop for what never comes.
STUCK = """
import asyncio, sys, time
from ferryman.cli import main, serve
from ferryman.server.app import Service

how = sys.argv.pop()

async def stuck(self, grace=None):
    if how == "blocks":
        time.sleep(3600)
    await asyncio.Event().wait()

Service.stop = stuck
serve.STOP_MARGIN = 1.0
sys.argv[0] = "ferryman"
sys.exit(main())
"""


@pytest.mark.parametrize("how", ["blocks", "waits"])
def test_a_stop_that_hangs_ends_after_the_grace_and_margin_with_every_stack(
    tmp_path: Path, how: str
) -> None:
    """A process that cannot finish stopping exits 1 once FERRYMAN_SHUTDOWN_GRACE and the
    margin have passed, printing where each thread was; half-way through the margin, a stop
    that still lets the event loop run logs what each task waits on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    env["FERRYMAN_SHUTDOWN_GRACE"] = "1s"
    proc, _ = _start(
        ["serve", "--grpc-port", "0", "--http-port", "0", "--debug-port", "0", how],
        ROOT,
        env,
        program=("-c", STUCK),
    )
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 1
        assert proc.stderr is not None
        output = proc.stderr.read()
        assert "Timeout (0:00:02)!" in output
        if how == "waits":
            report = output[output.index("still stopping 1.5s after the signal") :]
            assert re.search(r"app\.py:\d+ in run\n.*in stuck\n", report), report
        else:
            assert "in stuck" in output and "still stopping" not in output
    finally:
        _end(proc)


# --- draining: FERRYMAN_SHUTDOWN_DRAIN ------------------------------------------------------

COPIES = "domain: jobs\ndescriptors:\n  - key: tenant\n    copies: {limit: 3}\n"
COPY_COUNTS = "{drain_ferryman_copies_jobs.tenant}:n"


def _http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _health(channel: grpc.Channel) -> dict[str, int]:
    """Every name the health service reports, and its status."""
    stub = health_pb2_grpc.HealthStub(channel)
    reply = stub.List(health_pb2.HealthListRequest(), timeout=5)
    return {name: status.status for name, status in reply.statuses.items()}


def test_a_drain_reports_not_serving_while_every_api_answers_until_a_second_signal(
    tmp_path: Path,
) -> None:
    """After SIGTERM, /healthcheck answers 503 and the health service NOT_SERVING under every
    name, while ShouldRateLimit and POST /json answer as before; a second SIGTERM ends an
    hour-long drain and the process exits 0."""
    (tmp_path / "d.yaml").write_text(CONFIG)
    env = {"FERRYMAN_SHUTDOWN_DRAIN": "1h"}
    process = ServeProcess(tmp_path, env, "--config", str(tmp_path))
    try:
        process.wait_serving()
        request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "v")])])
        with grpc.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
            serving = _health(channel)
            assert set(serving) == set(health_names(APIS))
            assert set(serving.values()) == {health_pb2.HealthCheckResponse.SERVING}
            assert _http_status(process.http_port, "/healthcheck") == 200
            process.proc.send_signal(signal.SIGTERM)
            wait_for("draining", lambda: _http_status(process.http_port, "/healthcheck") == 503)
            draining = _health(channel)
            assert set(draining) == set(serving)
            assert set(draining.values()) == {health_pb2.HealthCheckResponse.NOT_SERVING}
            reply = rls_stub(channel).ShouldRateLimit(request, timeout=5)
            assert reply.overall_code == rls_pb2.RateLimitResponse.OK
        assert process.proc.poll() is None
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait_exit(timeout=30) == 0
        assert "signalled again: the drain ends" in process.text
    finally:
        process.kill()


def _copies_held(redis_server: RedisProcess) -> int:
    counts = redis_server.client().hgetall(COPY_COUNTS)
    return sum(int(value) for field, value in counts.items() if field == b"d:t1")


def _events(stream: Any) -> None:
    """Read a Session stream to its end: the events before its status are closings."""
    for event in stream:
        assert event.HasField("closing") and "shutting down" in event.closing.reason


def test_stopping_ends_sessions_saying_why_and_releases_their_copies_once(
    tmp_path: Path, redis_server: RedisProcess
) -> None:
    """A Session open at SIGTERM ends UNAVAILABLE with a message naming the shutdown (with
    an hour's grace: the server ends it, the stream does not hold the stop), the process
    exits 0, and the copies it held are released in Redis (the lease would keep them an
    hour): another replica can take the whole limit."""
    (tmp_path / "jobs.yaml").write_text(COPIES)
    env = {
        "FERRYMAN_SHUTDOWN_GRACE": "1h",
        "HOLD_LEASE_SECONDS": "3600",
        "CACHE_KEY_PREFIX": "drain_",
    }
    args = ("--config", str(tmp_path), "--backend", redis_server.url)
    process = ServeProcess(tmp_path, env, *args)
    other = ServeProcess(tmp_path, env, *args)
    try:
        process.wait_serving()
        with grpc.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
            stub = limiter_stub(channel)
            out: queue.Queue[limiter_pb2.SessionRequest | None] = queue.Queue()
            stream = stub.Session(iter(out.get, None))
            out.put(limiter_pb2.SessionRequest(open=limiter_pb2.SessionRequest.Open()))
            session = next(stream).opened.session_id
            entry = limiter_pb2.Entry(key="tenant", value="t1")
            reserve = limiter_pb2.ReserveRequest(domain="jobs", descriptor=[entry], copies=3)
            metadata = (("ferryman-session", session),)
            assert stub.Reserve(reserve, metadata=metadata, timeout=5).granted == 3
            assert _copies_held(redis_server) == 3
            process.proc.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as ended:
                _events(stream)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in str(ended.value.details())
        assert process.wait_exit(timeout=30) == 0
        assert _copies_held(redis_server) == 0
        other.wait_serving()
        with grpc.insecure_channel(f"127.0.0.1:{other.grpc_port}") as channel:
            stub = limiter_stub(channel)
            again: queue.Queue[limiter_pb2.SessionRequest | None] = queue.Queue()
            stream = stub.Session(iter(again.get, None))
            again.put(limiter_pb2.SessionRequest(open=limiter_pb2.SessionRequest.Open()))
            metadata = (("ferryman-session", next(stream).opened.session_id),)
            assert stub.Reserve(reserve, metadata=metadata, timeout=5).granted == 3
            again.put(None)
    finally:
        process.kill()
        other.kill()


def test_stopping_ends_the_watch_streams(tmp_path: Path) -> None:
    """Health and quota event Watch streams open at SIGTERM end (the health stream's last
    status NOT_SERVING) with an hour's grace: the server ends them, none holds the stop,
    and the process exits 0."""
    (tmp_path / "d.yaml").write_text(CONFIG)
    process = ServeProcess(tmp_path, {"FERRYMAN_SHUTDOWN_GRACE": "1h"}, "--config", str(tmp_path))
    try:
        process.wait_serving()
        with grpc.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert next(health).status == health_pb2.HealthCheckResponse.SERVING
            events = quota_events_stub(channel).Watch(limiter_pb2.WatchQuotaEventsRequest())
            wait_for("the watch open", lambda: _watching(process) == 1)
            process.proc.send_signal(signal.SIGTERM)
            statuses = [reply.status for reply in health]
            assert statuses == [health_pb2.HealthCheckResponse.NOT_SERVING]
            assert list(events) == []
        assert process.wait_exit(timeout=30) == 0
    finally:
        process.kill()


def _watching(process: ServeProcess) -> int:
    """The quota event streams started (the debug port's /stats: counted as the stream
    subscribes)."""
    url = f"http://127.0.0.1:{process.debug_port}/stats"
    with urllib.request.urlopen(url, timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    counts = dict(line.split(": ", 1) for line in lines if ": " in line)
    return int(counts.get("ratelimit_server.Watch.total_requests", 0))
