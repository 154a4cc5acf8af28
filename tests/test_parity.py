"""Drop-in behaviours of the reference service (issue 17): counters that always expire, the
local over-limit cache with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, a first configuration
that is rejected, health that waits for a configuration."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import http.server
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from envoy.service.ratelimit.v3 import rls_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import SERVICE_NAME

from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import RedisBackend, parse_backend_url
from ferryman.clock import ManualClock
from ferryman.errors import SettingsError
from ferryman.server.app import Service, make_backend
from ferryman.settings import Settings
from ferryman.telemetry import http_traces_url, telemetry_resource

from helpers.needs import missing
from helpers.ports import free_port
from helpers.redis_procs import RedisProcess, require_binary, stop_process
from helpers.server import EPOCH, ConfigDir, ServerFactory, codes, descriptor, rls_stub, wait_for

TWO = """
domain: two
descriptors:
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 100}
"""


def test_an_increment_gives_a_counter_without_expiry_one(
    config_dir: ConfigDir, make_server: ServerFactory, redis_server: RedisProcess
) -> None:
    """A counter that exists without a TTL (left by a writer that died between INCRBY and
    EXPIRE) gets the window's expiry at the next increment, as in the reference."""
    config_dir.write("t.yaml", TWO)
    backend = RedisBackend(parse_backend_url(redis_server.url, 4, 5.0), server_time=False)
    server = make_server(backend=backend, cache_key_prefix="noexp_")
    key = f"noexp_two_big_b_{int(EPOCH) // 3600 * 3600}"
    with redis_server.client() as r:
        r.delete(key)
        r.set(key, 5)
        assert r.ttl(key) == -1
        assert codes(server.ask("two", [("big", "b")])) == ["OK"]
        assert r.get(key) == b"6"
        assert 0 < r.ttl(key) <= 3600 + 300


def test_a_locally_cached_over_limit_descriptor_stops_every_other_increment(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    clock: ManualClock,
    redis_server: RedisProcess,
) -> None:
    """LOCAL_CACHE_SIZE_IN_BYTES with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: once a
    descriptor is known to be over, requests that carry it count no other hit, on either
    backend."""
    config_dir.write("t.yaml", TWO)
    hour = int(EPOCH) // 3600 * 3600
    redis_backend = RedisBackend(parse_backend_url(redis_server.url, 4, 5.0), server_time=False)
    for backend, prefix in ((MemoryBackend(clock), "m_"), (redis_backend, "lcs_")):
        server = make_server(
            backend=backend,
            cache_key_prefix=prefix,
            local_cache_size_in_bytes=100_000,
            stop_cache_key_increment_when_overlimit=True,
        )
        if prefix == "lcs_":
            with redis_server.client() as r:
                r.delete(f"lcs_two_big_b_{hour}", f"lcs_two_small_s_{int(EPOCH)}")
        assert codes(server.ask("two", [("small", "s")], [("big", "b")])) == ["OK", "OK"]
        # Over in the store: only the over counter moves, and the key enters the cache.
        assert codes(server.ask("two", [("small", "s")], [("big", "b")])) == ["OVER_LIMIT", "OK"]
        # Over from the cache: no round trip for it, and still nothing else is counted.
        for _ in range(3):
            got = server.ask("two", [("small", "s")], [("big", "b")])
            assert codes(got) == ["OVER_LIMIT", "OK"]
            assert got.statuses[1].limit_remaining == 99
        assert (
            server.stat("ratelimit.service.rate_limit.two.small.over_limit_with_local_cache") == 3
        )
        assert codes(server.ask("two", [("big", "b")])) == ["OK"]
        assert server.ask("two", [("big", "b")]).statuses[0].limit_remaining == 97
        if prefix == "lcs_":
            with redis_server.client() as r:
                assert r.get(f"lcs_two_big_b_{hour}") == b"3"


# -- startup and health, through `ferryman serve` ---------------------------------------------

GOOD = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


class Proc:
    """`ferryman serve` on free ports, ready once its debug port answers /status."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        full = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
        if "PYTHONPATH" in os.environ:
            full["PYTHONPATH"] = os.environ["PYTHONPATH"]
        # No drain on SIGTERM: these tests do not test it, and would wait it out at every stop.
        full["FERRYMAN_SHUTDOWN_DRAIN"] = "0"
        self.grpc_port, self.http_port, self.debug_port = free_port(), free_port(), free_port()
        full.update(
            {
                "GRPC_HOST": "127.0.0.1",
                "GRPC_PORT": str(self.grpc_port),
                "HOST": "127.0.0.1",
                "PORT": str(self.http_port),
                "DEBUG_HOST": "127.0.0.1",
                "DEBUG_PORT": str(self.debug_port),
                "USE_STATSD": "false",
            }
        )
        full.update(env)
        self.log = tmp / f"serve-{uuid.uuid4().hex[:6]}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ferryman", "serve"],
                cwd=tmp,
                env=full,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        wait_for(f"/status answers ({self.log})", self.ready, timeout=30, ignoring=(OSError,))

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError("ferryman serve exited:\n" + self.text)
        self.get("/status", self.debug_port)
        return True

    @property
    def text(self) -> str:
        return self.log.read_text()

    def get(self, path: str, port: int) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", path)
            reply = conn.getresponse()
            return reply.status, reply.read()
        finally:
            conn.close()

    def health(self) -> int:
        return self.get("/healthcheck", self.http_port)[0]

    def grpc_health(self, target: str | None = None) -> str:
        with grpc.insecure_channel(target or f"127.0.0.1:{self.grpc_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service="ratelimit"), timeout=10)
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def ask(self, target: str | None = None) -> rls_pb2.RateLimitResponse:
        with grpc.insecure_channel(target or f"127.0.0.1:{self.grpc_port}") as channel:
            stub = rls_stub(channel)
            request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "v")])])
            reply: rls_pb2.RateLimitResponse = stub.ShouldRateLimit(request, timeout=10)
            return reply

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def start(**env: str) -> Proc:
        proc = Proc(tmp_path, env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def test_an_invalid_first_config_keeps_serving_until_a_good_one_appears(
    tmp_path: Path, serve: Callable[..., Proc]
) -> None:
    """As the reference: a rejected first configuration is logged (naming the file) and
    counted; every call is answered with the "no configuration loaded" error; the service
    stays healthy; a good file is picked up by the watch. (`ferryman check` stays strict.)"""
    config = tmp_path / "config"
    config.mkdir()
    (config / "x.yaml").write_text("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}\n")
    server = serve(
        RUNTIME_ROOT=str(tmp_path), RUNTIME_SUBDIRECTORY="", RUNTIME_APPDIRECTORY="config"
    )
    assert "config rejected, no configuration loaded" in server.text
    assert f"{config}/x.yaml" in server.text
    with pytest.raises(grpc.RpcError) as caught:
        server.ask()
    assert "no rate limit configuration is loaded" in str(caught.value.details())
    assert server.health() == 200
    stats = server.get("/stats", server.debug_port)[1].decode()
    assert "ratelimit.service.config_load_error: 1" in stats
    (config / "x.yaml").write_text(GOOD)
    wait_for(
        "the good file is loaded",
        lambda: server.ask().overall_code == rls_pb2.RateLimitResponse.OK,
        ignoring=(grpc.RpcError,),
    )


def test_healthy_with_at_least_one_config_loaded(
    tmp_path: Path, serve: Callable[..., Proc]
) -> None:
    """HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: HTTP and gRPC health report not serving
    until a domain is loaded, serving once one is, and not serving again when a reload
    leaves none."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "x.yaml").write_text("domain: [\n")
    server = serve(
        RUNTIME_ROOT=str(tmp_path),
        RUNTIME_APPDIRECTORY="config",
        HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED="true",
    )
    assert server.health() == 500
    assert server.grpc_health() == "NOT_SERVING"
    (config / "x.yaml").write_text(GOOD)
    wait_for("healthy", lambda: server.health() == 200)
    wait_for("gRPC serving", lambda: server.grpc_health() == "SERVING")
    (config / "x.yaml").unlink()
    wait_for("unhealthy again", lambda: server.health() == 500)
    wait_for("gRPC not serving", lambda: server.grpc_health() == "NOT_SERVING")


def test_force_start_without_initial_config_waits_for_the_directory(
    tmp_path: Path, serve: Callable[..., Proc]
) -> None:
    """FORCE_START_WITHOUT_INITIAL_CONFIG: the service starts with no configuration even
    when its directory does not exist yet, and loads it when it appears. Without it, a
    missing directory stops the start."""
    root = tmp_path / "runtime"
    env = {"RUNTIME_ROOT": str(root), "RUNTIME_APPDIRECTORY": "config"}
    server = serve(FORCE_START_WITHOUT_INITIAL_CONFIG="true", **env)
    with pytest.raises(grpc.RpcError):
        server.ask()
    (root / "config").mkdir(parents=True)
    (root / "config" / "x.yaml").write_text(GOOD)
    wait_for(
        "the directory is loaded",
        lambda: server.ask().overall_code == rls_pb2.RateLimitResponse.OK,
        timeout=20,
        ignoring=(grpc.RpcError,),
    )
    shutil.rmtree(root)
    with pytest.raises(AssertionError, match="exited"):
        serve(**env)


# -- gRPC listener ------------------------------------------------------------------------------


def test_grpc_uds_listens_on_a_unix_socket_instead_of_the_port(
    tmp_path: Path, serve: Callable[..., Proc]
) -> None:
    """GRPC_UDS: ShouldRateLimit and health are served on the socket, and GRPC_PORT is not
    bound."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "x.yaml").write_text(GOOD)
    sock = tmp_path / "rl.sock"
    server = serve(RUNTIME_ROOT=str(tmp_path), RUNTIME_APPDIRECTORY="config", GRPC_UDS=str(sock))
    target = f"unix:{sock}"
    assert server.ask(target).overall_code == rls_pb2.RateLimitResponse.OK
    assert server.grpc_health(target) == "SERVING"
    assert f"grpc unix:{sock}" in server.text
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5).close()


def test_grpc_max_connection_age_sends_goaway_and_clients_reconnect(
    tmp_path: Path, serve: Callable[..., Proc]
) -> None:
    """GRPC_MAX_CONNECTION_AGE / _GRACE: a connection older than the age is closed by the
    server (the client's channel goes idle, then reconnects), and calls keep succeeding."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "x.yaml").write_text(GOOD)
    server = serve(
        RUNTIME_ROOT=str(tmp_path),
        RUNTIME_APPDIRECTORY="config",
        GRPC_MAX_CONNECTION_AGE="1s",
        GRPC_MAX_CONNECTION_AGE_GRACE="1s",
    )
    states: list[grpc.ChannelConnectivity] = []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        channel.subscribe(states.append, try_to_connect=False)
        stub = rls_stub(channel)
        request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "v")])])
        stub.ShouldRateLimit(request, timeout=10)

        def aged_out() -> bool:
            ready = grpc.ChannelConnectivity.READY
            return (
                ready in states and grpc.ChannelConnectivity.IDLE in states[states.index(ready) :]
            )

        wait_for("the connection is aged out", aged_out, timeout=15)
        assert stub.ShouldRateLimit(request, timeout=10, wait_for_ready=True).overall_code == 1


# -- StatsD -------------------------------------------------------------------------------------


class Listener:
    """A UDP socket standing in for a StatsD agent: every line it receives."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []

    def receive(self) -> list[str]:
        with contextlib.suppress(TimeoutError):
            while True:
                data = self.sock.recv(65536)
                self.lines.extend(data.decode().split("\n"))
        return self.lines

    def total(self, prefix: str) -> int:
        """The sum of the counter lines whose name (and tags) is ``prefix``."""
        return sum(
            int(line[len(prefix) + 1 :].split("|")[0])
            for line in self.lines
            if line.startswith(prefix + ":")
        )


@pytest.fixture
def listener() -> Iterator[Listener]:
    udp = Listener()
    yield udp
    udp.sock.close()


def test_statsd_sends_the_reference_counters_with_extra_tags(
    tmp_path: Path, serve: Callable[..., Proc], listener: Listener
) -> None:
    """USE_STATSD (the reference's default sink) with STATSD_PROTOCOL=udp: every
    STATS_FLUSH_INTERVAL the counters that moved reach STATSD_HOST:STATSD_PORT as
    ``name:increase|c`` datagrams, under the reference's names, with EXTRA_TAGS appended as
    its statsd library does."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "x.yaml").write_text(GOOD)
    server = serve(
        RUNTIME_ROOT=str(tmp_path),
        RUNTIME_APPDIRECTORY="config",
        USE_STATSD="true",
        STATSD_PROTOCOL="udp",
        STATSD_HOST="127.0.0.1",
        STATSD_PORT=str(listener.port),
        STATS_FLUSH_INTERVAL="200ms",
        EXTRA_TAGS="env:test,zone:a",
    )
    for _ in range(7):
        server.ask()
    tags = ".__env=test.__zone=a"
    rule = "ratelimit.service.rate_limit.d.k"
    wait_for(
        "seven hits counted",
        lambda: listener.receive() and listener.total(f"{rule}.total_hits{tags}") == 7,
    )
    assert listener.total(f"{rule}.within_limit{tags}") == 5
    assert listener.total(f"{rule}.over_limit{tags}") == 2
    assert listener.total(f"{rule}.near_limit{tags}") == 1
    assert listener.total(f"ratelimit_server.ShouldRateLimit.total_requests{tags}") == 7
    assert listener.total(f"ratelimit.service.config_load_success{tags}") == 1
    assert "statsd udp 127.0.0.1:" in server.text


def test_statsd_over_tcp_by_default_reconnects_after_the_agent_restarts(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Without STATSD_PROTOCOL the lines go over one TCP connection, as the reference's
    statsd library sends them; an agent that closes it gets a new one at the next flush."""
    config_dir.write("x.yaml", GOOD)
    agent = socket.create_server(("127.0.0.1", 0))
    agent.settimeout(10)
    port = agent.getsockname()[1]
    received: list[str] = []

    def serve_one() -> None:
        conn, _ = agent.accept()
        with conn:
            conn.settimeout(10)
            buffer = b""
            while b"total_hits" not in buffer:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buffer += chunk
            received.extend(buffer.decode().splitlines())

    server = make_server(statsd_host="127.0.0.1", statsd_port=port, stats_flush_interval=0.1)
    try:
        for round_ in (1, 2):
            reader = threading.Thread(target=serve_one)
            reader.start()
            server.ask("d", [("k", "v")])
            reader.join(15)
            assert "ratelimit.service.rate_limit.d.k.total_hits:1|c" in received, round_
            received.clear()
    finally:
        agent.close()


def test_dog_statsd_tags_and_mogrifiers(
    tmp_path: Path, serve: Callable[..., Proc], listener: Listener
) -> None:
    """USE_DOG_STATSD: DogStatsD lines (``|#tag:value``); a mogrifier of
    USE_DOG_STATSD_MOGRIFIERS turns the per-rule names into one name with tags."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "x.yaml").write_text(GOOD)
    server = serve(
        RUNTIME_ROOT=str(tmp_path),
        RUNTIME_APPDIRECTORY="config",
        USE_DOG_STATSD="true",
        STATSD_HOST="127.0.0.1",
        STATSD_PORT=str(listener.port),
        STATS_FLUSH_INTERVAL="200ms",
        EXTRA_TAGS="env:test",
        USE_DOG_STATSD_MOGRIFIERS="hits",
        DOG_STATSD_MOGRIFIER_HITS_PATTERN=r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$",
        DOG_STATSD_MOGRIFIER_HITS_NAME="ratelimit.service.rate_limit.$3",
        DOG_STATSD_MOGRIFIER_HITS_TAGS="domain:$1,descriptor:$2",
    )
    for _ in range(3):
        server.ask()
    line = "ratelimit.service.rate_limit.total_hits:3|c|#domain:d,descriptor:k,env:test"
    wait_for("the mogrified line", lambda: line in listener.receive())
    assert "ratelimit_server.ShouldRateLimit.total_requests:3|c|#env:test" in listener.lines


def test_statsd_to_nowhere_and_disable_stats_are_harmless(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    listener: Listener,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """StatsD is on by default: with no agent listening the service answers as usual and
    says so once (INFO when StatsD was not asked for, WARNING when it was); with
    DISABLE_STATS nothing is sent at all."""
    config_dir.write("x.yaml", GOOD)
    closed = free_port()
    caplog.set_level(logging.INFO, logger="ferryman.statsd")
    for protocol, explicit in (("tcp", False), ("udp", False), ("tcp", True)):
        caplog.clear()
        quiet = make_server(
            statsd_host="127.0.0.1",
            statsd_port=closed,
            statsd_protocol=protocol,
            statsd_explicit=explicit,
            stats_flush_interval=0.05,
        )
        assert quiet.service.statsd is not None
        for _ in range(3):
            assert codes(quiet.ask("d", [("k", "v")])) == ["OK"]
            time.sleep(0.1)
        if protocol == "tcp":  # a refused UDP datagram is not even noticed
            [record] = [r for r in caplog.records if r.name == "ferryman.statsd"]
            assert record.levelno == (logging.WARNING if explicit else logging.INFO)
    off = make_server(disable_stats=True, statsd_host="127.0.0.1", statsd_port=listener.port)
    assert off.service.statsd is None
    off.ask("d", [("k", "v")])
    off.stop()
    assert listener.receive() == []


# -- Redis TLS ----------------------------------------------------------------------------------


def _cert(
    name: str, issuer: tuple[Any, Any] | None, ca: bool = False, dns: str | None = None
) -> tuple[Any, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if dns is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False
        )
    cert = builder.sign(key if issuer is None else issuer[1], hashes.SHA256())
    return cert, key


def _write(path: Path, cert: Any, key: Any) -> tuple[str, str]:
    crt, pem = path.with_suffix(".crt"), path.with_suffix(".key")
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(crt), str(pem)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, str]]]:
    """A redis-server that speaks TLS only to clients with a certificate of its CA; its
    certificate names ``localhost`` (not 127.0.0.1)."""
    work = tmp_path_factory.mktemp("tls")
    ca = _cert("test ca", None, ca=True)
    ca_file, _ = _write(work / "ca", *ca)
    server_crt, server_key = _write(work / "server", *_cert("localhost", ca, dns="localhost"))
    client_crt, client_key = _write(work / "client", *_cert("ferryman", ca))
    tls_port = free_port()
    proc = RedisProcess(
        work,
        None,
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        server_crt,
        "--tls-key-file",
        server_key,
        "--tls-ca-cert-file",
        ca_file,
        "--tls-auth-clients",
        "yes",
    ).start()
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_TLS": "true",
        "REDIS_TLS_CACERT": ca_file,
        "REDIS_TLS_CLIENT_CERT": client_crt,
        "REDIS_TLS_CLIENT_KEY": client_key,
        "REDIS_TIMEOUT": "2s",
    }
    yield tls_port, env
    proc.stop()


@pytest.mark.parametrize(
    ("host", "extra", "works"),
    [
        pytest.param("localhost", {}, True, id="verified"),
        pytest.param("127.0.0.1", {}, False, id="hostname-mismatch"),
        pytest.param(
            "127.0.0.1",
            {"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
            True,
            id="skip-hostname",
        ),
        pytest.param(
            "localhost",
            {"REDIS_TLS_CLIENT_CERT": "", "REDIS_TLS_CLIENT_KEY": ""},
            False,
            id="no-client-cert",
        ),
    ],
)
def test_redis_tls_files_and_hostname_verification(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    clock: ManualClock,
    tls_redis: tuple[int, dict[str, str]],
    host: str,
    extra: dict[str, str],
    works: bool,
) -> None:
    """REDIS_TLS_CACERT verifies the server, REDIS_TLS_CLIENT_CERT/_KEY authenticate
    ferryman, and REDIS_TLS_SKIP_HOSTNAME_VERIFICATION accepts a certificate for another
    name (its chain still checked)."""
    port, env = tls_redis
    config_dir.write("t.yaml", TWO)
    settings = Settings.from_env({**env, "REDIS_URL": f"{host}:{port}", **extra})
    server = make_server(backend=make_backend(settings, clock), cache_key_prefix="tls_")
    if works:
        wait_for("redis over TLS", server.service.backend.healthy, timeout=10)
        assert codes(server.ask("two", [("big", "b")])) == ["OK"]
    else:
        time.sleep(1.5)
        assert not server.service.backend.healthy()
        with pytest.raises(grpc.RpcError) as caught:
            server.ask("two", [("big", "b")])
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


# -- tracing ------------------------------------------------------------------------------------


class SpanReceiver:
    """Real OTLP receivers on loopback, HTTP (POST /v1/traces) and gRPC, keeping the
    resources of the spans they are sent."""

    def __init__(self) -> None:
        self.resources: list[dict[str, str]] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                receiver.keep(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True  # closing does not wait on a kept-alive connection
        self.http_port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver.paths.append("grpc")
                receiver.keep(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            Traces(), self.grpc
        )
        self.grpc_port = self.grpc.add_insecure_port("127.0.0.1:0")
        self.grpc.start()

    def keep(self, request: Any) -> None:
        for spans in request.resource_spans:
            self.resources.append(
                {kv.key: kv.value.string_value for kv in spans.resource.attributes}
            )

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.grpc.stop(None)


@pytest.fixture
def spans() -> Iterator[SpanReceiver]:
    """Receivers that outlive a server asked for after them (its last spans are sent as it
    stops)."""
    receiver = SpanReceiver()
    yield receiver
    receiver.close()


@pytest.mark.parametrize("protocol", ["", "grpc"], ids=["http-default", "grpc"])
def test_tracing_service_resource_and_exporter_protocol(
    tmp_path: Path, spans: SpanReceiver, serve: Callable[..., Proc], protocol: str
) -> None:
    """TRACING_EXPORTER_PROTOCOL (http, the reference's default, or grpc) picks the OTLP
    transport; TRACING_SERVICE_NAME / _NAMESPACE / _INSTANCE_ID name the service."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "x.yaml").write_text(GOOD)
    port = spans.grpc_port if protocol == "grpc" else spans.http_port
    server = serve(
        RUNTIME_ROOT=str(tmp_path),
        RUNTIME_APPDIRECTORY="config",
        TRACING_ENABLED="true",
        TRACING_EXPORTER_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        # Metrics go over gRPC: to the gRPC receiver, which refuses them at once (pushed to
        # the HTTP one, the last push retries until the stop's timeout).
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"http://127.0.0.1:{spans.grpc_port}",
        OTEL_BSP_SCHEDULE_DELAY="100",
        TRACING_SERVICE_NAME="edge-limits",
        TRACING_SERVICE_NAMESPACE="payments",
        TRACING_SERVICE_INSTANCE_ID="pod-7",
    )
    server.ask()
    wait_for("a span exported", lambda: spans.resources, timeout=15)
    resource = spans.resources[0]
    assert resource["service.name"] == "edge-limits"
    assert resource["service.namespace"] == "payments"
    assert resource["service.instance.id"] == "pod-7"
    assert spans.paths[0] == ("grpc" if protocol == "grpc" else "/v1/traces")


def test_the_service_is_named_ratelimit_by_default() -> None:
    """Without TRACING_SERVICE_NAME or OTEL_SERVICE_NAME the resource is the reference's
    "RateLimit"; OTEL_SERVICE_NAME still names it when set."""
    assert Settings.from_env({}).tracing_exporter_protocol == "http"
    assert telemetry_resource(Settings()).attributes[SERVICE_NAME] == "RateLimit"
    assert http_traces_url("collector:4318") == "http://collector:4318/v1/traces"
    assert http_traces_url("https://c/custom/path") == "https://c/custom/path"


@pytest.mark.parametrize("legacy", [False, True], ids=["seconds", "milliseconds"])
def test_prometheus_response_time_as_milliseconds(
    config_dir: ConfigDir, make_server: ServerFactory, legacy: bool
) -> None:
    """PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS: the response-time histogram keeps its
    name and records milliseconds, as the reference's legacy form does."""
    config_dir.write("x.yaml", GOOD)
    server = make_server(
        use_prometheus=True,
        prometheus_addr="127.0.0.1:0",
        prometheus_response_time_as_milliseconds=legacy,
    )
    for _ in range(3):
        server.ask("d", [("k", "v")])
    assert server.service.prometheus_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.service.prometheus_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    rows = [
        line
        for line in text.splitlines()
        if line.startswith(
            'ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit"'
        )
    ]
    smallest = rows[0].split('le="')[1].split('"')[0]
    assert float(smallest) == (0.1 if legacy else 0.0001)


# -- Sentinel's own password --------------------------------------------------------------------


@pytest.fixture
def guarded_sentinel(tmp_path: Path) -> Iterator[tuple[RedisProcess, int]]:
    """A master with the password ``serverpass`` and a sentinel with ``sentinelpass``."""
    master = RedisProcess(tmp_path / "master", None, "--requirepass", "serverpass")
    master.client = lambda: redis.Redis(  # type: ignore[method-assign]
        port=master.port, password="serverpass", socket_timeout=5
    )
    master.start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\nrequirepass sentinelpass\n"
        f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
        "sentinel auth-pass mymaster serverpass\n"
    )
    proc = subprocess.Popen(
        [require_binary("redis-server"), str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with redis.Redis(port=port, password="sentinelpass", socket_timeout=2) as client:
            wait_for(
                "the sentinel knows its master",
                lambda: client.sentinel_get_master_addr_by_name("mymaster"),
                timeout=10,
                ignoring=(redis.RedisError,),
            )
        yield master, port
    finally:
        stop_process(proc)
        master.stop()


@pytest.mark.parametrize("sentinel_auth", ["sentinelpass", ""], ids=["given", "missing"])
def test_redis_sentinel_auth_is_the_sentinels_own_password(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    clock: ManualClock,
    guarded_sentinel: tuple[RedisProcess, int],
    sentinel_auth: str,
) -> None:
    """REDIS_SENTINEL_AUTH authenticates to the sentinels, REDIS_AUTH to the master; without
    it the sentinels refuse and the backend stays unhealthy."""
    master, port = guarded_sentinel
    config_dir.write("t.yaml", TWO)
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_TYPE": "sentinel",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"mymaster,127.0.0.1:{port}",
        "REDIS_AUTH": "serverpass",
        "REDIS_SENTINEL_AUTH": sentinel_auth,
        "REDIS_TIMEOUT": "2s",
    }
    server = make_server(
        backend=make_backend(Settings.from_env(env), clock), cache_key_prefix="sa_"
    )
    if sentinel_auth:
        wait_for("the master through the sentinel", server.service.backend.healthy, timeout=10)
        assert codes(server.ask("two", [("big", "b")])) == ["OK"]
        with master.client() as client:
            assert client.get(f"sa_two_big_b_{int(EPOCH) // 3600 * 3600}") == b"1"
    else:
        time.sleep(1.5)
        assert not server.service.backend.healthy()


MAPPING = r"""
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "rl_hits"
    labels: {domain: "$1", descriptor: "$2"}
  - match: 'ratelimit\.service\.config_load_.*'
    match_type: regex
    action: drop
"""


def test_prometheus_mapper_yaml_names_the_counters(
    tmp_path: Path, config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """PROMETHEUS_MAPPER_YAML: counters are served under the file's names and labels (or
    dropped); unmatched ones with their statsd names escaped; histograms as usual."""
    config_dir.write("x.yaml", GOOD)
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(MAPPING)
    server = make_server(
        use_prometheus=True,
        prometheus_addr="127.0.0.1:0",
        prometheus_mapper_yaml=str(mapping),
    )
    for _ in range(3):
        server.ask("d", [("k", "v")])
    assert server.service.prometheus_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.service.prometheus_port, timeout=10)
    conn.request("GET", "/metrics")
    lines = conn.getresponse().read().decode().splitlines()
    conn.close()
    assert 'rl_hits{domain="d",descriptor="k"} 3' in lines
    assert "ratelimit_server_ShouldRateLimit_total_requests 3" in lines
    assert "ratelimit_service_rate_limit_d_k_within_limit 3" in lines
    assert not [ln for ln in lines if "config_load" in ln]
    assert not [ln for ln in lines if ln.startswith("ratelimit_service_rate_limit_total_hits")]
    assert any(ln.startswith("ratelimit_service_response_time_seconds_bucket") for ln in lines)


def test_a_bad_mapper_file_stops_the_start(tmp_path: Path, config_dir: ConfigDir) -> None:
    """A mapping file that cannot be read or has no mappings is named at start."""
    config_dir.write("x.yaml", GOOD)
    (tmp_path / "bad.yaml").write_text("mappings: {}\n")
    for path in (tmp_path / "missing.yaml", tmp_path / "bad.yaml"):
        settings = Settings(
            config_dir=config_dir.path,
            use_prometheus=True,
            prometheus_mapper_yaml=str(path),
            use_statsd=False,
        )
        with pytest.raises(SettingsError, match="PROMETHEUS_MAPPER_YAML"):
            Service(settings)


# -- memcache -----------------------------------------------------------------------------------


class Memcached:
    """A real memcached on a loopback port."""

    def __init__(self) -> None:
        binary = shutil.which("memcached")
        if binary is None:
            missing("memcached is not installed (apt-get install memcached)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "-l", "127.0.0.1", "-p", str(self.port), "-U", "0", "-u", "root"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            "memcached answers",
            lambda: _connects(self.port),
            ignoring=(OSError,),
        )

    def get(self, key: str) -> bytes | None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(f"get {key}\r\n".encode())
            data = b""
            while not data.endswith(b"END\r\n"):
                data += conn.recv(65536)
        if not data.startswith(b"VALUE"):
            return None
        return data.split(b"\r\n")[1]

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def memcached_pair() -> Iterator[tuple[Memcached, Memcached]]:
    first = Memcached()
    try:
        second = Memcached()
    except BaseException:
        first.stop()
        raise
    yield first, second
    second.stop()
    first.stop()


def test_memcache_backend_counts_in_memcached_under_the_reference_keys(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    clock: ManualClock,
    memcached_pair: tuple[Memcached, Memcached],
) -> None:
    """BACKEND_TYPE=memcache with MEMCACHE_HOST_PORT: counters live in memcached under the
    reference's keys, each on the server its client would pick (CRC-32 of the key); limits,
    STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT and give-backs work as on the other backends."""
    config_dir.write("t.yaml", TWO)
    servers = ",".join(f"127.0.0.1:{m.port}" for m in memcached_pair)
    settings = Settings.from_env({"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": servers})
    assert settings.memcache_servers == tuple(("127.0.0.1", m.port) for m in memcached_pair)
    server = make_server(
        backend=make_backend(settings, clock),
        cache_key_prefix="mc_",
        stop_cache_key_increment_when_overlimit=True,
    )
    assert server.service.backend.name == "memcache"
    assert codes(server.ask("two", [("small", "s")], [("big", "b")])) == ["OK", "OK"]
    got = server.ask("two", [("small", "s")], [("big", "b")])
    assert codes(got) == ["OVER_LIMIT", "OK"]
    assert got.statuses[1].limit_remaining == 99  # big was not counted again
    keys = {
        f"mc_two_small_s_{int(EPOCH)}": b"2",
        f"mc_two_big_b_{int(EPOCH) // 3600 * 3600}": b"1",
    }
    for key, value in keys.items():
        owner = memcached_pair[zlib.crc32(key.encode()) % 2]
        other = memcached_pair[1 - zlib.crc32(key.encode()) % 2]
        assert (owner.get(key), other.get(key)) == (value, None)
    back = descriptor([("big", "b")], negative=True)
    assert server.ask("two", back).statuses[0].limit_remaining == 100
    with pytest.raises(SettingsError, match="MEMCACHE_HOST_PORT"):
        Settings.from_env({"BACKEND_TYPE": "memcache"})


def test_memcache_down_is_unavailable(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """An unreachable memcached: calls get UNAVAILABLE (Envoy's failure_mode_deny decides)
    and, with health asked to require the backend, the service reports unhealthy."""
    config_dir.write("t.yaml", TWO)
    settings = Settings.from_env(
        {"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": f"127.0.0.1:{free_port()}"}
    )
    server = make_server(backend=make_backend(settings, clock), health_requires_backend=True)
    with pytest.raises(grpc.RpcError) as caught:
        server.ask("two", [("big", "b")])
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert not server.service.healthy()


def _connects(port: int) -> bool:
    """Whether a TCP connection to the port opens (then closed at once)."""
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    return True
