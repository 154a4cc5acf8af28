"""Graceful shutdown: in-flight calls finish, new calls are refused, the process exits 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.algorithms.fixed_window.memory import MemoryFixedWindows
from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import Clock

from helpers.server import ConfigDir, ServerFactory, descriptor, rls_stub

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
