"""The Redis backend against real redis-server processes: key format, round trips, routing."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from redis.crc import key_slot

from ferryman._proto.envoy.service.ratelimit.v3 import rls_pb2
from ferryman.algorithms.fixed_window.local_cache import OverLimitCache
from ferryman.algorithms.fixed_window.model import CounterOp
from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import (
    RedisBackend,
    RedisTarget,
    RoutedBackend,
    parse_backend_url,
    target_from_env_style,
)
from ferryman.clock import ManualClock
from ferryman.connections.redis_pipe import PipelinedRedis, pack_command
from ferryman.errors import BackendError, SettingsError
from ferryman.server.app import make_backend
from ferryman.settings import Settings

from conftest import (
    EPOCH,
    MIXED,
    MIXED_REQUEST,
    ConfigDir,
    ServerFactory,
    codes,
    descriptor,
    overall,
    wait_for,
)
from redis_procs import RedisCluster, RedisProcess, free_port, require_binary, stop_process

DAY = 86400
JITTER = 300

MESSAGING = """
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
"""

THREE = """
domain: rt
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: c
    rate_limit: {unit: day, requests_per_unit: 100}
"""

LOCAL = """
domain: lc
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 100}
"""

PER_SECOND = """
domain: ps
descriptors:
  - key: sec
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: min
    rate_limit: {unit: minute, requests_per_unit: 5}
"""

SLOTS = """
domain: cl
descriptors:
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: broad
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: wide
    rate_limit: {unit: hour, requests_per_unit: 9}
"""


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}_"


def evalsha_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def remaining(response: rls_pb2.RateLimitResponse) -> list[int]:
    return [s.limit_remaining for s in response.statuses]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test alone, so its command stats are this test's."""
    server = RedisProcess(tmp_path / "own").start()
    yield server
    server.stop()


# -- 1. the reference's key format ------------------------------------------------------------


def test_counter_key_has_the_reference_format_count_and_ttl(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    redis_server: RedisProcess,
    clock: ManualClock,
) -> None:
    """A day limit counts under <prefix><domain>_<k>_<v>..._<windowstart> with TTL <= day+jitter."""
    config_dir.write("m.yaml", MESSAGING)
    clock.set(EPOCH + 5 * 3600 + 17.5)  # mid-day: the window still starts at EPOCH
    settings = Settings(
        backend="redis",
        redis_type="single",
        redis_socket_type="tcp",
        redis_url=f"127.0.0.1:{redis_server.port}",
        expiration_jitter_max_seconds=JITTER,
    )
    key = f"pfx_messaging_message_type_marketing_to_number_123_{int(EPOCH)}"
    with redis_server.client() as client:
        client.delete(key)
        server = make_server(
            backend=make_backend(settings, clock),
            cache_key_prefix="pfx_",
            expiration_jitter_max_seconds=JITTER,
        )
        entries = [("message_type", "marketing"), ("to_number", "123")]
        assert codes(server.ask("messaging", entries)) == ["OK"]
        assert client.get(key) == b"1"
        assert codes(server.ask("messaging", entries, hits=3)) == ["OK"]
        assert client.get(key) == b"4"
        ttl = client.ttl(key)
        assert 0 < ttl <= DAY + JITTER


def test_ferryman_counts_on_top_of_a_counter_the_reference_wrote(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    redis_server: RedisProcess,
    clock: ManualClock,
) -> None:
    """A key pre-set with INCRBY+EXPIRE as the reference does is the counter ferryman uses."""
    config_dir.write("m.yaml", MESSAGING)
    clock.set(EPOCH + 7200)
    key = f"pfx_messaging_message_type_marketing_to_number_456_{int(EPOCH)}"
    with redis_server.client() as client:
        client.delete(key)
        pipe = client.pipeline(transaction=False)
        pipe.incrby(key, 4)
        pipe.expire(key, DAY)
        pipe.execute()
        server = make_server(
            backend=RedisBackend(parse_backend_url(redis_server.url, timeout=5.0)),
            cache_key_prefix="pfx_",
        )
        entries = [("message_type", "marketing"), ("to_number", "456")]
        first = server.ask("messaging", entries)
        assert (codes(first), remaining(first)) == (["OK"], [0])
        second = server.ask("messaging", entries)
        assert (codes(second), remaining(second)) == (["OVER_LIMIT"], [0])
        assert client.get(key) == b"6"
        assert 0 < client.ttl(key) <= DAY


# -- 2. one round trip per request ------------------------------------------------------------


class CommandLog:
    """Every command a redis-server runs (MONITOR), until a marker ECHO arrives."""

    def __init__(self, server: RedisProcess) -> None:
        # Connected before MONITOR starts, so its handshake is not in the log.
        self._marker_client = server.client()
        self._marker_client.ping()
        self._client = server.client()
        self._monitor = self._client.monitor()
        self._monitor.__enter__()
        self.commands: list[dict[str, Any]] = []
        self._marker = f"end-{uuid.uuid4().hex}"
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            command = self._monitor.next_command()
            if self._marker in command["command"]:
                return
            self.commands.append(command)

    def finish(self) -> list[dict[str, Any]]:
        self._marker_client.echo(self._marker)
        self._marker_client.close()
        self._thread.join(10)
        assert not self._thread.is_alive(), "MONITOR never saw the end marker"
        self._monitor.__exit__()
        self._client.close()
        return self.commands


def test_a_request_mixing_kinds_sends_its_scripts_in_one_write(
    config_dir: ConfigDir, make_server: ServerFactory, own_redis: RedisProcess
) -> None:
    """A fixed window, burst tiers and held copies in one request: three scripts, and all
    three leave in one write, one round trip, not one after another."""
    config_dir.write("mx.yaml", MIXED)
    backend = RedisBackend(parse_backend_url(own_redis.url, timeout=5.0))
    server = make_server(backend=backend, cache_key_prefix=unique_prefix())
    request = MIXED_REQUEST
    # Warm-up, with calls at once so that every pooled connection opens: a command takes an
    # idle connection when it can, so only the request's own grouping keeps its scripts on one.
    with ThreadPoolExecutor(8) as pool:
        warm = list(pool.map(lambda _: codes(server.ask("mx", *request)), range(16)))
    assert warm == [["OK"] * 3] * 16
    with own_redis.client() as client:
        client.config_resetstat()
        before = backend.writes
        assert before is not None
        for i in range(8):
            response = server.ask("mx", *request)
            assert codes(response) == ["OK"] * 3
            assert response.statuses[0].limit_remaining == 100 - 17 - i
            assert response.statuses[2].limit_remaining == 100 - 17 - i  # holds are kept
        writes = backend.writes
        stats: dict[str, Any] = client.info("commandstats")
    assert writes is not None
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    assert calls["evalsha"] == 8 * 3
    # The health monitor's PINGs use the same client: each may add a write of its own.
    assert 8 <= writes - before <= 8 + calls.get("ping", 0)


def test_each_request_is_one_evalsha_and_nothing_else_from_the_client(
    config_dir: ConfigDir, make_server: ServerFactory, own_redis: RedisProcess
) -> None:
    """Ten 3-descriptor requests cost exactly ten EVALSHA calls; every GET/INCRBY is in Lua."""
    config_dir.write("rt.yaml", THREE)
    server = make_server(
        backend=RedisBackend(parse_backend_url(own_redis.url, timeout=5.0)),
        cache_key_prefix=unique_prefix(),
    )
    request = ([("a", "1")], [("b", "2")], [("c", "3")])
    for _ in range(4):  # warm-up: loads the script and opens every pooled connection
        assert codes(server.ask("rt", *request)) == ["OK"] * 3
    with own_redis.client() as client:
        client.config_resetstat()
        log = CommandLog(own_redis)
        for i in range(10):
            response = server.ask("rt", *request)
            assert remaining(response) == [95 - i] * 3
        commands = log.finish()
        stats: dict[str, Any] = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    assert calls["evalsha"] == 10
    assert "eval" not in calls
    assert calls["incrby"] == 30  # three counters per request, all inside the script
    assert calls.get("get", 0) <= 30
    from_clients = [c for c in commands if c["client_type"] != "lua"]
    from_lua = [c for c in commands if c["client_type"] == "lua"]
    client_verbs = [c["command"].split(" ", 1)[0].upper() for c in from_clients]
    assert client_verbs.count("EVALSHA") == 10
    assert set(client_verbs) <= {"EVALSHA", "PING"}, from_clients  # PING: the health monitor
    lua_verbs = {c["command"].split(" ", 1)[0].upper() for c in from_lua}
    assert lua_verbs <= {"GET", "INCRBY", "TTL", "EXPIRE"}  # TTL: a counter without expiry
    assert sum(c["command"].upper().startswith("INCRBY") for c in from_lua) == 30


# -- 3. local over-limit cache ----------------------------------------------------------------


def test_local_cache_answers_over_limit_without_redis_until_the_window_ends(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    own_redis: RedisProcess,
    clock: ManualClock,
) -> None:
    """Once over, a key is answered from the local cache (no EVALSHA) until the next window."""
    config_dir.write("lc.yaml", LOCAL)
    prefix = unique_prefix()
    server = make_server(
        backend=RedisBackend(parse_backend_url(own_redis.url, timeout=5.0)),
        cache_key_prefix=prefix,
        local_cache_size_in_bytes=100_000,
    )
    stat = "ratelimit.service.rate_limit.lc.user.over_limit_with_local_cache"
    key = f"{prefix}lc_user_u1_{int(EPOCH)}"
    with own_redis.client() as client:
        start = evalsha_calls(client)
        assert codes(server.ask("lc", [("user", "u1")])) == ["OK"]
        assert codes(server.ask("lc", [("user", "u1")])) == ["OK"]
        assert codes(server.ask("lc", [("user", "u1")])) == ["OVER_LIMIT"]
        assert evalsha_calls(client) - start == 3
        assert server.stat(stat) == 0
        for _ in range(5):
            assert overall(server.ask("lc", [("user", "u1")])) == "OVER_LIMIT"
        assert evalsha_calls(client) - start == 3
        assert server.stat(stat) == 5
        assert server.stat("ratelimit.service.rate_limit.lc.user.over_limit") == 6
        assert client.get(key) == b"3"
        # A request that also names an uncached counter still makes one call, for that one.
        mixed = server.ask("lc", [("user", "u1")], [("other", "x")])
        assert codes(mixed) == ["OVER_LIMIT", "OK"]
        assert evalsha_calls(client) - start == 4
        assert server.stat(stat) == 6
        assert client.get(key) == b"3"
        clock.advance(60)
        assert codes(server.ask("lc", [("user", "u1")])) == ["OK"]
        assert evalsha_calls(client) - start == 5
        assert server.stat(stat) == 6


def test_over_limit_cache_stays_within_its_byte_bound_and_evicts_the_oldest() -> None:
    """Adding many keys never takes size_bytes past max_bytes; the oldest keys go first."""
    cache = OverLimitCache(2_000)
    keys = [f"domain_user_{i:05d}_1700006400" for i in range(500)]
    for key in keys:
        cache.add(key, 1_700_006_460)
        assert 0 < cache.size_bytes <= cache.max_bytes
    assert 0 < len(cache) < len(keys)
    kept = len(cache)
    assert all(cache.contains(k, EPOCH) for k in keys[-kept:])
    assert not any(cache.contains(k, EPOCH) for k in keys[:-kept])
    assert not cache.contains(keys[-1], 1_700_006_460)  # its window has ended
    cache.add("x" * 5_000, 1_700_006_460)  # larger than the whole cache: not stored
    assert not cache.contains("x" * 5_000, EPOCH)
    assert cache.size_bytes <= cache.max_bytes


def test_over_limit_cache_evicts_the_least_recently_used() -> None:
    """A key read recently survives an eviction that takes an older, unread key."""
    cache = OverLimitCache(3 * (len("key-0") + 120))
    for name in ("key-0", "key-1", "key-2"):
        cache.add(name, 100)
    assert cache.contains("key-0", 50)
    cache.add("key-3", 100)
    assert [cache.contains(k, 50) for k in ("key-0", "key-1", "key-2", "key-3")] == [
        True,
        False,
        True,
        True,
    ]


# -- 4. REDIS_PERSECOND -----------------------------------------------------------------------


@pytest.fixture
def two_redis(tmp_path: Path) -> Iterator[tuple[RedisProcess, RedisProcess]]:
    main = RedisProcess(tmp_path / "main").start()
    try:
        fast = RedisProcess(tmp_path / "persecond").start()
    except BaseException:
        main.stop()
        raise
    yield main, fast
    fast.stop()
    main.stop()


def persecond_settings(main: RedisProcess, fast: RedisProcess, **changes: Any) -> Settings:
    return Settings(
        backend="redis",
        redis_type="single",
        redis_socket_type="tcp",
        redis_url=f"127.0.0.1:{main.port}",
        redis_persecond=True,
        redis_persecond_url=f"127.0.0.1:{fast.port}",
        redis_persecond_socket_type="tcp",
        redis_timeout=5.0,
        # Real-time TTLs while the test clock stands still: keep 1 s keys from lapsing.
        expiration_jitter_max_seconds=3600,
        **changes,
    )


def test_persecond_counters_go_to_the_persecond_redis(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    two_redis: tuple[RedisProcess, RedisProcess],
    clock: ManualClock,
) -> None:
    """With REDIS_PERSECOND, one request's second-limit key lands there, its minute key in main."""
    config_dir.write("ps.yaml", PER_SECOND)
    main, fast = two_redis
    backend = make_backend(persecond_settings(main, fast), clock)
    assert isinstance(backend, RoutedBackend)
    server = make_server(backend=backend, cache_key_prefix="p_")
    response = server.ask("ps", [("sec", "a")], [("min", "b")])
    assert (codes(response), remaining(response)) == (["OK", "OK"], [0, 4])
    second_key = f"p_ps_sec_a_{int(EPOCH)}"
    minute_key = f"p_ps_min_b_{int(EPOCH)}"
    with main.client() as m, fast.client() as f:
        assert (f.get(second_key), f.exists(minute_key)) == (b"1", 0)
        assert (m.get(minute_key), m.exists(second_key)) == (b"1", 0)
        assert 0 < f.ttl(second_key) <= 1 + 3600


def test_persecond_split_keeps_stop_increment_when_over_across_both_redis(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    two_redis: tuple[RedisProcess, RedisProcess],
    clock: ManualClock,
) -> None:
    """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a per-second over spares the main minute key."""
    config_dir.write("ps.yaml", PER_SECOND)
    main, fast = two_redis
    routed = make_server(
        backend=make_backend(persecond_settings(main, fast), clock),
        cache_key_prefix="s_",
        stop_cache_key_increment_when_overlimit=True,
    )
    memory = make_server(backend=MemoryBackend(clock), stop_cache_key_increment_when_overlimit=True)
    for _ in range(3):
        got = routed.ask("ps", [("sec", "a")], [("min", "b")])
        want = memory.ask("ps", [("sec", "a")], [("min", "b")])
        assert (codes(got), remaining(got)) == (codes(want), remaining(want))
    with main.client() as m:
        assert m.get(f"s_ps_min_b_{int(EPOCH)}") == b"1"


# -- 5. Sentinel ------------------------------------------------------------------------------


class SentinelProcess:
    """One redis sentinel watching ``mymaster``, its config in a writable file."""

    def __init__(self, workdir: Path, master_port: int) -> None:
        self.binary = require_binary("redis-server")
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"sentinel monitor mymaster 127.0.0.1 {master_port} 1\n"
            "sentinel down-after-milliseconds mymaster 1000\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SentinelProcess:
        self.proc = subprocess.Popen(
            [self.binary, str(self.conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        with redis.Redis(port=self.port, socket_timeout=2) as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    if client.sentinel_get_master_addr_by_name("mymaster"):
                        return self
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sentinel on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[tuple[RedisProcess, SentinelProcess]]:
    master = RedisProcess(tmp_path / "master").start()
    try:
        watcher = SentinelProcess(tmp_path / "sentinel", master.port).start()
    except BaseException:
        master.stop()
        raise
    yield master, watcher
    watcher.stop()
    master.stop()


@pytest.mark.parametrize("style", ["url", "env"])
def test_sentinel_backend_finds_the_master_and_counts_there(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    sentinel: tuple[RedisProcess, SentinelProcess],
    style: str,
) -> None:
    """Via redis+sentinel:// or REDIS_TYPE=sentinel, requests are counted in the master."""
    config_dir.write("m.yaml", MESSAGING)
    master, watcher = sentinel
    if style == "url":
        target = parse_backend_url(f"redis+sentinel://127.0.0.1:{watcher.port}/mymaster")
    else:
        target = target_from_env_style(
            "sentinel", f"mymaster,127.0.0.1:{watcher.port}", "tcp", "", False, 4, 5.0
        )
    assert (target.kind, target.master_name) == ("sentinel", "mymaster")
    server = make_server(backend=RedisBackend(target), cache_key_prefix="sn_")
    entries = [("message_type", "marketing"), ("to_number", "9")]
    for _ in range(6):
        server.ask("messaging", entries)
    assert codes(server.ask("messaging", entries)) == ["OVER_LIMIT"]
    with master.client() as client:
        key = f"sn_messaging_message_type_marketing_to_number_9_{int(EPOCH)}"
        assert client.get(key) == b"7"
    deadline = time.monotonic() + 5
    while not server.service.healthy() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.service.healthy()
    server.stop()
    gc.collect()  # a connection left open by close() would surface here as a ResourceWarning


def test_sentinel_failover_moves_counting_to_the_new_master(
    config_dir: ConfigDir, make_server: ServerFactory, tmp_path: Path
) -> None:
    """The master dies in mid-traffic and Sentinel promotes its replica: calls fail with
    UNAVAILABLE while there is no master, then count on the new one, which has the old
    one's counts, without a restart: exactly the limit is granted over the whole run."""
    config_dir.write("m.yaml", MESSAGING)  # 5 a day
    master = RedisProcess(tmp_path / "master", None, "--repl-diskless-sync-delay", "0").start()
    replica = RedisProcess(
        tmp_path / "replica", None, "--replicaof", "127.0.0.1", str(master.port)
    ).start()
    watcher: SentinelProcess | None = None
    try:
        with replica.client() as r:
            wait_for(
                "replication",
                lambda: r.info("replication")["master_link_status"] == "up",
                20,
                ignoring=(redis.RedisError,),
            )
        watcher = SentinelProcess(tmp_path / "sentinel", master.port).start()
        with redis.Redis(port=watcher.port, socket_timeout=2) as s:
            wait_for(
                "the sentinel seeing the replica",
                lambda: s.sentinel_slaves("mymaster"),
                20,
                ignoring=(redis.RedisError,),
            )
        target = parse_backend_url(
            f"redis+sentinel://127.0.0.1:{watcher.port}/mymaster", timeout=1.0
        )
        backend = RedisBackend(target)
        server = make_server(backend=backend, cache_key_prefix="fo_")
        entries = [("message_type", "marketing"), ("to_number", "7")]
        assert [overall(server.ask("messaging", entries)) for _ in range(2)] == ["OK", "OK"]
        with master.client() as m:
            assert m.wait(1, 5000) == 1  # the replica has the counts
        master.kill()
        answers: list[str] = []
        failures: list[grpc.StatusCode] = []
        deadline = time.monotonic() + 30
        while "OVER_LIMIT" not in answers and time.monotonic() < deadline:
            try:
                answers.append(overall(server.ask("messaging", entries)))
            except grpc.RpcError as exc:
                failures.append(exc.code())
                time.sleep(0.05)
        assert failures, "the calls while there was no master should have failed"
        assert set(failures) == {grpc.StatusCode.UNAVAILABLE}
        assert answers == ["OK", "OK", "OK", "OVER_LIMIT"]
        assert backend.writes  # the master is reached through the pipelined client
        with replica.client() as new_master:
            assert new_master.info("replication")["role"] == "master"
            key = f"fo_messaging_message_type_marketing_to_number_7_{int(EPOCH)}"
            assert new_master.get(key) == b"6"
    finally:
        if watcher is not None:
            watcher.stop()
        replica.stop()
        master.stop()


def test_a_read_only_reply_makes_the_client_connect_again(
    config_dir: ConfigDir, make_server: ServerFactory, tmp_path: Path
) -> None:
    """A master turned replica answers READONLY: that call is UNAVAILABLE and the connection
    is dropped, so the next call connects again (to whatever Sentinel or DNS names now)."""
    config_dir.write("m.yaml", MESSAGING)
    master = RedisProcess(tmp_path / "master", None, "--repl-diskless-sync-delay", "0").start()
    replica = RedisProcess(
        tmp_path / "replica", None, "--replicaof", "127.0.0.1", str(master.port)
    ).start()
    try:
        server = make_server(
            backend=RedisBackend(parse_backend_url(replica.url, timeout=2.0)),
            cache_key_prefix="ro_",
        )
        entries = [("message_type", "marketing"), ("to_number", "8")]
        with replica.client() as r:
            wait_for(
                "replication",
                lambda: r.info("replication")["master_link_status"] == "up",
                20,
                ignoring=(redis.RedisError,),
            )
            with pytest.raises(grpc.RpcError) as refused:
                server.ask("messaging", entries)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "READONLY" in (refused.value.details() or "")
            connections = r.info("stats")["total_connections_received"]
            r.execute_command("REPLICAOF", "NO", "ONE")
            assert overall(server.ask("messaging", entries)) == "OK"
            assert r.info("stats")["total_connections_received"] > connections
    finally:
        replica.stop()
        master.stop()


# -- 6. URL and environment parsing -----------------------------------------------------------


def test_parse_backend_url_reads_auth_host_port_and_db() -> None:
    """redis://user:pw@h:1/2 is a single target with credentials and database 2."""
    target = parse_backend_url("redis://user:p%40ss@h:1/2", pool_size=3, timeout=1.5)
    assert target == RedisTarget(
        "single",
        (("h", 1),),
        username="user",
        password="p@ss",
        db=2,
        pool_size=3,
        timeout=1.5,
    )


@pytest.mark.parametrize(
    ("url", "kind", "addresses", "tls"),
    [
        ("rediss://h:6380", "single", (("h", 6380),), True),
        ("redis://[::1]:7000/0", "single", (("::1", 7000),), False),
        ("redis+cluster://a:1,b:2", "cluster", (("a", 1), ("b", 2)), False),
        ("rediss+cluster://a:1,b:2,c:3", "cluster", (("a", 1), ("b", 2), ("c", 3)), True),
        (
            "redis+sentinel://s1:26379,s2:26380/mymaster",
            "sentinel",
            (("s1", 26379), ("s2", 26380)),
            False,
        ),
    ],
)
def test_parse_backend_url_schemes(
    url: str, kind: str, addresses: tuple[tuple[str, int], ...], tls: bool
) -> None:
    """Each URL scheme gives its deployment kind, every address, and TLS for rediss."""
    target = parse_backend_url(url)
    assert (target.kind, target.addresses, target.tls) == (kind, addresses, tls)


def test_parse_backend_url_unix_socket() -> None:
    """unix:///tmp/s.sock connects through that socket path."""
    target = parse_backend_url("unix:///tmp/s.sock")
    assert (target.kind, target.unix_path) == ("single", "/tmp/s.sock")


@pytest.mark.parametrize(
    "url",
    [
        "http://h:1",
        "memcached://h:11211",
        "redis://h:port",
        "redis://",
        "redis+cluster://a:1,b:x",
        "redis+sentinel://s:26379",
    ],
)
def test_parse_backend_url_rejects_bad_urls(url: str) -> None:
    """An unknown scheme, a missing or non-numeric port, or no master name is a SettingsError."""
    with pytest.raises(SettingsError):
        parse_backend_url(url)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("single", "h:1", "tcp", "", False), RedisTarget("single", (("h", 1),))),
        (
            ("SINGLE", "/tmp/r.sock", "unix", "pw", False),
            RedisTarget(unix_path="/tmp/r.sock", password="pw"),
        ),
        (
            ("cluster", "a:1,b:2", "tcp", "u:pw", True),
            RedisTarget("cluster", (("a", 1), ("b", 2)), username="u", password="pw", tls=True),
        ),
        (
            ("sentinel", "mymaster,s1:1,s2:2", "tcp", "", False),
            RedisTarget("sentinel", (("s1", 1), ("s2", 2)), master_name="mymaster"),
        ),
    ],
)
def test_target_from_env_style(
    args: tuple[str, str, str, str, bool], expected: RedisTarget
) -> None:
    """REDIS_TYPE / REDIS_URL / REDIS_SOCKET_TYPE / REDIS_AUTH / REDIS_TLS map onto a target."""
    assert target_from_env_style(*args, 10, 10.0) == expected


@pytest.mark.parametrize(
    ("kind", "url", "message"),
    [
        ("single", "no-port", "is not host:port"),
        ("single", "h:x", "has no numeric port"),
        ("single", "redis://h:6379", "is a URL"),
        ("cluster", "h:1,redis://h:2", "is a URL"),
        ("sentinel", "mymaster", "mastername,host:port"),
        ("ring", "h:1", "must be single, sentinel or cluster"),
    ],
)
def test_target_from_env_style_rejects_bad_values(kind: str, url: str, message: str) -> None:
    """A REDIS_URL without a numeric port or given as a URL, a sentinel without nodes, or a
    bad type is an error that says which."""
    with pytest.raises(SettingsError, match=message):
        target_from_env_style(kind, url, "tcp", "", False, 10, 10.0)


def test_make_backend_follows_the_reference_environment() -> None:
    """BACKEND_TYPE/REDIS_* pick memory, single, unix, cluster, sentinel or a routed pair."""
    clock = ManualClock(EPOCH)

    def built(env: dict[str, str]) -> Any:
        return make_backend(Settings.from_env(env), clock)

    assert isinstance(built({}), MemoryBackend)
    assert isinstance(built({"BACKEND_TYPE": "memory"}), MemoryBackend)
    unix = built({"BACKEND_TYPE": "redis"})
    assert isinstance(unix, RedisBackend)
    assert unix.target.unix_path == "/var/run/nutcracker/ratelimit.sock"
    single = built(
        {
            "BACKEND_TYPE": "redis",
            "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": "cache:6379",
            "REDIS_AUTH": "secret",
            "REDIS_TLS": "true",
            "REDIS_POOL_SIZE": "7",
            "REDIS_TIMEOUT": "2s",
        }
    )
    assert isinstance(single, RedisBackend)
    assert single.target == RedisTarget(
        "single", (("cache", 6379),), password="secret", tls=True, pool_size=7, timeout=2.0
    )
    cluster = built({"BACKEND_TYPE": "redis", "REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b:2"})
    assert isinstance(cluster, RedisBackend)
    assert (cluster.target.kind, cluster.target.addresses) == ("cluster", (("a", 1), ("b", 2)))
    sentinel = built({"BACKEND_TYPE": "redis", "REDIS_TYPE": "sentinel", "REDIS_URL": "m,s:26379"})
    assert isinstance(sentinel, RedisBackend)
    assert (sentinel.target.kind, sentinel.target.master_name) == ("sentinel", "m")
    routed = built(
        {
            "BACKEND_TYPE": "redis",
            "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": "main:1",
            "REDIS_PERSECOND": "true",
            "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
            "REDIS_PERSECOND_URL": "fast:2",
        }
    )
    assert isinstance(routed, RoutedBackend)
    url = make_backend(Settings(backend="redis+cluster://x:1,y:2"), clock)
    assert isinstance(url, RedisBackend)
    assert url.target.kind == "cluster"
    with pytest.raises(SettingsError):
        make_backend(Settings(backend="etcd://h:1"), clock)


# -- 7. Cluster -------------------------------------------------------------------------------


def spread_values(prefix: str, keys: tuple[str, ...], window: dict[str, int]) -> list[str]:
    """One value per descriptor key so that the counter keys land on three different nodes."""
    chosen: list[str] = []
    used: set[int] = set()
    for key in keys:
        for i in range(10_000):
            value = f"v{i}"
            third = key_slot(f"{prefix}cl_{key}_{value}_{window[key]}".encode()) * 3 // 16384
            if third not in used:
                used.add(third)
                chosen.append(value)
                break
    assert len(chosen) == len(keys)
    return chosen


def cluster_backend(cluster: RedisCluster) -> RedisBackend:
    return RedisBackend(parse_backend_url(cluster.url, pool_size=8, timeout=5.0))


def cluster_get(cluster: RedisCluster, keys: list[str]) -> list[int]:
    node = cluster.nodes[0]
    with redis.RedisCluster(host="127.0.0.1", port=node.port, socket_timeout=5) as client:
        return [int(client.get(k) or 0) for k in keys]


def test_cluster_slot_migration_is_followed_through_ask_and_moved(
    config_dir: ConfigDir, make_server: ServerFactory, tmp_path: Path
) -> None:
    """A counter's slot moves to another node between calls. While the slot migrates and
    the key is already on the new node, the old one answers ASK and the call goes there
    behind ASKING; once the slot has moved, MOVED makes the service read the slot map again.
    No call fails, and each hit is counted once, on the new node."""
    config_dir.write("m.yaml", MESSAGING)  # 5 a day
    cluster = RedisCluster(tmp_path / "cluster").start()
    try:
        prefix = "mg_"
        backend = cluster_backend(cluster)
        server = make_server(backend=backend, cache_key_prefix=prefix)
        entries = [("message_type", "marketing"), ("to_number", "3")]
        key = f"{prefix}messaging_message_type_marketing_to_number_3_{int(EPOCH)}"
        slot = key_slot(key.encode())
        assert overall(server.ask("messaging", entries)) == "OK"
        clients = {n.port: n.client() for n in cluster.nodes}
        try:
            ids = {
                port: c.execute_command("CLUSTER", "MYID").decode() for port, c in clients.items()
            }
            owner = next(
                int(row[2][1])
                for row in clients[cluster.nodes[0].port].execute_command("CLUSTER", "SLOTS")
                if row[0] <= slot <= row[1]
            )
            target = next(port for port in clients if port != owner)
            src, dst = clients[owner], clients[target]
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
            src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", key)
            assert dst.execute_command("ASKING") and int(dst.get(key) or 0) == 1
            assert overall(server.ask("messaging", entries)) == "OK"  # by ASK
            assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            for c in clients.values():
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
            answers = [overall(server.ask("messaging", entries)) for _ in range(4)]  # by MOVED
            assert answers == ["OK", "OK", "OK", "OVER_LIMIT"]
            assert int(dst.get(key) or 0) == 6
            assert backend.writes >= 6
        finally:
            for c in clients.values():
                c.close()
    finally:
        cluster.stop()


WINDOWS = {"tight": int(EPOCH), "broad": int(EPOCH), "wide": int(EPOCH)}


def test_cluster_counts_one_request_spread_over_three_nodes(
    config_dir: ConfigDir, make_server: ServerFactory, redis_cluster: RedisCluster
) -> None:
    """Three descriptors whose keys live on three nodes are each counted once per hit."""
    config_dir.write("cl.yaml", SLOTS)
    prefix = unique_prefix()
    names = ("tight", "broad", "wide")
    values = spread_values(prefix, names, WINDOWS)
    keys = [f"{prefix}cl_{k}_{v}_{WINDOWS[k]}" for k, v in zip(names, values, strict=True)]
    assert len({key_slot(k.encode()) * 3 // 16384 for k in keys}) == 3
    server = make_server(backend=cluster_backend(redis_cluster), cache_key_prefix=prefix)
    request = [[(k, v)] for k, v in zip(names, values, strict=True)]
    first = server.ask("cl", *request)
    assert (codes(first), remaining(first)) == (["OK"] * 3, [1, 4, 8])
    second = server.ask("cl", *request, hits=2)
    assert (codes(second), remaining(second)) == (["OVER_LIMIT", "OK", "OK"], [0, 2, 6])
    assert cluster_get(redis_cluster, keys) == [3, 3, 3]


def test_cluster_stop_increment_when_over_across_slots_matches_memory(
    config_dir: ConfigDir, make_server: ServerFactory, redis_cluster: RedisCluster
) -> None:
    """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT over keys on three nodes answers as memory does."""
    config_dir.write("cl.yaml", SLOTS)
    prefix = unique_prefix()
    names = ("tight", "broad", "wide")
    values = spread_values(prefix, names, WINDOWS)
    keys = [f"{prefix}cl_{k}_{v}_{WINDOWS[k]}" for k, v in zip(names, values, strict=True)]
    tight, broad, wide = ([(k, v)] for k, v in zip(names, values, strict=True))
    cluster = make_server(
        backend=cluster_backend(redis_cluster),
        cache_key_prefix=prefix,
        stop_cache_key_increment_when_overlimit=True,
    )
    memory = make_server(stop_cache_key_increment_when_overlimit=True)
    steps: list[tuple[list[Any], int]] = [
        ([tight, broad, wide], 0),
        ([tight, broad, wide], 0),
        ([tight, broad, wide], 0),  # tight goes over: only tight is incremented
        ([broad, wide], 2),
        ([tight, broad, wide], 0),
        ([broad, wide], 3),  # broad goes over: wide is spared
        ([wide], 2),
        # The same counter twice in one request: the second sees the first's hits.
        ([wide, wide, descriptor(tight, hits=0)], 2),
    ]
    for i, (request, hits) in enumerate(steps):
        got = cluster.ask("cl", *request, hits=hits)
        want = memory.ask("cl", *request, hits=hits)
        assert (overall(got), codes(got), remaining(got)) == (
            overall(want),
            codes(want),
            remaining(want),
        ), f"step {i}"
    # What the memory backend holds after these steps: blocked hits were not stored.
    assert cluster_get(redis_cluster, keys) == [4, 7, 8]


def test_redis_backend_reports_unhealthy_and_errors_when_redis_is_gone(tmp_path: Path) -> None:
    """With its Redis killed, the backend raises BackendError within its timeout."""
    proc = RedisProcess(tmp_path / "gone").start()
    backend = RedisBackend(parse_backend_url(proc.url, timeout=1.0))

    async def scenario() -> None:
        await backend.start()
        try:
            op = CounterOp("gone_k", 1, 5, 60, 60)
            assert [r.after for r in await backend.windows.apply([op], stop_when_over=False)] == [1]
            proc.kill()
            started = time.monotonic()
            with pytest.raises(BackendError):
                await backend.windows.apply([op], stop_when_over=False)
            assert time.monotonic() - started < 3
            assert not backend.healthy()
        finally:
            await backend.close()

    try:
        asyncio.run(scenario())
    finally:
        proc.stop()


@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_more_concurrent_requests_than_the_pool_size_wait_for_a_connection(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """With REDIS_POOL_SIZE=2, 60 concurrent calls all succeed (they queue, never error)."""
    fixture = "redis_server" if kind == "single" else "redis_cluster"
    url = request.getfixturevalue(fixture).url
    backend = RedisBackend(parse_backend_url(url, pool_size=2, timeout=5.0))
    prefix = unique_prefix()

    async def scenario() -> list[int]:
        await backend.start()
        try:
            calls = [
                backend.windows.apply(
                    [CounterOp(f"{prefix}k{i % 3}", 1, 1000, 60, 60)], stop_when_over=False
                )
                for i in range(60)
            ]
            results = await asyncio.gather(*calls)
            final = await backend.windows.apply(
                [CounterOp(f"{prefix}k{i}", 0, 1000, 60, 60) for i in range(3)],
                stop_when_over=False,
            )
            assert sorted(r[0].after for r in results) == sorted(list(range(1, 21)) * 3)
            return [r.after for r in final]
        finally:
            await backend.close()

    assert asyncio.run(scenario()) == [20, 20, 20]


# --------------------------------------------------------------------------- batching


class _Writes:
    """Counts the writes a PipelinedRedis connection makes (each is one batch)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def wrap(self, client: PipelinedRedis) -> None:
        channel = client._link
        assert channel is not None and channel.transport is not None
        transport = channel.transport
        write = transport.write

        def counted(data: Any) -> None:
            self.sizes.append(bytes(data).count(b"*2\r\n$4\r\nECHO\r\n"))
            write(data)

        transport.write = counted  # type: ignore[method-assign]


def _pipelined(server: RedisProcess, **batching: Any) -> PipelinedRedis:
    host, port = server.url.removeprefix("redis://").split(":")
    return PipelinedRedis(5.0, host=host, port=int(port), **batching)


def test_commands_of_one_loop_turn_go_out_in_one_write(redis_server: RedisProcess) -> None:
    """Without a window, everything queued in one event-loop turn is one write."""

    async def scenario() -> tuple[list[int], list[bytes]]:
        client = _pipelined(redis_server)
        try:
            await client.ping()
            writes = _Writes()
            writes.wrap(client)
            replies = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(20)))
            return writes.sizes, replies
        finally:
            await client.aclose()

    sizes, replies = asyncio.run(scenario())
    assert replies == [str(i).encode() for i in range(20)]
    assert sizes == [20]


def test_a_busy_connection_waits_for_the_pipeline_window(redis_server: RedisProcess) -> None:
    """REDIS_PIPELINE_WINDOW: a command queued just after a write waits for the window to
    pass and goes out together with the ones queued meanwhile; an idle connection writes at
    once."""
    window = 0.3

    async def scenario() -> tuple[float, float, list[int]]:
        client = _pipelined(redis_server, window=window)
        try:
            await client.ping()
            await asyncio.sleep(window * 1.5)  # idle for more than a window
            writes = _Writes()
            writes.wrap(client)
            start = time.monotonic()
            await client.execute("ECHO", "first")
            first = time.monotonic() - start
            later = [asyncio.ensure_future(client.execute("ECHO", str(i))) for i in range(3)]
            await asyncio.sleep(0.01)
            later += [asyncio.ensure_future(client.execute("ECHO", str(i))) for i in range(3, 5)]
            await asyncio.gather(*later)
            return first, time.monotonic() - start, writes.sizes
        finally:
            await client.aclose()

    first, total, sizes = asyncio.run(scenario())
    assert first < window / 2  # the idle connection did not wait
    assert total >= window * 0.9  # the next batch waited for the window to pass
    assert sizes == [1, 5]  # ...and the five commands queued meanwhile went out together


def test_pipeline_limit_writes_a_full_batch_before_the_window(
    redis_server: RedisProcess,
) -> None:
    """REDIS_PIPELINE_LIMIT: a batch that reaches the limit is written at once."""

    async def scenario() -> tuple[float, list[int]]:
        client = _pipelined(redis_server, window=30.0, limit=4)
        try:
            await client.ping()  # the connection just wrote: the next batch would wait 30 s
            writes = _Writes()
            writes.wrap(client)
            start = time.monotonic()
            async with asyncio.timeout(10):
                await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(8)))
            return time.monotonic() - start, writes.sizes
        finally:
            await client.aclose()

    elapsed, sizes = asyncio.run(scenario())
    assert sizes == [4, 4]
    assert elapsed < 5


def test_pipeline_settings_reach_the_connections() -> None:
    """REDIS_PIPELINE_WINDOW/LIMIT (and the per-second pair) end up on the targets."""
    clock = ManualClock(EPOCH)
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": "main:1",
        "REDIS_PIPELINE_WINDOW": "150us",
        "REDIS_PIPELINE_LIMIT": "8",
    }
    single = make_backend(Settings.from_env(env), clock)
    assert isinstance(single, RedisBackend)
    assert (single.target.pipeline_window, single.target.pipeline_limit) == (0.00015, 8)
    client = single.connection._connect()
    assert isinstance(client, PipelinedRedis)
    assert (client._window, client._limit) == (0.00015, 8)
    routed = make_backend(
        Settings.from_env(
            {
                **env,
                "REDIS_PERSECOND": "true",
                "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
                "REDIS_PERSECOND_URL": "fast:2",
                "REDIS_PERSECOND_PIPELINE_WINDOW": "2ms",
            }
        ),
        clock,
    )
    assert isinstance(routed, RoutedBackend)
    assert routed._main.target.pipeline_window == 0.00015
    fast = routed._per_second.target
    assert (fast.pipeline_window, fast.pipeline_limit) == (0.002, 0)
    url = make_backend(Settings.from_env({"REDIS_PIPELINE_WINDOW": "1ms"}), clock)
    assert isinstance(url, MemoryBackend)  # no Redis asked for: the setting is simply unused
    by_url = make_backend(Settings(backend="redis://h:1", redis_pipeline_window=0.001), clock)
    assert isinstance(by_url, RedisBackend)
    assert by_url.target.pipeline_window == 0.001


def test_pack_command_encodes_what_redis_py_would() -> None:
    """Commands are RESP arrays of bulk strings; str subclasses send their value; bools and
    other objects are refused rather than sent as something surprising."""

    class Color(enum.StrEnum):
        RED = "red"

    assert pack_command(("SET", b"k", 7, 1.5, Color.RED, "é")) == (
        b"*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n7\r\n$3\r\n1.5\r\n$3\r\nred\r\n$2\r\n\xc3\xa9\r\n"
    )
    assert pack_command(("EVALSHA", "ab", 2, "k1", "k€", -3, 10**20, 0.25)) == (
        b"*8\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n2\r\n$2\r\nk1\r\n$4\r\nk\xe2\x82\xac\r\n"
        b"$2\r\n-3\r\n$21\r\n100000000000000000000\r\n$4\r\n0.25\r\n"
    )
    for bad in (True, None, object()):
        with pytest.raises(redis.DataError):
            pack_command(("SET", "k", bad))
