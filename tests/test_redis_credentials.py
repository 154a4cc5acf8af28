"""Redis credentials that rotate without a restart (REDIS_AUTH_FILE and its siblings), against
real redis-servers with ACL users: a file laid out as a Kubernetes Secret volume (its
``..data`` symlink swapped), read again when it changes and after Redis refuses it, new
connections using what it says while open ones go on, and the last credentials kept when it
cannot be read. A real `ferryman serve` under a paced ShouldRateLimit load has the ACL
password changed under it, with the file changed first or a moment after the server."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.backends.base import Watched
from ferryman.clock import ManualClock
from ferryman.connections import redis_auth
from ferryman.connections.redis import RedisConnection
from ferryman.connections.redis_target import RedisTarget, parse_backend_url
from ferryman.errors import BackendError, SettingsError
from ferryman.server.app import make_backend
from ferryman.settings import Settings

from helpers.pacing import paced
from helpers.redis_procs import RedisCluster, RedisFactory, RedisProcess, SentinelProcess
from helpers.serve_process import ServeProcess
from helpers.server import descriptor, overall, rls_stub, wait_for
from helpers.stores import unique_prefix

pytestmark = pytest.mark.redis

USER = "ferry"
# The longest a test waits for a connection to come back (the breaker's backoff is 3 s).
UNTIL = 20.0
CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000}
"""


class SecretVolume:
    """A directory laid out as kubelet lays out a Secret volume: each file a symlink into
    ``..data``, itself a symlink to a timestamped directory; an update writes a new
    directory and renames a new ``..data`` link over the old one, then removes the old
    directory."""

    def __init__(self, path: Path, name: str = "redis-auth") -> None:
        path.mkdir()
        self.path = path
        self.file = path / name
        self._writes = 0

    def write(self, text: str) -> None:
        self._writes += 1
        current = self.path / "..data"
        old = current.resolve() if current.is_symlink() else None
        new = self.path / f"..2026_11_28_00_00_{self._writes:02d}.{os.getpid()}"
        new.mkdir()
        (new / self.file.name).write_text(text)
        (self.path / "..data_tmp").symlink_to(new.name)
        os.replace(self.path / "..data_tmp", current)
        if not self.file.is_symlink():
            self.file.symlink_to(f"..data/{self.file.name}")
        if old is not None and old.exists():
            shutil.rmtree(old)


def _acl(node: RedisProcess, password: str) -> None:
    """USER may do anything, with ``password`` alone (the default user stays open)."""
    with node.client() as client:
        client.execute_command(
            "ACL", "SETUSER", USER, "on", "resetpass", f">{password}", "~*", "&*", "+@all"
        )


def _kill(node: RedisProcess, *which: str) -> int:
    """CLIENT KILL ``which`` (e.g. USER ferry) on ``node``; how many were cut."""
    with node.client() as client:
        return int(client.execute_command("CLIENT", "KILL", *which))


def _users(node: RedisProcess) -> set[str]:
    with node.client() as client:
        return {c["user"] for c in client.client_list() if c.get("user")}


async def _until(what: str, attempt: Callable[[], Awaitable[object]]) -> None:
    """Until ``attempt`` returns without BackendError (a cut connection's first call may
    fail: it was in flight); fails naming ``what`` after UNTIL seconds."""
    end = time.monotonic() + UNTIL
    while True:
        try:
            await attempt()
            return
        except BackendError:
            if time.monotonic() > end:
                raise AssertionError(f"not within {UNTIL}s: {what}") from None
            await asyncio.sleep(0.02)


async def _use(connection: RedisConnection, key: str) -> int:
    """A plain command and a script, as the config store and the counters send them."""
    await connection.command("SET", key, "1", key=key)
    return await connection.delete([key])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "No such file or directory"),
        ("", "is empty"),
        ("old\nnew\n", "holds more than one line"),
        ("ferry:\n", "names user 'ferry' but no password"),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_a_file_that_cannot_be_read_at_start_is_refused_naming_it(
    tmp_path: Path, text: str | bytes | None, problem: str
) -> None:
    """A missing, empty, two-line, user-without-password or undecodable file stops the
    start with an error that names the variable, the file and what is wrong with it."""
    path = tmp_path / "auth"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    target = RedisTarget(auth_file=str(path), variables="REDIS_PERSECOND")
    with pytest.raises(SettingsError) as caught:
        RedisConnection(target)
    assert str(caught.value).startswith(f"REDIS_PERSECOND_AUTH_FILE={str(path)!r}")
    assert problem in str(caught.value)


def test_the_file_reads_as_redis_auth_and_its_user_comes_before_redis_username(
    tmp_path: Path,
) -> None:
    """A password alone authenticates as REDIS_USERNAME (else the default user); a user in
    the file comes first; the first colon splits, so a password may hold colons; a final
    CRLF is dropped."""
    path = tmp_path / "auth"
    path.write_text("pw\n")
    assert redis_auth.FileCredentials(str(path), "V").get_credentials() == ("pw",)
    named = redis_auth.FileCredentials(str(path), "V", username="ferryman")
    assert named.get_credentials() == ("ferryman", "pw")
    path.write_bytes(b"rotated:pa:ss\r\n")
    assert named.get_credentials() == ("rotated", "pa:ss")
    assert named.reloads == 1


def test_a_file_and_a_password_together_are_refused(tmp_path: Path) -> None:
    """REDIS_AUTH (or a URL's password) with REDIS_AUTH_FILE, REDIS_SENTINEL_AUTH with its
    file, or a Sentinel password file without Sentinel: the start stops saying which."""
    path = tmp_path / "auth"
    path.write_text("pw\n")
    with pytest.raises(SettingsError, match="REDIS_AUTH_FILE is set and so is a password"):
        replace(parse_backend_url("redis://:pw@127.0.0.1:1"), auth_file=str(path))
    with pytest.raises(SettingsError, match="REDIS_SENTINEL_AUTH_FILE and REDIS_SENTINEL_AUTH"):
        RedisTarget("sentinel", sentinel_password="pw", sentinel_auth_file=str(path))
    with pytest.raises(SettingsError, match="REDIS_TYPE is not sentinel"):
        RedisTarget("single", sentinel_auth_file=str(path))


def test_serve_stops_at_start_when_the_auth_file_cannot_be_read(tmp_path: Path) -> None:
    """`ferryman serve` with REDIS_AUTH_FILE naming a missing file exits 2 with one line
    naming the variable and the file, and serves nothing."""
    missing = tmp_path / "secret" / "redis-auth"
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": "127.0.0.1:1",
        "REDIS_AUTH_FILE": str(missing),
    }
    process = ServeProcess(_config(tmp_path), env)
    try:
        assert process.wait_exit() == 2, process.text
        assert "ferryman serving" not in process.text
        line = f"ferryman: REDIS_AUTH_FILE={str(missing)!r}: No such file or directory"
        assert line in process.lines, process.text
    finally:
        process.kill()


@pytest.fixture
def sentinel(
    make_redis: RedisFactory, tmp_path: Path
) -> Iterator[tuple[RedisProcess, SentinelProcess]]:
    """A master watched by a Sentinel."""
    master = make_redis().start()
    watcher = SentinelProcess(tmp_path / "sentinel", master.port).start()
    yield master, watcher
    watcher.stop()


def _deployment(
    kind: str, request: pytest.FixtureRequest
) -> tuple[RedisTarget, list[RedisProcess]]:
    """The target (no credentials) and the nodes of a single Redis, the session's Cluster or
    a Sentinel's master."""
    if kind == "single":
        node: RedisProcess = request.getfixturevalue("own_redis")
        return parse_backend_url(node.url, timeout=5), [node]
    if kind == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return parse_backend_url(cluster.url, timeout=5), cluster.nodes
    master, watcher = request.getfixturevalue("sentinel")
    url = f"redis+sentinel://127.0.0.1:{watcher.port}/mymaster"
    return parse_backend_url(url, timeout=5), [master]


@pytest.mark.parametrize("kind", ["single", "cluster", "sentinel"])
def test_a_secret_volume_swap_is_used_by_new_connections_while_open_ones_go_on(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Single, Cluster and Sentinel: ferryman authenticates as the file's ACL user; the
    password changes on the server and the Secret volume swaps its ``..data`` link: the open
    connections go on without reconnecting, the change is noticed and logged, and once
    they are cut every new connection authenticates with the new password."""
    target, nodes = _deployment(kind, request)
    volume = SecretVolume(tmp_path / "secret")
    for node in nodes:
        _acl(node, "old-secret")
    volume.write(f"{USER}:old-secret\n")
    key = unique_prefix("cred") + "{k}"

    async def scenario() -> None:
        connection = RedisConnection(replace(target, auth_file=str(volume.file)))
        await connection.start()
        try:
            assert await _use(connection, key) == 1
            connects = connection.connects
            for node in nodes:
                _acl(node, "new-secret")
            volume.write(f"{USER}:new-secret\n")
            # Open connections are not dropped by a password change: calls go on at once.
            assert await _use(connection, key) == 1
            assert connection.connects == connects
            credentials = connection.rotating[0]
            credentials.refresh()  # as the health watch does within a second
            assert credentials.reloads == 1 and credentials.user == USER
            for node in nodes:
                _kill(node, "USER", USER)
            await _until("a call after the cut", lambda: _use(connection, key))
            for _ in range(20):
                assert await _use(connection, key) == 1
            assert connection.connects > connects
            assert connection.describe_state()["credentials"] == [credentials.describe()]
            assert credentials.describe()["read_failures"] == 0
        finally:
            await connection.close()

    asyncio.run(scenario())


def test_the_sentinels_own_password_file_rotates_too(
    tmp_path: Path, make_redis: RedisFactory
) -> None:
    """REDIS_SENTINEL_AUTH_FILE: the sentinels authenticate with their own file, the master
    with REDIS_AUTH_FILE's user; the sentinels' password changes, then their file: once
    every connection is cut, the master is found again through the sentinels with the new
    password."""
    master = make_redis().start()
    _acl(master, "server")
    watcher = SentinelProcess(tmp_path / "sentinel", master.port, password="watch-1").start()
    auth, sentinel_auth = tmp_path / "auth", tmp_path / "sentinel-auth"
    auth.write_text(f"{USER}:server\n")
    sentinel_auth.write_text("watch-1\n")
    target = replace(
        parse_backend_url(f"redis+sentinel://127.0.0.1:{watcher.port}/mymaster", timeout=5),
        auth_file=str(auth),
        sentinel_auth_file=str(sentinel_auth),
    )
    key = unique_prefix("cred") + "k"

    async def scenario() -> None:
        connection = RedisConnection(target)
        await connection.start()
        try:
            await _use(connection, key)
            with watcher.client() as client:
                client.execute_command("ACL", "SETUSER", "default", "resetpass", ">watch-2")
            watcher.password = "watch-2"
            sentinel_auth.write_text("watch-2\n")
            with watcher.client() as client:
                assert int(client.execute_command("CLIENT", "KILL", "SKIPME", "yes")) >= 1
            _kill(master, "USER", USER)
            await _until("the master through the sentinel", lambda: _use(connection, key))
            sentinels = [c for c in connection.rotating if c.variable.startswith("REDIS_SENT")]
            assert [c.reloads for c in sentinels] == [1]
        finally:
            await connection.close()

    try:
        asyncio.run(scenario())
    finally:
        watcher.stop()


def test_the_per_second_redis_reads_its_own_files(tmp_path: Path) -> None:
    """REDIS_PERSECOND_AUTH_FILE and REDIS_PERSECOND_SENTINEL_AUTH_FILE reach the per-second
    Redis (named so in errors and /status), REDIS_AUTH_FILE the main one."""
    main, second, watch = (tmp_path / name for name in ("main", "second", "watch"))
    main.write_text("ferryman:one")
    second.write_text("two")
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": "127.0.0.1:1",
        "REDIS_AUTH_FILE": str(main),
        "REDIS_PERSECOND": "true",
        "REDIS_PERSECOND_TYPE": "sentinel",
        "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
        "REDIS_PERSECOND_URL": "mymaster,127.0.0.1:2",
        "REDIS_PERSECOND_AUTH_FILE": str(second),
        "REDIS_PERSECOND_SENTINEL_AUTH_FILE": str(watch),
    }
    with pytest.raises(SettingsError, match=r"^REDIS_PERSECOND_SENTINEL_AUTH_FILE=.*No such"):
        make_backend(Settings.from_env(env), ManualClock(0))
    watch.write_text("three\n")
    backend = make_backend(Settings.from_env(env), ManualClock(0))
    assert isinstance(backend, Watched)
    described = [_described(connection) for connection in backend.connections()]
    assert described[0] == [("REDIS_AUTH_FILE", "ferryman")]
    assert described[1] == [
        ("REDIS_PERSECOND_AUTH_FILE", "default"),
        ("REDIS_PERSECOND_SENTINEL_AUTH_FILE", "default"),
    ]


def _described(connection: Any) -> list[tuple[str, str]]:
    """The variable and user of each credentials file of a connection, from its /status."""
    return [(c["variable"], c["user"]) for c in connection.describe_state()["credentials"]]


def test_an_unreadable_file_keeps_the_last_credentials_counted_and_logged_once(
    tmp_path: Path, own_redis: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """The file vanishes (its ``..data`` link points nowhere), then is empty: every read
    fails and is counted, the reason is logged once per reason, not per read, and a new
    connection still authenticates with the last credentials; a good file is used again."""
    _acl(own_redis, "kept")
    volume = SecretVolume(tmp_path / "secret")
    volume.write(f"{USER}:kept")
    key = unique_prefix("cred") + "k"

    async def scenario() -> None:
        connection = RedisConnection(
            replace(parse_backend_url(own_redis.url, timeout=5), auth_file=str(volume.file))
        )
        await connection.start()
        credentials = connection.rotating[0]
        try:
            shutil.rmtree((volume.path / "..data").resolve())
            with caplog.at_level(logging.WARNING, "ferryman.redis"):
                for _ in range(3):
                    assert not credentials.refresh()
                assert credentials.read_failures == 3
                _kill(own_redis, "USER", USER)
                await _until("a call on the last credentials", lambda: _use(connection, key))
                volume.write("")
                assert not credentials.refresh()
            missing = [r for r in caplog.records if "No such file" in r.getMessage()]
            empty = [r for r in caplog.records if "is empty" in r.getMessage()]
            assert len(missing) == 1 and len(empty) == 1, caplog.text
            assert "keeping the last redis credentials" in missing[0].getMessage()
            assert credentials.read_failures >= 4
            assert credentials.describe()["last_error"] == "is empty"
            _acl(own_redis, "next")
            volume.write(f"{USER}:next\n")
            _kill(own_redis, "USER", USER)
            await _until("a call on the next credentials", lambda: _use(connection, key))
            assert credentials.describe()["last_error"] is None
            assert credentials.reloads == 1
        finally:
            await connection.close()

    asyncio.run(scenario())


def test_a_refused_password_reads_the_file_again_and_the_next_connect_uses_it(
    tmp_path: Path, own_redis: RedisProcess
) -> None:
    """The server's password changes and the connection is cut before the file changes:
    calls fail (the breaker opens on the auth failures, the state says auth); the file is
    then updated in a way its stat does not show, and the connection comes back on its own
    with the new password, read again because Redis refused the old one."""
    _acl(own_redis, "before")
    path = tmp_path / "auth"
    path.write_text(f"{USER}:before\n")
    key = unique_prefix("cred") + "k"

    async def scenario() -> None:
        connection = RedisConnection(
            replace(parse_backend_url(own_redis.url, timeout=5), auth_file=str(path))
        )
        await connection.start()
        try:
            await _use(connection, key)
            _acl(own_redis, "after")
            _kill(own_redis, "USER", USER)
            failures = 0
            while connection.state != "down":
                try:
                    await _use(connection, key)
                except BackendError:
                    failures += 1
                await asyncio.sleep(0.01)
            assert failures >= 1 and connection.reason.startswith("auth:"), connection.reason
            credentials = connection.rotating[0]
            path.write_text(f"{USER}:after\n")
            # A change the file's stat cannot tell (written twice within the clock's tick):
            # only the read after a refusal finds it.
            credentials._stamp = redis_auth._stamp(str(path))
            assert not credentials.refresh()
            await _until("a call with the new password", lambda: _use(connection, key))
            assert credentials.reloads == 1
        finally:
            await connection.close()

    asyncio.run(scenario())


# -- a real `ferryman serve` under load -----------------------------------------------------


def _config(tmp_path: Path) -> Path:
    (tmp_path / "descriptors").mkdir(exist_ok=True)
    (tmp_path / "descriptors" / "d.yaml").write_text(CONFIG)
    return tmp_path


class Load:
    """ShouldRateLimit ``rate`` times a second from one thread (one call in flight at a
    time), each answer recorded in order: OK, OVER_LIMIT or the gRPC error's code."""

    def __init__(self, port: int, rate: float = 200) -> None:
        self.answers: list[str] = []
        self._stop = threading.Event()
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._stub = rls_stub(self._channel)
        self._request = rls_pb2.RateLimitRequest(domain="d", descriptors=[descriptor([("k", "")])])
        self._rate = rate
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for _ in paced(self._rate, self._stop):
            self.answers.append(self.ask())

    def ask(self) -> str:
        try:
            return overall(self._stub.ShouldRateLimit(self._request, timeout=5))
        except grpc.RpcError as exc:
            return str(exc.code().name)

    def wait(self, more: int, timeout: float = 30) -> None:
        """Until ``more`` answers after the ones so far."""
        target = len(self.answers) + more
        wait_for(f"{more} more answers", lambda: len(self.answers) >= target, timeout)

    def stop(self) -> Counter[str]:
        self._stop.set()
        self._thread.join(10)
        return Counter(self.answers)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._channel.close()


def _counted(node: RedisProcess) -> int:
    """Hits counted in Redis for d/k (every window)."""
    with node.client() as client:
        return sum(int(client.get(k) or 0) for k in client.scan_iter("d_k_*"))


def _stat(process: ServeProcess, name: str) -> int:
    url = f"http://127.0.0.1:{process.debug_port}/stats"
    with urllib.request.urlopen(url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            stat, _, value = line.partition(": ")
            if stat == name:
                return int(value)
    return 0


def _serve(tmp_path: Path, node: RedisProcess, auth: Path, **env: str) -> ServeProcess:
    process = ServeProcess(
        _config(tmp_path),
        {
            "BACKEND_TYPE": "redis",
            "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": f"127.0.0.1:{node.port}",
            "REDIS_AUTH_FILE": str(auth),
            **env,
        },
    )
    process.wait_serving()
    return process


def _connection(process: ServeProcess) -> dict[str, Any]:
    """/status's main Redis connection."""
    connection: dict[str, Any] = process.status()["backend"]["connections"][0]
    return connection


def _credentials(process: ServeProcess) -> dict[str, Any]:
    credentials: dict[str, Any] = _connection(process)["credentials"][0]
    return credentials


def test_serve_under_load_rotates_the_acl_password_without_a_failed_request(
    tmp_path: Path, own_redis: RedisProcess
) -> None:
    """Under a paced load, the ACL password changes on the server and then in the Secret
    volume: no call fails; every client connection is then cut and the service connects
    again with the new password, no call failing but the one in flight at the cut; Redis
    counted every OK answer."""
    _acl(own_redis, "first")
    volume = SecretVolume(tmp_path / "secret")
    volume.write(f"{USER}:first\n")
    process = _serve(tmp_path, own_redis, volume.file)
    load = Load(process.grpc_port)
    try:
        load.wait(100)
        _acl(own_redis, "second")
        load.wait(50)
        volume.write(f"{USER}:second\n")
        wait_for("the rotation noticed", lambda: _credentials(process)["reloads"] == 1, 10)
        load.wait(50)
        before_cut = Counter(load.answers)
        assert set(before_cut) == {"OK"}, before_cut
        assert _kill(own_redis, "TYPE", "normal", "SKIPME", "yes") >= 1
        load.wait(200)
        answers = load.stop()
        assert answers["OK"] >= len(load.answers) - 1, answers  # the call in flight at the cut
        assert _users(own_redis) == {"default", USER}
        counted = _counted(own_redis)
        assert answers["OK"] <= counted <= len(load.answers), (answers, counted)
        assert "redis credentials read again from REDIS_AUTH_FILE" in process.text
        assert process.stop() == 0, process.text
    finally:
        load.close()
        process.kill()


def test_serve_answers_with_its_policy_until_the_file_catches_up_with_the_server(
    tmp_path: Path, own_redis: RedisProcess
) -> None:
    """The password changes on the server and the connections are cut before the file
    changes: meanwhile calls are answered with FAIL_OPEN (OK, counted as degraded) and the
    status says why (auth); once the file is updated the service connects with it and
    every call is counted in Redis again."""
    _acl(own_redis, "first")
    path = tmp_path / "redis-auth"
    path.write_text(f"{USER}:first")
    process = _serve(tmp_path, own_redis, path, FAIL_OPEN="true")
    load = Load(process.grpc_port)
    degraded = "ratelimit.service.call.should_rate_limit.degraded"
    try:
        load.wait(50)
        _acl(own_redis, "second")
        _kill(own_redis, "TYPE", "normal", "SKIPME", "yes")
        wait_for("degraded answers", lambda: _stat(process, degraded) >= 5, 20)
        reason = _connection(process)["reason"]
        assert reason.startswith("auth:"), reason
        path.write_text(f"{USER}:second\n")
        wait_for("redis up again", lambda: _connection(process)["state"] == "up", 20)
        answers = load.stop()
        assert set(answers) == {"OK"}, answers  # FAIL_OPEN: degraded, never an error
        before, counted = _stat(process, degraded), _counted(own_redis)
        assert [load.ask() for _ in range(100)] == ["OK"] * 100
        assert _stat(process, degraded) == before
        assert _counted(own_redis) == counted + 100
        assert _credentials(process)["reloads"] == 1
        assert process.stop() == 0, process.text
    finally:
        load.close()
        process.kill()
