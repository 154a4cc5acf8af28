"""TLS on every port with real certificates: refusals (plaintext, wrong CA, no client
certificate, wrong SAN), rotation without a restart, the HTTP ports, the client and the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

import ferryman
from ferryman.edge.tls import TlsFiles
from ferryman.errors import ServiceUnavailableError, SettingsError
from ferryman.settings import Settings

from helpers.certs import Authority, Pem
from helpers.server import ConfigDir, Server, ServerFactory, descriptor, rls_stub

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: seats
    copies: {limit: 5, hold_ttl: 30s}
"""
REQUEST = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "v")])])


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "ca")


@pytest.fixture
def other_ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path / "other", "another CA")


def tls_server(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    server: Pem,
    client_ca: Path | None = None,
    san: str = "",
) -> Server:
    config_dir.write("d.yaml", CONFIG)
    return make_server(
        grpc_server_use_tls=True,
        grpc_server_tls_cert=str(server.cert),
        grpc_server_tls_key=str(server.key),
        grpc_client_tls_cacert=str(client_ca or ""),
        grpc_client_tls_san=san,
    )


def call(
    port: int, ca: Path | None, client: Pem | None = None, *, plaintext: bool = False
) -> rls_pb2.RateLimitResponse:
    """One ShouldRateLimit on a fresh channel."""
    target = f"127.0.0.1:{port}"
    if plaintext:
        channel = grpc.insecure_channel(target)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes() if ca else None,
            private_key=client.key.read_bytes() if client else None,
            certificate_chain=client.cert.read_bytes() if client else None,
        )
        channel = grpc.secure_channel(target, credentials)
    with channel:
        stub = rls_stub(channel)
        response: rls_pb2.RateLimitResponse = stub.ShouldRateLimit(REQUEST, timeout=5)
        return response


def refused(port: int, ca: Path | None, client: Pem | None = None, **kw: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(port, ca, client, **kw)
    code: grpc.StatusCode = info.value.code()
    return code


def served_certificate(port: int) -> bytes:
    """The DER certificate a new TLS connection to ``port`` is shown."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(pem: Pem) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.cert.read_text())


def https(
    port: int,
    method: str,
    path: str,
    ca: Path,
    client: Pem | None = None,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


JSON = b'{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}'


def test_a_tls_port_serves_a_client_that_trusts_its_ca(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority
) -> None:
    """A client verifying the server against its CA gets answers."""
    server = tls_server(make_server, config_dir, ca.server())
    assert call(server.service.grpc_port, ca.cert).overall_code == rls_pb2.RateLimitResponse.OK


def test_a_plaintext_client_is_refused_on_a_tls_port(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority
) -> None:
    """Plaintext HTTP/2 on the TLS port gets no answer: the call fails UNAVAILABLE."""
    server = tls_server(make_server, config_dir, ca.server())
    port = server.service.grpc_port
    assert refused(port, None, plaintext=True) == grpc.StatusCode.UNAVAILABLE
    assert server.stat("ratelimit.service.call.should_rate_limit.total_requests") == 0


def test_a_client_trusting_another_ca_is_refused(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority, other_ca: Authority
) -> None:
    """A client that does not trust the server's CA refuses the handshake."""
    server = tls_server(make_server, config_dir, ca.server())
    assert refused(server.service.grpc_port, other_ca.cert) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_requires_a_client_certificate_from_the_ca(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority, other_ca: Authority
) -> None:
    """With GRPC_CLIENT_TLS_CACERT: no client certificate, or one from another CA, is refused;
    one the CA issued is served."""
    server = tls_server(make_server, config_dir, ca.server(), client_ca=ca.cert)
    port = server.service.grpc_port
    assert refused(port, ca.cert) == grpc.StatusCode.UNAVAILABLE
    assert refused(port, ca.cert, other_ca.client("stranger")) == grpc.StatusCode.UNAVAILABLE
    assert call(port, ca.cert, ca.client()).overall_code == rls_pb2.RateLimitResponse.OK


def test_a_client_certificate_without_the_required_san_is_denied(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority
) -> None:
    """With GRPC_CLIENT_TLS_SAN a verified certificate must also carry that SAN, on every
    service (health included); nothing is counted for a denied call."""
    server = tls_server(
        make_server, config_dir, ca.server(), client_ca=ca.cert, san="envoy.mesh.local"
    )
    port = server.service.grpc_port
    wrong = ca.client("wrong", dns=("someone.else",))
    assert refused(port, ca.cert, wrong) == grpc.StatusCode.PERMISSION_DENIED
    right = ca.issue("envoy", dns=("envoy.mesh.local",), client=True)
    assert call(port, ca.cert, right).overall_code == rls_pb2.RateLimitResponse.OK
    assert server.stat("ratelimit.service.rate_limit.d.k.total_hits") == 1
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    credentials = grpc.ssl_channel_credentials(
        ca.cert.read_bytes(), wrong.key.read_bytes(), wrong.cert.read_bytes()
    )
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_rotated_certificate_is_served_to_new_connections_without_a_restart(
    make_server: ServerFactory,
    config_dir: ConfigDir,
    tmp_path: Path,
    ca: Authority,
    other_ca: Authority,
) -> None:
    """Replacing the files (as cert-manager does: a new pair renamed into place) changes the
    certificate new connections see, on gRPC and HTTP; an established connection keeps
    working, and so does a Session stream holding copies (its client trusts only the old
    CA, so a reconnection would fail); a mismatched pair is ignored, the last good one
    kept."""
    live = Pem(tmp_path / "live" / "tls.crt", tmp_path / "live" / "tls.key")
    live.cert.parent.mkdir()
    first = ca.server("first")
    shutil.copy(first.cert, live.cert)
    shutil.copy(first.key, live.key)
    server = tls_server(make_server, config_dir, live)
    port, http_port = server.service.grpc_port, server.service.http_port
    assert served_certificate(port) == der(first)
    old = grpc.secure_channel(
        f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca.cert.read_bytes())
    )
    stub = rls_stub(old)
    stub.ShouldRateLimit(REQUEST, timeout=5)
    # A client holding copies: its Session stream is open across the rotation.
    holder = ferryman.Client(f"127.0.0.1:{port}", ca_file=str(ca.cert), fail_open=False)
    held = contextlib.ExitStack()
    hold = held.enter_context(holder.hold_copy("d", {"seats": "s"}, copies=2))
    assert hold.success and hold.copies == 2

    second = other_ca.server("second")
    for source, target in ((second.cert, live.cert), (second.key, live.key)):
        shutil.copy(source, target.with_suffix(".new"))
        os.replace(target.with_suffix(".new"), target)
    assert served_certificate(port) == der(second)
    assert served_certificate(http_port) == der(second)
    assert call(port, other_ca.cert).overall_code == rls_pb2.RateLimitResponse.OK
    assert refused(port, ca.cert) == grpc.StatusCode.UNAVAILABLE
    # The connection made before the rotation is still up, and so is the stream on it.
    stub.ShouldRateLimit(REQUEST, timeout=5)
    old.close()
    hold.release(1)
    assert not hold.lost and hold.copies == 1
    assert holder.stats().sessions_lost == 0
    held.close()
    holder.close()

    live.key.write_bytes(first.key.read_bytes())  # key of one pair, certificate of another
    assert served_certificate(port) == der(second)
    assert served_certificate(http_port) == der(second)
    assert server.service.pages.status()["tls"] == {
        "cert": str(live.cert),
        "mutual": False,
        "client_san": None,
        "reloads": 1,
    }


def test_http_and_debug_ports_speak_tls_with_the_same_files(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority
) -> None:
    """HTTPS on the HTTP and debug ports; a plaintext request there gets no HTTP answer."""
    server = tls_server(make_server, config_dir, ca.server())
    http_port, debug_port = server.service.http_port, server.service.debug_port
    assert https(http_port, "GET", "/healthcheck", ca.cert) == (200, b"OK")
    assert https(http_port, "POST", "/json", ca.cert, body=JSON)[0] == 200
    assert https(debug_port, "GET", "/rlconfig", ca.cert)[0] == 200
    for port in (http_port, debug_port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as plain:
            plain.sendall(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
            assert not plain.recv(100).startswith(b"HTTP/")


def test_under_mutual_tls_json_needs_a_verified_client_certificate(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority
) -> None:
    """Probes reach /healthcheck without a client certificate; POST /json, which counts hits,
    answers 403 without one (or without the SAN) and counts nothing."""
    server = tls_server(
        make_server, config_dir, ca.server(), client_ca=ca.cert, san="envoy.mesh.local"
    )
    port = server.service.http_port
    assert https(port, "GET", "/healthcheck", ca.cert) == (200, b"OK")
    status, body = https(port, "POST", "/json", ca.cert, body=JSON)
    assert status == 403 and b"client certificate is required" in body
    wrong = ca.client("wrong", dns=("someone.else",))
    status, body = https(port, "POST", "/json", ca.cert, wrong, body=JSON)
    assert status == 403 and b"envoy.mesh.local" in body
    assert server.stat("ratelimit.service.rate_limit.d.k.total_hits") == 0
    right = ca.issue("envoy", dns=("envoy.mesh.local",), client=True)
    assert https(port, "POST", "/json", ca.cert, right, body=JSON)[0] == 200
    assert server.stat("ratelimit.service.rate_limit.d.k.total_hits") == 1


def test_a_client_certificate_listed_in_the_token_file_stands_in_for_a_token(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority, tmp_path: Path
) -> None:
    """Under mutual TLS a `cert:<SAN> user role` line of ADMIN_TOKENS_FILE lets a verified
    client certificate with that SAN use the config API without a token; a certificate
    not listed, none, or the line's text sent as a bearer token get 401; a read one 403."""
    tokens = tmp_path / "tokens"
    tokens.write_text("cert:ops.example carol write\ncert:spiffe://mesh/auditor dave read\n")
    config_dir.write("d.yaml", CONFIG)
    pem = ca.server()
    server = make_server(
        grpc_server_use_tls=True,
        grpc_server_tls_cert=str(pem.cert),
        grpc_server_tls_key=str(pem.key),
        grpc_client_tls_cacert=str(ca.cert),
        admin_tokens_file=str(tokens),
    )
    port = server.service.debug_port
    ops = ca.issue("ops", dns=("ops.example",), client=True)
    status, body = https(port, "GET", "/api/v1/config", ca.cert, ops)
    assert status == 200 and json.loads(body)["you"] == {"user": "carol", "role": "write"}
    assert https(port, "GET", "/api/v1/config", ca.cert)[0] == 401
    assert https(port, "GET", "/api/v1/config", ca.cert, ca.client())[0] == 401
    bearer = {"Authorization": "Bearer cert:ops.example"}
    assert https(port, "GET", "/api/v1/config", ca.cert, headers=bearer)[0] == 401
    auditor = ca.issue("auditor", uris=("spiffe://mesh/auditor",), client=True)
    assert https(port, "GET", "/api/v1/config", ca.cert, auditor)[0] == 200
    version = json.loads(https(port, "GET", "/api/v1/config", ca.cert, ops)[1])["version"]
    put = {"If-Match": f'"{version}"'}
    status, body = https(port, "PUT", "/api/v1/config/d.yaml", ca.cert, auditor, b"x", put)
    assert status == 403 and b"dave" in body
    status, body = https(port, "PUT", "/api/v1/config/d.yaml", ca.cert, ops, CONFIG.encode(), put)
    assert status == 200 and json.loads(body)["author"] == "carol"


def test_the_python_client_speaks_tls_and_mutual_tls(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority
) -> None:
    """``tls=True`` with a CA file, a client certificate and key; without the client
    certificate the service cannot be reached."""
    server = tls_server(make_server, config_dir, ca.server(), client_ca=ca.cert)
    target = f"127.0.0.1:{server.service.grpc_port}"
    me = ca.client()
    with ferryman.Client(
        target, tls=True, ca_file=str(ca.cert), cert_file=str(me.cert), key_file=str(me.key)
    ) as client:
        assert client.should_rate_limit("d", [{"k": "v"}]).code is ferryman.Code.OK
    with (
        ferryman.Client(target, fail_open=False, ca_file=str(ca.cert)) as client,
        pytest.raises(ServiceUnavailableError),
    ):
        client.should_rate_limit("d", [{"k": "v"}])
    with pytest.raises(ValueError, match="go together"):
        ferryman.Client(target, cert_file=str(me.cert))


def test_the_async_client_speaks_mutual_tls(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority
) -> None:
    """The asyncio client takes the same TLS arguments."""
    server = tls_server(make_server, config_dir, ca.server(), client_ca=ca.cert)
    me = ca.client()

    async def ask() -> ferryman.RateLimitResult:
        async with ferryman.AsyncClient(
            f"127.0.0.1:{server.service.grpc_port}",
            ca_file=str(ca.cert),
            cert_file=str(me.cert),
            key_file=str(me.key),
        ) as client:
            return await client.should_rate_limit("d", [{"k": "v"}])

    assert asyncio.run(ask()).code is ferryman.Code.OK


def test_ferryman_query_over_mutual_tls(
    make_server: ServerFactory, config_dir: ConfigDir, ca: Authority, tmp_path: Path
) -> None:
    """``ferryman query --ca-file --cert-file --key-file`` asks a mutual-TLS service;
    without them it cannot reach it (exit 2)."""
    server = tls_server(make_server, config_dir, ca.server(), client_ca=ca.cert)
    me = ca.client()
    base = [
        sys.executable, "-m", "ferryman", "query",
        "--target", f"127.0.0.1:{server.service.grpc_port}",
        "--domain", "d", "--descriptor", "k=v", "--timeout", "5",
    ]  # fmt: skip
    files = ["--ca-file", str(ca.cert), "--cert-file", str(me.cert), "--key-file", str(me.key)]
    ok = subprocess.run([*base, *files], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout
    plain = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 2


def test_tls_settings_are_checked_together() -> None:
    """GRPC_SERVER_USE_TLS needs a certificate and key; TLS files without it, or a SAN
    without a client CA, are errors rather than a silent plaintext port."""
    with pytest.raises(SettingsError, match="GRPC_SERVER_TLS_CERT"):
        Settings.from_env({"GRPC_SERVER_USE_TLS": "true"})
    with pytest.raises(SettingsError, match="GRPC_SERVER_USE_TLS is not"):
        Settings.from_env({"GRPC_SERVER_TLS_CERT": "/tls/crt"})
    with pytest.raises(SettingsError, match="GRPC_CLIENT_TLS_CACERT"):
        Settings.from_env(
            {
                "GRPC_SERVER_USE_TLS": "true",
                "GRPC_SERVER_TLS_CERT": "c",
                "GRPC_SERVER_TLS_KEY": "k",
                "GRPC_CLIENT_TLS_SAN": "x",
            }
        )
    assert Settings.from_env({}).debug_host == "127.0.0.1"


def test_an_unreadable_certificate_stops_the_start_naming_the_variable(
    ca: Authority, tmp_path: Path
) -> None:
    """A missing file, or a certificate and key that do not match, fail the start."""

    def files(pem: Pem) -> TlsFiles | None:
        return TlsFiles.from_settings(
            Settings(
                grpc_server_use_tls=True,
                grpc_server_tls_cert=str(pem.cert),
                grpc_server_tls_key=str(pem.key),
            )
        )

    with pytest.raises(SettingsError, match=r"GRPC_SERVER_TLS_CERT='.*nope\.pem'"):
        files(Pem(tmp_path / "nope.pem", tmp_path / "nope-key.pem"))
    a, b = ca.server("a"), ca.server("b")
    with pytest.raises(SettingsError, match="not a matching"):
        files(Pem(a.cert, b.key))
