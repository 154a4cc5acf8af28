"""Cost budgets through a real Envoy: envoy/llm/envoy.yaml (usage in a response header) and
envoy/llm/envoy-lua.yaml (usage in the JSON body, read by a Lua filter) in front of a model
server stand-in, asking a real `ferryman serve` on envoy/llm/descriptors."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    UPSTREAM,
    EnvoyProcess,
    FerrymanProcess,
    Upstream,
    render,
    request,
    require_envoy,
    wait_for,
)
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

LLM = ENVOY_DIR / "llm"


class _Model(BaseHTTPRequestHandler):
    """Answers the usage the request asks for (x-test-usage) in x-usage-tokens and in a
    JSON body, as a model server reports the tokens it spent."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("x-test-stream"):
            self._stream()
            return
        usage = self.headers.get("x-test-usage", "")
        body = json.dumps({"choices": [], "usage": {"total_tokens": int(usage or 0)}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if usage:
            self.send_header("x-usage-tokens", usage)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self) -> None:
        """A long streamed answer, its usage in the headers, until the client goes."""
        self.send_response(200)
        self.send_header("x-usage-tokens", self.headers.get("x-test-usage", "0"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for _ in range(100):
                self.wfile.write(b"6\r\ntoken \r\n")
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # Envoy reset the stream: the client has gone


@dataclass
class Gateway:
    port: int
    ferryman: FerrymanProcess

    def stat(self, name: str) -> int:
        _, _, body = request(self.ferryman.debug_port, "/stats")
        for line in body.decode().splitlines():
            key, _, value = line.rpartition(": ")
            if key == f"ratelimit.service.rate_limit.llm.{name}":
                return int(value)
        return 0

    def charged(self, key: str, value: str) -> dict[str, Any]:
        path = f"/explain?domain=llm&descriptor={key}={value}"
        _, _, body = request(self.ferryman.debug_port, path)
        found: dict[str, Any] = json.loads(body)["descriptors"][0]
        return found

    def send(self, user: str, estimate: int, usage: int | None) -> int:
        """One request; once answered 200 with a usage, waits for its settlement."""
        before = self.stat("user.settlements")
        headers = {"x-user": user, "x-org": f"org-{user}", "x-estimate-tokens": str(estimate)}
        if usage is not None:
            headers["x-test-usage"] = str(usage)
        status, _, _ = request(self.port, "/v1/chat", headers)
        if status == 200 and usage is not None:
            wait_for(lambda: self.stat("user.settlements") > before)
        return status


@pytest.fixture(scope="module")
def ferryman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FerrymanProcess]:
    require_envoy()
    workdir = tmp_path_factory.mktemp("llm")
    args = ["--config", str(LLM / "descriptors"), "--grpc-port", "0", "--http-port", "0"]
    proc = FerrymanProcess(workdir / "ferryman", [*args, "--debug-port", "0"]).start()
    yield proc
    proc.kill()


def _gateway(name: str, ferryman: FerrymanProcess, workdir: Path) -> Iterator[Gateway]:
    model = Upstream(_Model).start()
    admin, listener = free_port(), free_port()
    ports = {ADMIN: admin, LISTENER: listener, UPSTREAM: model.port, FERRYMAN: ferryman.grpc_port}
    envoy = EnvoyProcess(render(LLM / name, ports), workdir, admin).start()
    try:
        yield Gateway(listener, ferryman)
    finally:
        envoy.stop()
        model.stop()


@pytest.fixture
def gateway(ferryman: FerrymanProcess, tmp_path: Path) -> Iterator[Gateway]:
    yield from _gateway("envoy.yaml", ferryman, tmp_path / "envoy")


def test_estimates_pass_until_the_cap_and_settlements_charge_the_exact_usage(
    gateway: Gateway,
) -> None:
    """Budget 100000 with 20000 of debt: estimates of 30000 pass while the tokens charged
    and reserved stay within 120000; each response's x-usage-tokens replaces its estimate,
    so usage is exactly the sum reported; once it passes the cap the next request gets 429;
    a request without its estimate header is refused 400, never passed unchecked."""
    user = f"u{uuid.uuid4().hex[:8]}"
    usages = [25000, 35000, 30000]
    assert [gateway.send(user, 30000, usage) for usage in usages] == [200, 200, 200]
    assert gateway.send(user, 30001, 1) == 429  # 90000 + 30001 would pass the cap
    assert gateway.send(user, 30000, 40000) == 200  # 120000: at the cap, admitted
    assert gateway.charged("user", user)["charged"] == sum(usages) + 40000
    assert gateway.charged("org", f"org-{user}")["charged"] == sum(usages) + 40000
    assert gateway.send(user, 1, 1) == 429  # 130000 charged: 10000 past max_debt
    status, _, _ = request(gateway.port, "/v1/chat", {"x-user": user, "x-org": "o"})
    assert status == 400
    seen = gateway.charged("user", user)
    assert (seen["charged"], seen["reserved"], seen["debt"]) == (130000, 0, 30000)


def test_usage_in_the_json_body_is_settled_through_the_lua_filter(
    ferryman: FerrymanProcess, tmp_path: Path
) -> None:
    """The Lua variant: the body's total_tokens (777) is charged in place of the estimate."""
    for gateway in _gateway("envoy-lua.yaml", ferryman, tmp_path / "lua"):
        user = f"u{uuid.uuid4().hex[:8]}"
        assert gateway.send(user, 5000, 777) == 200
        seen = gateway.charged("user", user)
        assert (seen["charged"], seen["reserved"], seen["open_reservations"]) == (777, 0, 0)


def test_a_client_gone_mid_stream_is_settled_from_the_response_header(gateway: Gateway) -> None:
    """The client reads the headers of a streamed answer and hangs up: Envoy still sends
    the settlement, with the usage the headers reported, in place of the estimate."""
    user = f"u{uuid.uuid4().hex[:8]}"
    before = gateway.stat("user.settlements")
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as conn:
        conn.sendall(
            f"GET /v1/chat HTTP/1.1\r\nHost: llm\r\nx-user: {user}\r\nx-org: o-{user}\r\n"
            "x-estimate-tokens: 9000\r\nx-test-stream: 1\r\nx-test-usage: 1234\r\n\r\n".encode()
        )
        head = b""
        while b"token" not in head:
            head += conn.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
    wait_for(lambda: gateway.stat("user.settlements") > before)
    seen = gateway.charged("user", user)
    assert (seen["charged"], seen["reserved"]) == (1234, 0)
