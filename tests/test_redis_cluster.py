"""Redis Cluster: slot migrations (ASK, MOVED) and one request's counters on three nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from ferryman.backends.redis import (
    RedisBackend,
)

from helpers.redis_procs import RedisCluster
from helpers.server import (
    EPOCH,
    MESSAGING,
    ConfigDir,
    ServerFactory,
    codes,
    descriptor,
    overall,
    remaining,
)
from helpers.stores import redis_backend, unique_prefix

pytestmark = pytest.mark.redis

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


def command(client: redis.Redis, *args: object) -> Any:
    """One raw Redis command (redis-py leaves ``execute_command`` untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


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
    return redis_backend(cluster.url, pool_size=8, timeout=5.0)


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
            ids = {port: command(c, "CLUSTER", "MYID").decode() for port, c in clients.items()}
            owner = next(
                int(row[2][1])
                for row in command(clients[cluster.nodes[0].port], "CLUSTER", "SLOTS")
                if row[0] <= slot <= row[1]
            )
            target = next(port for port in clients if port != owner)
            src, dst = clients[owner], clients[target]
            command(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
            command(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
            command(src, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", key)
            assert command(dst, "ASKING") and int(dst.get(key) or 0) == 1
            assert overall(server.ask("messaging", entries)) == "OK"  # by ASK
            assert command(src, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            for c in clients.values():
                command(c, "CLUSTER", "SETSLOT", slot, "NODE", ids[target])
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


def spread_over_three_nodes(prefix: str) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """The counter keys of ``tight``, ``broad`` and ``wide`` (SLOTS) put on three different
    nodes, and the three descriptors that name them."""
    names = ("tight", "broad", "wide")
    values = spread_values(prefix, names, WINDOWS)
    pairs = list(zip(names, values, strict=True))
    return [f"{prefix}cl_{k}_{v}_{WINDOWS[k]}" for k, v in pairs], [[pair] for pair in pairs]


def test_cluster_counts_one_request_spread_over_three_nodes(
    config_dir: ConfigDir, make_server: ServerFactory, redis_cluster: RedisCluster
) -> None:
    """Three descriptors whose keys live on three nodes are each counted once per hit."""
    config_dir.write("cl.yaml", SLOTS)
    prefix = unique_prefix()
    keys, request = spread_over_three_nodes(prefix)
    assert len({key_slot(k.encode()) * 3 // 16384 for k in keys}) == 3
    server = make_server(backend=cluster_backend(redis_cluster), cache_key_prefix=prefix)
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
    keys, (tight, broad, wide) = spread_over_three_nodes(prefix)
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


SIX = "domain: six\ndescriptors:\n" + "".join(
    f"  - key: d{i}\n    rate_limit: {{unit: minute, requests_per_unit: 50}}\n" for i in range(6)
)


def two_per_node(prefix: str) -> list[list[tuple[str, str]]]:
    """Six descriptors whose counters sit on six slots, two on each of the three nodes."""
    chosen: list[list[tuple[str, str]]] = []
    per_third: dict[int, int] = {}
    slots: set[int] = set()
    for i in range(6):
        key = f"d{i}"
        for n in range(10_000):
            slot = key_slot(f"{prefix}six_{key}_v{n}_{int(EPOCH)}".encode())
            third = slot * 3 // 16384
            if per_third.get(third, 0) < 2 and slot not in slots:
                per_third[third] = per_third.get(third, 0) + 1
                slots.add(slot)
                chosen.append([(key, f"v{n}")])
                break
    assert sorted(per_third.values()) == [2, 2, 2]
    return chosen


def test_a_request_over_three_nodes_asks_them_at_once_one_write_each(
    config_dir: ConfigDir, make_server: ServerFactory, redis_cluster: RedisCluster
) -> None:
    """Six descriptors on six slots of three nodes: the two scripts of each node leave in
    one write (one round trip per node, the nodes asked at once), each counter counted once."""
    config_dir.write("six.yaml", SIX)
    prefix = unique_prefix()
    request = two_per_node(prefix)
    backend = redis_backend(redis_cluster.url, pool_size=8, timeout=5.0, server_time=False)
    server = make_server(backend=backend, cache_key_prefix=prefix)
    server.ask("six", *request)  # slot map read, scripts loaded
    writes, commands = backend.writes, backend.connection.commands
    second = server.ask("six", *request)
    assert (backend.writes - writes, backend.connection.commands - commands) == (3, 6)
    assert remaining(second) == [48] * 6
