"""The event loop ``ferryman serve`` runs on: uvloop when installed (EVENT_LOOP=auto), or
asyncio's own; a real server says which in its start line and /status, workers get the same,
and the pipelined Redis client works on uvloop's transports. The collector's settings of a
serving process are reported beside the loop."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman import heap
from ferryman.cli import serve as serve_cli
from ferryman.connections.redis_pipe import PipelinedRedis
from ferryman.errors import SettingsError
from ferryman.server import event_loop
from ferryman.settings import Settings

from helpers.redis_procs import RedisProcess
from helpers.serve_process import ServeProcess
from helpers.server import descriptor, overall, rls_stub, wait_for

pytestmark = pytest.mark.redis

LIMIT = (
    "domain: ev\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"
)


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """A redis-server of this module alone: its tests kill every other client on it."""
    server = RedisProcess(tmp_path_factory.mktemp("redis-event-loop")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("event-loop")
    (path / "descriptors").mkdir()
    (path / "descriptors" / "ev.yaml").write_text(LIMIT)
    return path


def _kill_other_clients(server: RedisProcess) -> int:
    """CLIENT KILL every connection but this one; how many were killed."""
    with server.client() as client:
        return int(client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))


def _ask(port: int, value: str) -> str:
    request = rls_pb2.RateLimitRequest(domain="ev", descriptors=[descriptor([("k", value)])])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return overall(rls_stub(channel).ShouldRateLimit(request, timeout=10))


def test_event_loop_setting_parses_and_refuses_bad_values() -> None:
    """EVENT_LOOP is auto by default, takes uvloop or asyncio (any case), and a bad value is
    refused naming the variable and the choices."""
    assert Settings.from_env({}).event_loop == "auto"
    assert Settings.from_env({"EVENT_LOOP": ""}).event_loop == "auto"
    assert Settings.from_env({"EVENT_LOOP": "uvloop"}).event_loop == "uvloop"
    assert Settings.from_env({"EVENT_LOOP": " AsyncIO "}).event_loop == "asyncio"
    with pytest.raises(SettingsError, match=r"EVENT_LOOP='trio' must be auto .*uvloop or asyncio"):
        Settings.from_env({"EVENT_LOOP": "trio"})


def test_the_flag_overrides_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve --event-loop`` wins over EVENT_LOOP, and without it the variable holds."""
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers(), [])
    monkeypatch.setenv("EVENT_LOOP", "uvloop")
    flagged = parser.parse_args(["serve", "--event-loop", "asyncio"])
    assert serve_cli._settings(flagged).event_loop == "asyncio"
    assert serve_cli._settings(parser.parse_args(["serve"])).event_loop == "uvloop"


def test_factory_is_uvloop_when_importable_and_refuses_uvloop_when_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """auto and uvloop give uvloop's loops where it is installed; without it auto falls back
    to asyncio's loop and uvloop is a settings error saying how to install it."""
    for choice in ("auto", "uvloop"):
        factory = event_loop.factory(choice)
        assert factory is not None
        loop = factory()
        try:
            assert event_loop.name(loop) == "uvloop"
        finally:
            loop.close()
    assert event_loop.factory("asyncio") is None
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now fails
    assert event_loop.factory("auto") is None
    with pytest.raises(SettingsError, match="pip install uvloop"):
        event_loop.factory("uvloop")


def test_serve_refuses_to_start_on_uvloop_without_uvloop(workdir: Path, tmp_path: Path) -> None:
    """EVENT_LOOP=uvloop where uvloop cannot be imported: exit 2, as any settings error,
    with the install command; nothing is served."""
    blocker = tmp_path / "blocker" / "uvloop"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("uvloop is not installed here")\n')
    paths = [str(blocker.parent), os.environ.get("PYTHONPATH", "")]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "EVENT_LOOP": "uvloop",
    }
    result = subprocess.run(
        [sys.executable, "-m", "ferryman", "serve", "--grpc-port", "0", "--http-port", "0"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "EVENT_LOOP=uvloop" in result.stderr and "pip install uvloop" in result.stderr
    assert "ferryman serving" not in result.stderr


def test_serve_runs_on_uvloop_by_default_and_reconnects_to_redis(
    workdir: Path, own_redis: RedisProcess
) -> None:
    """Default settings: the start line and /status say uvloop, ShouldRateLimit is answered
    through Redis, and after CLIENT KILL cuts its connection the server connects again and
    goes on counting."""
    process = ServeProcess(workdir, {}, "--backend", own_redis.url)
    try:
        process.wait_serving()
        assert "event loop uvloop" in process.text
        assert process.status()["event_loop"] == "uvloop"
        assert _ask(process.grpc_port, "a") == "OK"
        assert _kill_other_clients(own_redis) >= 1

        def answered() -> bool:
            try:
                return _ask(process.grpc_port, "a") == "OK"
            except grpc.RpcError:
                return False  # the request that found the connection cut

        wait_for("an answer after CLIENT KILL", answered, timeout=20)
        with own_redis.client() as client:
            counters = [client.get(key) for key in client.scan_iter("*ev_k_a*")]
        # Every answered request was counted, before and after the reconnection.
        assert counters and int(counters[0] or 0) >= 2
        assert process.stop() == 0, process.text
    finally:
        process.kill()


def test_event_loop_asyncio_runs_on_asyncio(workdir: Path) -> None:
    """EVENT_LOOP=asyncio: asyncio's own loop, in the start line and /status; once serving,
    the start-up heap is out of the collector's walks (/status counts it) and young
    collections are spaced out."""
    process = ServeProcess(workdir, {"EVENT_LOOP": "asyncio"})
    try:
        process.wait_serving()
        assert "event loop asyncio" in process.text
        status = process.status()
        assert status["event_loop"] == "asyncio"
        assert status["heap"]["frozen"] > 10_000, status["heap"]
        assert status["heap"]["young_threshold"] == heap.YOUNG
        assert _ask(process.grpc_port, "b") == "OK"
        assert process.stop() == 0, process.text
    finally:
        process.kill()


def test_workers_run_on_the_loop_given_to_the_supervisor(
    workdir: Path, own_redis: RedisProcess
) -> None:
    """``--workers 2 --event-loop asyncio``: both workers run on asyncio's loop."""
    process = ServeProcess(
        workdir, {}, "--backend", own_redis.url, "--workers", "2", "--event-loop", "asyncio"
    )
    try:
        wait_for("two workers serving", lambda: process.text.count("ferryman serving") == 2)
        lines = [line for line in process.lines if "ferryman serving" in line]
        assert all("event loop asyncio" in line for line in lines), lines
        assert process.stop() == 0, process.text
    finally:
        process.kill()


def test_pipelined_client_on_uvloop_answers_batches_and_reconnects(
    own_redis: RedisProcess,
) -> None:
    """On a uvloop loop the pipelined client takes over uvloop's transport, writes the
    commands of one loop turn at once, and after CLIENT KILL connects again."""
    factory = event_loop.factory("uvloop")

    async def scenario() -> None:
        assert event_loop.name() == "uvloop"
        client = PipelinedRedis(5.0, host="127.0.0.1", port=own_redis.port)
        try:
            assert await client.ping()
            assert client._link is not None
            assert type(client._link.transport).__module__.startswith("uvloop")
            writes = client.writes
            replies = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(20)))
            assert replies == [str(i).encode() for i in range(20)]
            assert client.writes == writes + 1
            assert await asyncio.to_thread(_kill_other_clients, own_redis) >= 1
            deadline = time.monotonic() + 20
            while True:
                try:
                    assert await client.execute("ECHO", "again") == b"again"
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "no reconnection after CLIENT KILL"
                    await asyncio.sleep(0.05)
            assert client.connects == 2
        finally:
            await client.aclose()

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(scenario())
