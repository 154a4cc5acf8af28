"""Redis behind Sentinel: finding the master, following a failover, and connecting again
when a master turned replica answers READONLY."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from ferryman.backends.redis import (
    RedisBackend,
    parse_backend_url,
    target_from_env_style,
)

from helpers.redis_procs import (
    RedisFactory,
    RedisProcess,
    SentinelProcess,
)
from helpers.server import (
    EPOCH,
    MESSAGING,
    ConfigDir,
    ServerFactory,
    codes,
    overall,
    wait_for,
)
from helpers.stores import redis_backend

pytestmark = pytest.mark.redis


@pytest.fixture
def sentinel(
    make_redis: RedisFactory, tmp_path: Path
) -> Iterator[tuple[RedisProcess, SentinelProcess]]:
    master = make_redis().start()
    watcher = SentinelProcess(tmp_path / "sentinel", master.port).start()
    yield master, watcher
    watcher.stop()


@pytest.fixture
def replicated(make_redis: RedisFactory) -> tuple[RedisProcess, RedisProcess]:
    """A master and its replica, replication up."""
    master = make_redis(None, "--repl-diskless-sync-delay", "0").start()
    replica = make_redis(None, "--replicaof", "127.0.0.1", str(master.port)).start()
    with replica.client() as r:
        wait_for(
            "replication",
            lambda: r.info("replication")["master_link_status"] == "up",
            20,
            ignoring=(redis.RedisError,),
        )
    return master, replica


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
    config_dir: ConfigDir,
    make_server: ServerFactory,
    replicated: tuple[RedisProcess, RedisProcess],
    tmp_path: Path,
) -> None:
    """The master dies in mid-traffic and Sentinel promotes its replica: calls fail with
    UNAVAILABLE while there is no master, then count on the new one, which has the old
    one's counts, without a restart: exactly the limit is granted over the whole run."""
    config_dir.write("m.yaml", MESSAGING)  # 5 a day
    master, replica = replicated
    watcher = SentinelProcess(tmp_path / "sentinel", master.port).start()
    try:
        with redis.Redis(port=watcher.port, socket_timeout=2) as s:
            wait_for(
                "the sentinel seeing the replica",
                lambda: s.sentinel_slaves("mymaster"),
                20,
                ignoring=(redis.RedisError,),
            )
        backend = redis_backend(f"redis+sentinel://127.0.0.1:{watcher.port}/mymaster", timeout=1.0)
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
        watcher.stop()


def test_a_read_only_reply_makes_the_client_connect_again(
    config_dir: ConfigDir, make_server: ServerFactory, replicated: tuple[RedisProcess, RedisProcess]
) -> None:
    """A master turned replica answers READONLY: that call is UNAVAILABLE and the connection
    is dropped, so the next call connects again (to whatever Sentinel or DNS names now)."""
    config_dir.write("m.yaml", MESSAGING)
    _, replica = replicated
    server = make_server(backend=redis_backend(replica.url, timeout=2.0), cache_key_prefix="ro_")
    entries = [("message_type", "marketing"), ("to_number", "8")]
    with replica.client() as r:
        with pytest.raises(grpc.RpcError) as refused:
            server.ask("messaging", entries)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "READONLY" in (refused.value.details() or "")
        connections = r.info("stats")["total_connections_received"]
        r.execute_command("REPLICAOF", "NO", "ONE")
        assert overall(server.ask("messaging", entries)) == "OK"
        assert r.info("stats")["total_connections_received"] > connections
