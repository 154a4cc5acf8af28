"""`ferryman serve` as a real process: its log lines (levels, LOG_FORMAT=json), the default
config directory, and what it does with bad input and failed reloads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from helpers.ports import free_port
from helpers.serve_process import ServeProcess
from helpers.server import descriptor, rls_stub, wait_for

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


class Serve(ServeProcess):
    """A `ferryman serve` process on free ports, with the service's own defaults, started
    and ready (when it logs at a level that hides the start line: when /status answers)."""

    def __init__(
        self, cwd: Path, *args: str, env: dict[str, str] | None = None, debug_port: int = 0
    ) -> None:
        super().__init__(cwd, env or {}, *args, debug_port=debug_port, defaults=False)
        if debug_port:
            wait_for("/status", self.status, timeout=30, ignoring=(OSError,))
        else:
            self.wait_serving()


@pytest.fixture
def serve() -> Iterator[type[Serve]]:
    """Starts Serve processes; kills any still running at teardown."""
    started: list[Serve] = []

    class Tracked(Serve):
        def __init__(
            self, cwd: Path, *args: str, env: dict[str, str] | None = None, debug_port: int = 0
        ) -> None:
            started.append(self)
            super().__init__(cwd, *args, env=env, debug_port=debug_port)

    yield Tracked
    for proc in started:
        proc.kill()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A descriptor directory with the one domain ``d``."""
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "d.yaml").write_text(CONFIG)
    return directory


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a rename), so a reload never sees half a file."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    temp.rename(path)


# --------------------------------------------------------------------------- log lines


def test_start_reload_and_stop_are_info_lines_not_warnings(
    serve: type[Serve], config: Path
) -> None:
    """At the default level the start, a reload and the stop are logged, at INFO."""
    server = serve(config.parent, "--config", str(config))
    replace_file(config / "e.yaml", CONFIG.replace("domain: d", "domain: e"))
    wait_for("reload", lambda: "config reloaded (version 2)" in server.text)
    assert server.stop() == 0
    lines = server.lines
    assert [ln.split()[2] for ln in lines] == ["INFO"] * len(lines), lines
    assert any("config loaded (version 1)" in ln for ln in lines)
    assert any("shutting down" in ln for ln in lines)


def test_log_level_warn_keeps_the_normal_lines_out(serve: type[Serve], config: Path) -> None:
    """LOG_LEVEL=warn (the reference's spelling) leaves out the INFO lines, not the errors."""
    server = serve(
        config.parent, "--config", str(config), env={"LOG_LEVEL": "warn"}, debug_port=free_port()
    )
    (config / "bad.yaml").write_text("domain: [\n")
    wait_for("rejection", lambda: "config rejected" in server.text)
    assert server.stop() == 0
    assert len(server.lines) == 1, server.lines
    assert " ERROR ferryman.config: config rejected, keeping version 1" in server.lines[0]


def test_json_logs_are_one_object_per_line_with_stable_fields(
    serve: type[Serve], config: Path
) -> None:
    """LOG_FORMAT=json: every line parses, with time, level, logger and message; loads
    carry the version and the domains, a rejection its problems."""
    server = serve(config.parent, "--config", str(config), env={"LOG_FORMAT": "json"})
    replace_file(config / "e.yaml", CONFIG.replace("domain: d", "domain: e"))
    wait_for("reload", lambda: "config reloaded (version 2)" in server.text)
    (config / "bad.yaml").write_text("domain: [\n")
    wait_for("rejection", lambda: "config rejected" in server.text)
    assert server.stop() == 0
    entries = [json.loads(line) for line in server.lines]
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry), entry
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"])

    def entry_of(prefix: str) -> dict[str, Any]:
        [found] = [e for e in entries if e["message"].startswith(prefix)]
        return dict(found)

    loaded = entry_of("config loaded")
    assert (loaded["level"], loaded["logger"]) == ("info", "ferryman.config")
    assert (loaded["version"], loaded["domains"]) == (1, ["d"])
    reloaded = entry_of("config reloaded")
    assert (reloaded["version"], reloaded["domains"], reloaded["added"]) == (2, ["d", "e"], ["e"])
    rejected = entry_of("config rejected, keeping version 2: 1 problem")
    assert rejected["level"] == "error" and rejected["version"] == 2
    assert "bad.yaml" in rejected["problems"][0]


def test_a_fatal_error_is_a_json_line_too(tmp_path: Path, config: Path) -> None:
    """With LOG_FORMAT=json a start-up mistake is reported as one JSON line, exit 2."""
    env = {"PATH": os.environ.get("PATH", ""), "LOG_FORMAT": "json"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    result = subprocess.run(
        [sys.executable, "-m", "ferryman", "serve", "--config", str(tmp_path / "missing")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "fatal"
    assert "does not exist" in entry["message"]


# --------------------------------------------------------------------------- default directory


def test_serve_loads_descriptors_of_the_current_directory(serve: type[Serve], config: Path) -> None:
    """With no --config, `ferryman serve` loads ./descriptors (not the source tree's)."""
    (config.parent / "descriptors").mkdir()
    (config.parent / "descriptors" / "only.yaml").write_text(
        CONFIG.replace("domain: d", "domain: only-here")
    )
    server = serve(config.parent)
    status = server.status()["config"]
    assert status["directory"] == str(config.parent / "descriptors")
    assert status["domains"] == 1
    assert "added: only-here" in server.text
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = rls_stub(channel)
        request = rls_pb2.RateLimitRequest(
            domain="only-here", descriptors=[descriptor([("k", "v")])]
        )
        reply = stub.ShouldRateLimit(request, timeout=5)
    assert reply.statuses[0].current_limit.requests_per_unit == 5
    assert server.stop() == 0


# --------------------------------------------------------------------------- undecodable requests

SHOULD_RATE_LIMIT = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
BAD_UTF8 = rls_pb2.RateLimitRequest(domain="d").SerializeToString()[:-1] + b"\xff"
CORRUPT = b"\xff\xff\xff"


def stat(server: Serve, name: str) -> int:
    """One counter from the debug port's /stats."""
    url = f"http://127.0.0.1:{server.debug_port}/stats"
    with urllib.request.urlopen(url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
    return 0


def test_a_flood_of_undecodable_requests_writes_a_bounded_log(
    serve: type[Serve], config: Path
) -> None:
    """10,000 requests that do not decode: each answered INVALID_ARGUMENT and counted, and
    the log gets one line per 10 s interval with a count, no traceback."""
    server = serve(config.parent, "--config", str(config))
    before = len(server.lines)
    codes: dict[grpc.StatusCode, int] = {}
    started = time.monotonic()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary(SHOULD_RATE_LIMIT, None, None)
        for batch in range(100):
            body = BAD_UTF8 if batch % 2 else CORRUPT
            pending = [call.future(body, timeout=30) for _ in range(100)]
            for future in pending:
                error = future.exception()
                assert isinstance(error, grpc.RpcError)
                codes[error.code()] = codes.get(error.code(), 0) + 1
    elapsed = time.monotonic() - started
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT: 10_000}
    assert stat(server, "ratelimit.service.undecodable_requests") == 10_000
    assert stat(server, "ratelimit.service.call.should_rate_limit.service_error") == 10_000
    assert server.stop() == 0
    logged = [ln for ln in server.lines[before:] if "undecodable request" in ln]
    # One line at the first request, then at most one per started 10 s interval.
    assert 1 <= len(logged) <= 2 + elapsed / 10, logged
    assert all(" WARNING ferryman.grpc: " in ln for ln in logged)
    assert "Traceback" not in server.text
    assert len(server.text) < 10_000


def test_undecodable_requests_on_every_service_are_refused_alike(
    serve: type[Serve], config: Path
) -> None:
    """ferryman.v1.Limiter's calls and streams and the health service refuse bytes that do
    not decode with INVALID_ARGUMENT, and good calls still work after them."""
    server = serve(config.parent, "--config", str(config))
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        for method in ("/ferryman.v1.Limiter/Request", "/grpc.health.v1.Health/Check"):
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(method, None, None)(CORRUPT, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        session = channel.stream_stream("/ferryman.v1.Limiter/Session", None, None)
        with pytest.raises(grpc.RpcError) as info:
            list(session(iter([CORRUPT]), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        stub = rls_stub(channel)
        request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "v")])])
        assert (
            stub.ShouldRateLimit(request, timeout=10).overall_code == rls_pb2.RateLimitResponse.OK
        )
    assert stat(server, "ratelimit.service.undecodable_requests") == 3
    assert server.stop() == 0
    assert "Traceback" not in server.text


# --------------------------------------------------------------------------- failed reloads


@pytest.mark.parametrize(
    "bad",
    [b"domain: [\n", b"domain: caf\xe9\n"],
    ids=["yaml-error", "not-utf8"],
)
def test_status_clears_the_error_once_the_offending_file_is_removed(
    bad: bytes, serve: type[Serve], config: Path
) -> None:
    """A rejected reload shows on /status until the bad file is gone: then the error is
    cleared, even though the files are back to the configuration in force."""
    server = serve(config.parent, "--config", str(config))
    (config / "bad.yaml").write_bytes(bad)
    wait_for("the error on /status", lambda: server.status()["config"]["last_error"])
    assert "bad.yaml" in server.status()["config"]["last_error"]
    (config / "bad.yaml").unlink()
    wait_for("the error cleared", lambda: server.status()["config"]["last_error"] is None)
    status = server.status()["config"]
    assert (status["domains"], status["last_error_at"]) == (1, None)
    assert server.stop() == 0
    assert server.text.count("config rejected") == 1  # reported once, not at every poll


def test_sigterm_after_a_failed_reload_exits_0(serve: type[Serve], config: Path) -> None:
    """SIGTERM while a rejected configuration is pending stops cleanly: exit 0, no traceback."""
    server = serve(config.parent, "--config", str(config))
    (config / "d.yaml").write_text("domain: d\ndescriptors: [{key: k, ratelimit: {}}]\n")
    wait_for("the rejection", lambda: "config rejected" in server.text)
    assert server.stop() == 0
    assert "Traceback" not in server.text
    assert server.lines[-1].endswith("INFO ferryman: stopped")
