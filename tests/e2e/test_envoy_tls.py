"""Through a real Envoy over mutual TLS: envoy/sidecar.yaml with its ferryman cluster given a
TLS transport socket (client certificate, server verified against the CA and its SAN),
asking a real `ferryman serve` with GRPC_SERVER_USE_TLS, GRPC_CLIENT_TLS_CACERT and
GRPC_CLIENT_TLS_SAN. Envoy fails closed here, so that a broken handshake shows as 500
instead of passing traffic unlimited."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
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
    Client,
    EnvoyProcess,
    FerrymanProcess,
    Upstream,
    render,
    require_envoy,
)
from helpers.certs import Authority, Pem
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

SAN = "envoy.sidecar.local"
UPSTREAM_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def with_tls(tree: dict[str, Any], ca: Path, client: Pem | None) -> dict[str, Any]:
    """The sidecar config, failing closed, its ferryman cluster speaking (mutual) TLS."""
    for listener in tree["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"][0]["typed_config"]["http_filters"]:
                if f["name"] == "envoy.filters.http.ratelimit":
                    f["typed_config"]["failure_mode_deny"] = True
    [cluster] = [c for c in tree["static_resources"]["clusters"] if c["name"] == "ferryman"]
    common: dict[str, Any] = {
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": {"filename": str(ca)},
            "match_typed_subject_alt_names": [
                {"san_type": "DNS", "matcher": {"exact": "localhost"}}
            ],
        },
    }
    if client is not None:
        common["tls_certificates"] = [
            {
                "certificate_chain": {"filename": str(client.cert)},
                "private_key": {"filename": str(client.key)},
            }
        ]
    cluster["transport_socket"] = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": UPSTREAM_TLS,
            "sni": "localhost",
            "common_tls_context": common,
        },
    }
    return tree


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_ferryman(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[FerrymanProcess, Authority]]:
    require_envoy()
    workdir = tmp_path_factory.mktemp("tls")
    ca = Authority(workdir / "ca")
    server = ca.server()
    config = workdir / "config"
    config.mkdir()
    shutil.copy(ROOT / "descriptors" / "messaging.yaml", config / "messaging.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_", "GRPC_"))}
    env.update(
        GRPC_SERVER_USE_TLS="true",
        GRPC_SERVER_TLS_CERT=str(server.cert),
        GRPC_SERVER_TLS_KEY=str(server.key),
        GRPC_CLIENT_TLS_CACERT=str(ca.cert),
        GRPC_CLIENT_TLS_SAN=SAN,
    )
    args = ["--config", str(config), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    ferryman = FerrymanProcess(workdir / "ferryman", args, env).start()
    yield ferryman, ca
    ferryman.kill()


def start_envoy(
    workdir: Path, upstream: Upstream, ferryman: FerrymanProcess, ca: Path, client: Pem | None
) -> tuple[EnvoyProcess, int]:
    admin, listener = free_port(), free_port()
    ports = {
        ADMIN: admin,
        LISTENER: listener,
        UPSTREAM: upstream.port,
        FERRYMAN: ferryman.grpc_port,
    }
    tree = with_tls(render(ENVOY_DIR / "sidecar.yaml", ports), ca, client)
    return EnvoyProcess(tree, workdir, admin).start(), listener


def marketing(port: int, number: str, n: int) -> list[int]:
    headers = {"x-message-type": "marketing", "x-to-number": number}
    with Client(port) as client:
        return [client.get("/messages", headers)[0] for _ in range(n)]


def test_envoy_with_a_client_certificate_is_limited_over_mutual_tls(
    tls_ferryman: tuple[FerrymanProcess, Authority], upstream: Upstream, tmp_path: Path
) -> None:
    """Envoy presenting a certificate with the required SAN gets ferryman's answers over
    TLS: five marketing messages a day per number, then 429."""
    ferryman, ca = tls_ferryman
    client = ca.issue("envoy", dns=(SAN,), client=True)
    envoy, port = start_envoy(tmp_path / "envoy", upstream, ferryman, ca.cert, client)
    try:
        assert marketing(port, "2065550001", 6) == [200] * 5 + [429]
    finally:
        envoy.stop()


@pytest.mark.parametrize("who", ["no-certificate", "wrong-san", "other-ca"])
def test_envoy_without_an_acceptable_certificate_is_refused(
    tls_ferryman: tuple[FerrymanProcess, Authority],
    upstream: Upstream,
    tmp_path: Path,
    who: str,
) -> None:
    """No client certificate, one without the SAN, or one from another CA: ferryman refuses
    the handshake or the call, and Envoy (failing closed) answers 500."""
    ferryman, ca = tls_ferryman
    client: Pem | None = None
    if who == "wrong-san":
        client = ca.issue("stranger", dns=("someone.else",), client=True)
    elif who == "other-ca":
        client = Authority(tmp_path / "other", "other CA").issue("envoy", dns=(SAN,), client=True)
    envoy, port = start_envoy(tmp_path / "envoy", upstream, ferryman, ca.cert, client)
    try:
        assert marketing(port, "2065550002", 2) == [500, 500]
    finally:
        envoy.stop()
