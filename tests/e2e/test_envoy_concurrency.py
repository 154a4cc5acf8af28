"""A per-tenant concurrency limit through the real Envoy: a copy-limited node held while a
request is in flight and given back by Envoy's stream-done call with negative hits."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    ROOT,
    UPSTREAM,
    EnvoyProcess,
    FerrymanProcess,
    Reply,
    render,
    request,
    require_envoy,
    wait_for,
)
from helpers.ports import free_port

pytestmark = pytest.mark.e2e


class GatedUpstream:
    """An upstream that holds every /slow/ request until ``gate`` opens."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.arrived = threading.Semaphore(0)
        gate, arrived = self.gate, self.arrived

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                if self.path.startswith("/slow/"):
                    arrived.release()
                    gate.wait(20)
                body = b"done\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, GatedUpstream]]:
    require_envoy()
    workdir = tmp_path_factory.mktemp("concurrency")
    config = workdir / "config"
    config.mkdir()
    shutil.copy(ROOT / "descriptors" / "held-resources.yaml", config / "held-resources.yaml")
    args = ["--config", str(config), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    ferryman = FerrymanProcess(workdir / "ferryman", args).start()
    upstream = GatedUpstream()
    admin, listener = free_port(), free_port()
    ports = {
        ADMIN: admin,
        LISTENER: listener,
        UPSTREAM: upstream.port,
        FERRYMAN: ferryman.grpc_port,
    }
    try:
        envoy = EnvoyProcess(
            render(ENVOY_DIR / "front-proxy.yaml", ports), workdir / "envoy", admin
        )
        envoy.start()
    except BaseException:
        upstream.stop()
        ferryman.kill()
        raise
    yield listener, upstream
    envoy.stop()
    upstream.stop()
    ferryman.kill()


def test_third_concurrent_request_gets_429_and_capacity_returns_when_streams_end(
    proxy: tuple[int, GatedUpstream], tmp_path: Path
) -> None:
    """Limit 2 in flight per tenant: the third concurrent request is refused; once the first
    two finish, Envoy's stream-done calls give the copies back and new requests pass."""
    port, upstream = proxy
    upstream.gate.clear()
    tenant = {"x-tenant": "acme"}
    with ThreadPoolExecutor(2) as pool:
        slow: list[Future[Reply]] = [
            pool.submit(request, port, f"/slow/{i}", tenant, timeout=20) for i in range(2)
        ]
        for _ in range(2):
            assert upstream.arrived.acquire(timeout=10)
        third = request(port, "/slow/third", tenant)
        assert third[0] == 429
        # Another tenant is not affected.
        with ThreadPoolExecutor(1) as side:
            other = side.submit(request, port, "/slow/other", {"x-tenant": "globex"}, timeout=20)
            assert upstream.arrived.acquire(timeout=10)
            upstream.gate.set()
            assert other.result(20)[0] == 200
        assert [f.result(20)[0] for f in slow] == [200, 200]

    # The stream-done calls are fire-and-forget: poll until the copies are back.
    def passes() -> bool:
        status = request(port, "/slow/after", tenant)[0]
        return status == 200

    assert wait_for(passes, timeout=10)
    assert request(port, "/slow/again", tenant)[0] == 200
