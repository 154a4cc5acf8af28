"""Through a real Envoy: envoy/dynamic-metadata.yaml routes on the `metadata` that ferryman
returns in the answer's dynamic metadata (descriptors/multi-service.yaml)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    ROOT,
    UPSTREAM,
    Client,
    EnvoyProcess,
    FerrymanProcess,
    _env_without_runtime,
    in_one_window,
    render,
    require_envoy,
)
from helpers.ports import free_port

pytestmark = pytest.mark.e2e


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = (
            f"tier={self.headers.get('x-route-tier', '')} "
            f"quota={self.headers.get('x-route-quota', '')}\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Envoy on the committed dynamic-metadata.yaml, ferryman with RESPONSE_DYNAMIC_METADATA,
    and an upstream that echoes the headers the route adds; Envoy's listener port."""
    require_envoy()
    workdir = tmp_path_factory.mktemp("metadata")
    config = workdir / "config"
    config.mkdir()
    shutil.copy(ROOT / "descriptors" / "multi-service.yaml", config / "multi-service.yaml")
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    env = {**_env_without_runtime(), "RESPONSE_DYNAMIC_METADATA": "true", "USE_STATSD": "false"}
    args = ["--config", str(config), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    ferryman = FerrymanProcess(workdir / "ferryman", args, env).start()
    admin, listener = free_port(), free_port()
    ports = {
        ADMIN: admin,
        LISTENER: listener,
        UPSTREAM: int(upstream.server_address[1]),
        FERRYMAN: ferryman.grpc_port,
    }
    try:
        envoy = EnvoyProcess(
            render(ENVOY_DIR / "dynamic-metadata.yaml", ports), workdir / "envoy", admin
        ).start()
    except BaseException:
        ferryman.kill()
        upstream.shutdown()
        raise
    yield listener
    envoy.stop()
    ferryman.kill()
    upstream.shutdown()
    upstream.server_close()


def test_envoy_routes_on_the_metadata_of_the_answer_and_429s_the_spent_quota(proxy: int) -> None:
    """The route adds headers from the answer's dynamic metadata (`metadata.route.tier`):
    each service reaches its own tier; the search quota (3 a minute) ends in a 429 while
    reports keep passing."""

    def send(attempt: int) -> list[tuple[int, bytes]]:
        with Client(proxy) as client:
            out = []
            for service in ("search", "reports", "search", "search", "search", "reports"):
                status, _, body = client.get("/", {"x-service": service})
                out.append((status, body))
            return out

    replies = in_one_window(send, 60, attempts=1)
    assert replies[0] == (200, b"tier=primary quota=search\n")
    assert replies[1] == (200, b"tier=bulk quota=\n")
    assert [status for status, _ in replies] == [200, 200, 200, 200, 429, 200]
    assert replies[5] == (200, b"tier=bulk quota=\n")
