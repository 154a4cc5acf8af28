"""``ferryman serve --workers N``: several processes on one set of ports, supervised."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from ferryman.server.workers import _die_with_parent

from helpers.ports import free_port, listeners
from helpers.redis_procs import RedisProcess
from helpers.server import wait_for

ROOT = Path(__file__).resolve().parents[1]
LIMIT = (
    "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 4}\n"
)


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (from /proc)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry.name))
    return out


def alive(pid: int) -> bool:
    """``pid`` is running (a zombie has exited: only its parent's wait is missing)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def ask(port: int, value: str) -> int:
    """POST /json for (k, value); the HTTP status (200 OK, 429 over the limit)."""
    body = {"domain": "w", "descriptors": [{"entries": [{"key": "k", "value": value}]}]}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/json", data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class Workers:
    def __init__(self, tmp_path: Path, backend: str, n: int, drain: str = "0") -> None:
        config = tmp_path / "config"
        config.mkdir()
        (config / "w.yaml").write_text(LIMIT)
        self.http_port = free_port()
        command = [sys.executable, "-m", "ferryman", "serve", "--config", str(config)]
        command += ["--workers", str(n), "--backend", backend]
        command += ["--grpc-port", str(free_port()), "--http-port", str(self.http_port)]
        command += ["--debug-port", str(free_port())]
        # A file, not a pipe: a worker that outlived its supervisor would hold a pipe open
        # and a read of it would never end.
        self.log = tmp_path / "output.log"
        with self.log.open("wb") as out:
            # No drain on SIGTERM unless asked: a test that does not test it would wait it out.
            env = {**os.environ, "FERRYMAN_SHUTDOWN_DRAIN": drain}
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.seen: set[int] = set()

    def workers(self) -> set[int]:
        """The supervisor's live workers now (each remembered, to be stopped at teardown)."""
        now = children(self.proc.pid)
        self.seen |= now
        return now

    def up(self) -> bool:
        """Both workers listening on the HTTP port (the last port a worker binds)."""
        return listeners(self.http_port) == 2

    def healthy(self) -> bool:
        return self.health() == 200

    def health(self) -> int:
        """/healthcheck's status (0: no answer)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}/healthcheck", timeout=2
            ) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # its workers get SIGTERM when it dies
            return self.proc.wait()

    def output(self) -> str:
        """Everything the supervisor and its workers have printed."""
        return self.log.read_text()

    def clean_up(self) -> None:
        """Stop the supervisor, and kill any worker of it still alive."""
        self.stop()
        for pid in self.seen:
            with contextlib.suppress(OSError):  # gone, or its number taken by another process
                if f"{self.http_port}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def two_workers(tmp_path: Path, redis_server: RedisProcess) -> Iterator[Workers]:
    workers = Workers(tmp_path, redis_server.url, 2)
    yield workers
    workers.clean_up()


def test_two_workers_serve_one_port_and_share_counters_through_redis(
    two_workers: Workers,
) -> None:
    """Two processes answer on one port; the limit holds across them."""
    wait_for("both workers listening", two_workers.up, 60)
    wait_for("the port answers", two_workers.healthy, 60)
    value = f"v{time.time_ns()}"
    statuses = [ask(two_workers.http_port, value) for _ in range(8)]
    assert statuses == [200] * 4 + [429] * 4


def test_a_dead_worker_is_started_again_and_sigterm_stops_all_with_0(
    two_workers: Workers,
) -> None:
    """kill -9 of a worker: a new one takes its place; SIGTERM: everyone exits, status 0."""
    wait_for("both workers listening", two_workers.up, 60)
    wait_for("the port answers", two_workers.healthy, 60)
    first = two_workers.workers()
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    wait_for(
        "a new worker",
        lambda: len(now := two_workers.workers()) == 2 and victim not in now,
        30,
    )
    wait_for("both workers listening again", two_workers.up, 60)
    assert ask(two_workers.http_port, f"v{time.time_ns()}") == 200
    workers = two_workers.workers()
    assert two_workers.stop() == 0
    assert not any(alive(pid) for pid in workers)
    output = two_workers.output()
    assert "exited with" in output and "starting it again" in output


def test_a_second_sigterm_is_passed_on_and_ends_the_workers_drain(
    tmp_path: Path, redis_server: RedisProcess
) -> None:
    """SIGTERM: every worker drains (/healthcheck answers 503, calls are answered); a
    second SIGTERM to the supervisor reaches every worker and ends an hour-long drain:
    all exit 0."""
    workers = Workers(tmp_path, redis_server.url, 2, drain="1h")
    try:
        wait_for("both workers listening", workers.up, 60)
        wait_for("the port answers", workers.healthy, 60)
        serving = workers.workers()
        workers.proc.send_signal(signal.SIGTERM)
        wait_for("draining", lambda: workers.health() == 503, 30)
        assert ask(workers.http_port, f"v{time.time_ns()}") == 200
        assert workers.proc.poll() is None
        workers.proc.send_signal(signal.SIGTERM)
        assert workers.proc.wait(60) == 0
        assert not any(alive(pid) for pid in serving)
        assert workers.output().count("signalled again: the drain ends") == 2
    finally:
        workers.clean_up()


# A worker ended by the stop deadline is reported in the run's summary, not failed.
@pytest.mark.filterwarnings("default")
def test_workers_stop_when_the_supervisor_is_killed(two_workers: Workers) -> None:
    """SIGKILL of the supervisor: its workers do not outlive it."""
    wait_for("both workers up", lambda: len(two_workers.workers()) == 2, 30)
    workers = two_workers.workers()
    two_workers.proc.kill()
    two_workers.proc.wait()
    # Within FERRYMAN_SHUTDOWN_GRACE (10 s) and the stop margin (30 s) at worst.
    wait_for("the workers gone", lambda: not any(alive(pid) for pid in workers), 60)
    output = two_workers.output()
    if "Timeout (" in output:  # the stop deadline ended a worker: its stacks say where
        warnings.warn(f"a worker did not stop in its grace:\n{output}", stacklevel=1)


def test_the_memory_backend_is_refused_with_several_workers(tmp_path: Path) -> None:
    """Counters in one process cannot be shared: exit 2, the message says to use Redis."""
    workers = Workers(tmp_path, "memory", 2)
    try:
        assert workers.proc.wait(60) == 2
    finally:
        workers.clean_up()
    output = workers.output()
    assert "memory backend" in output and "Redis" in output
    assert "Traceback" not in output


def test_a_worker_forked_after_its_supervisor_died_ends_before_it_runs() -> None:
    """Linux signals a child when its parent dies only if the parent was alive when the
    child asked: a worker whose supervisor is already gone (its parent is not the one it
    was forked for) exits 1 at once; one whose supervisor lives runs."""
    orphan = subprocess.Popen(["sleep", "30"], preexec_fn=partial(_die_with_parent, 0))
    follower = subprocess.Popen(["sleep", "30"], preexec_fn=partial(_die_with_parent, os.getpid()))
    try:
        assert orphan.wait(10) == 1
        time.sleep(0.5)
        assert follower.poll() is None
    finally:
        for proc in (orphan, follower):
            proc.kill()
            proc.wait()
