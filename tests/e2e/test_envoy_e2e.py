"""Through a real Envoy: envoy/front-proxy.yaml in front of a stdlib upstream, asking a real
`ferryman serve` that loads descriptors/edge-proxy.yaml and descriptors/burst-cookbook.yaml."""

from __future__ import annotations

import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
    Reply,
    Upstream,
    in_one_window,
    render,
    request,
    require_envoy,
    wait_for,
    within,
)
from helpers.ports import free_port

pytestmark = pytest.mark.e2e

DESCRIPTORS = ("edge-proxy.yaml", "burst-cookbook.yaml")


@dataclass
class Mesh:
    """Envoy on ``port`` in front of ``upstream``, asking ``ferryman`` (config in ``config``)."""

    port: int
    envoy: EnvoyProcess
    ferryman: FerrymanProcess
    upstream: Upstream
    config: Path

    def stats(self) -> dict[str, int]:
        status, _, body = request(self.ferryman.debug_port, "/stats")
        assert status == 200
        pairs = (line.rsplit(": ", 1) for line in body.decode().splitlines() if ": " in line)
        return {name: int(value) for name, value in pairs}


def serve_args(config: Path) -> list[str]:
    return ["--config", str(config), "--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]


def start_envoy(
    name: str, workdir: Path, upstream: Upstream, ferryman: FerrymanProcess
) -> tuple[EnvoyProcess, int]:
    """Envoy on the committed config ``envoy/<name>``, its ports mapped to free ones."""
    admin, listener = free_port(), free_port()
    ports = {
        ADMIN: admin,
        LISTENER: listener,
        UPSTREAM: upstream.port,
        FERRYMAN: ferryman.grpc_port,
    }
    envoy = EnvoyProcess(render(ENVOY_DIR / name, ports), workdir, admin).start()
    return envoy, listener


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    server = Upstream().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[Mesh]:
    """One ferryman and one front-proxy Envoy for the module; tests keep apart by client
    address (127.0.0.N, for the per-IP rule), user id or route."""
    require_envoy()
    workdir = tmp_path_factory.mktemp("mesh")
    config = workdir / "config"
    config.mkdir()
    for name in DESCRIPTORS:
        shutil.copy(ROOT / "descriptors" / name, config / name)
    ferryman = FerrymanProcess(workdir / "ferryman", serve_args(config)).start()
    try:
        envoy, port = start_envoy("front-proxy.yaml", workdir / "envoy", upstream, ferryman)
    except BaseException:
        ferryman.kill()
        raise
    yield Mesh(port, envoy, ferryman, upstream, config)
    envoy.stop()
    ferryman.kill()


def ratelimit_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith("x-ratelimit-")}


def test_under_the_limit_200_over_it_429_with_ratelimit_headers(mesh: Mesh) -> None:
    """Per-IP: 100 answers a minute with x-ratelimit-* headers, then 429; other IPs pass."""

    def send(attempt: int) -> tuple[list[Reply], Reply]:
        with Client(mesh.port, source=f"127.0.{attempt}.2") as client:
            replies = [client.get("/") for _ in range(101)]
        return replies, request(mesh.port, "/", source=f"127.0.{attempt}.3")

    replies, other = in_one_window(send, 60)
    assert [status for status, _, _ in replies] == [200] * 100 + [429]
    _, headers, body = replies[0]
    assert body == b"upstream\n"
    assert headers["x-ratelimit-limit"] == '100, 100;w=60;name="per_ip"'
    assert headers["x-ratelimit-remaining"] == "99"
    assert 0 <= int(headers["x-ratelimit-reset"]) <= 60
    _, headers, _ = replies[100]
    assert headers["x-envoy-ratelimited"] == "true"
    assert headers["x-ratelimit-limit"] == '100, 100;w=60;name="per_ip"'
    assert headers["x-ratelimit-remaining"] == "0"
    assert 0 <= int(headers["x-ratelimit-reset"]) <= 60
    assert other[0] == 200


def test_partner_header_replaces_the_per_ip_limit(mesh: Mesh) -> None:
    """A header_value_match descriptor (x-plan: partner) replaces the per-IP limit."""

    def send(attempt: int) -> tuple[list[int], Reply]:
        with Client(mesh.port, source=f"127.0.{attempt}.4") as client:
            statuses = [client.get("/")[0] for _ in range(101)]
            return statuses, client.get("/", {"x-plan": "partner"})

    statuses, (status, headers, _) = in_one_window(send, 60)
    assert statuses == [200] * 100 + [429]
    assert status == 200
    assert headers["x-ratelimit-limit"] == '1000, 1000;w=60;name="partners"'


def test_generic_key_and_path_header_share_one_counter_per_second(mesh: Mesh) -> None:
    """generic_key + :path descriptors share one 10/s counter over /api/*: the 11th is 429."""

    def send(attempt: int) -> list[Reply]:
        with Client(mesh.port, source=f"127.0.{attempt}.5") as client:
            return [client.get(f"/api/item/{i}") for i in range(11)]

    replies = in_one_window(send, 1)
    assert [status for status, _, _ in replies] == [200] * 10 + [429]
    assert replies[0][1]["x-ratelimit-limit"].startswith("10, 10;w=1")
    assert replies[9][1]["x-ratelimit-remaining"] == "0"


def test_shadow_mode_lets_traffic_through_and_hits_addend_weighs_each_request(
    mesh: Mesh,
) -> None:
    """Shadow mode passes /bulk past its limit; its own hits_addend counts 5 hits a request."""
    prefix = "ratelimit.service.rate_limit.edge-proxy.generic_key_bulk."
    names = ("total_hits", "shadow_mode")

    def send(attempt: int) -> tuple[list[int], dict[str, int]]:
        before = mesh.stats()
        with Client(mesh.port, source=f"127.0.{attempt}.6") as client:
            statuses = [client.get("/bulk")[0] for _ in range(5)]
        after = mesh.stats()
        return statuses, {n: after.get(prefix + n, 0) - before.get(prefix + n, 0) for n in names}

    statuses, counted = in_one_window(send, 1)
    assert statuses == [200] * 5
    assert counted == {"total_hits": 25, "shadow_mode": 5}


def test_simple_burst_tier_allows_five_per_second(mesh: Mesh) -> None:
    """Burst tier simple_user (domain set per route): 5 per second pass, the 6th is 429."""

    def send(attempt: int) -> tuple[list[Reply], Reply]:
        user = uuid.uuid4().hex
        with Client(mesh.port) as client:
            replies = [client.get("/burst/simple", {"x-user-id": user}) for _ in range(6)]
            return replies, client.get("/burst/simple", {"x-user-id": user + "-other"})

    replies, other = within(send, 0.9)
    assert [status for status, _, _ in replies] == [200] * 5 + [429]
    assert replies[0][1]["x-ratelimit-limit"] == "5, 5;w=1"
    assert [h["x-ratelimit-remaining"] for _, h, _ in replies[:5]] == ["4", "3", "2", "1", "0"]
    assert other[0] == 200


def test_penalty_tier_lets_a_burst_past_the_first_tier(mesh: Mesh) -> None:
    """Burst tier penalty_user: past 5 per second the user bursts into the 50/s tier."""

    def send(attempt: int) -> list[Reply]:
        user = uuid.uuid4().hex
        with Client(mesh.port) as client:
            return [client.get("/burst/penalty", {"x-user-id": user}) for _ in range(12)]

    replies = within(send, 0.9)
    assert [status for status, _, _ in replies] == [200] * 12
    assert replies[4][1]["x-ratelimit-limit"] == "5, 5;w=1"
    assert replies[5][1]["x-ratelimit-limit"] == "50, 50;w=1"
    assert replies[11][1]["x-ratelimit-remaining"] == "43"


def test_prison_tier_keeps_blocking_after_the_first_window(mesh: Mesh) -> None:
    """Burst tier prison_user: past 5 per second, still 429 a second later (prison tier)."""
    user = ""

    def send(attempt: int) -> list[int]:
        nonlocal user
        user = uuid.uuid4().hex
        with Client(mesh.port) as client:
            return [client.get("/burst/prison", {"x-user-id": user})[0] for _ in range(7)]

    statuses = within(send, 0.9)
    time.sleep(1.1)
    status, headers, _ = request(mesh.port, "/burst/prison", {"x-user-id": user})
    assert statuses == [200] * 6 + [429]
    assert status == 429
    assert headers["x-ratelimit-remaining"] == "0"
    assert 1 <= int(headers["x-ratelimit-reset"]) <= 15


def _per_ip(limit: int) -> str:
    text = (ROOT / "descriptors" / "edge-proxy.yaml").read_text()
    changed, count = re.subn(
        r"(name: per_ip\n\s+unit: minute\n\s+requests_per_unit: )100\b", rf"\g<1>{limit}", text
    )
    assert count == 1, "descriptors/edge-proxy.yaml no longer has the per_ip rule this test edits"
    return changed


def test_config_reload_changes_envoys_answers_without_a_restart(mesh: Mesh) -> None:
    """Editing ferryman's YAML changes Envoy's answers both ways; no process restarts."""
    assert mesh.envoy.proc is not None and mesh.ferryman.proc is not None
    pids = (mesh.envoy.proc.pid, mesh.ferryman.proc.pid)
    target = mesh.config / "edge-proxy.yaml"
    original = target.read_text()
    with Client(mesh.port, source="127.0.0.7") as client:
        assert [client.get("/")[0] for _ in range(3)] == [200] * 3
        try:
            target.write_text(_per_ip(2))

            def limited() -> dict[str, str] | None:
                status, headers, _ = client.get("/")
                return headers if status == 429 else None

            headers = wait_for(limited, timeout=10, interval=0.1)
            assert headers is not None
            assert headers["x-ratelimit-limit"] == '2, 2;w=60;name="per_ip"'
        finally:
            target.write_text(original)
        wait_for(lambda: client.get("/")[0] == 200, timeout=10, interval=0.1)
    assert mesh.envoy.proc is not None and mesh.ferryman.proc is not None
    assert (mesh.envoy.proc.pid, mesh.ferryman.proc.pid) == pids
    assert mesh.envoy.proc.poll() is None and mesh.ferryman.proc.poll() is None


def test_ferryman_stopped_fail_open_passes_fail_closed_blocks(
    tmp_path: Path, upstream: Upstream
) -> None:
    """With ferryman stopped, failure_mode_deny false passes traffic and true answers 500."""
    require_envoy()
    config = tmp_path / "config"
    config.mkdir()
    for name in DESCRIPTORS:
        shutil.copy(ROOT / "descriptors" / name, config / name)
    ferryman = FerrymanProcess(tmp_path / "ferryman", serve_args(config)).start()
    envoys: list[EnvoyProcess] = []
    try:
        open_envoy, open_port = start_envoy(
            "front-proxy.yaml", tmp_path / "open", upstream, ferryman
        )
        envoys.append(open_envoy)
        closed_envoy, closed_port = start_envoy(
            "front-proxy-fail-closed.yaml", tmp_path / "closed", upstream, ferryman
        )
        envoys.append(closed_envoy)
        for port in (open_port, closed_port):
            status, headers, _ = request(port, "/")
            assert status == 200
            assert "x-ratelimit-limit" in headers
        assert ferryman.stop() == 0

        status, headers, body = request(open_port, "/")
        assert (status, body) == (200, b"upstream\n")
        assert not ratelimit_headers(headers)
        status, _, _ = request(closed_port, "/")
        assert status == 500

        _, _, stats = request(open_envoy.admin_port, "/stats?filter=ratelimit")
        allowed = re.search(rb"ratelimit\.failure_mode_allowed: (\d+)", stats)
        assert allowed is not None and int(allowed.group(1)) >= 1
    finally:
        for envoy in envoys:
            envoy.stop()
        ferryman.kill()
