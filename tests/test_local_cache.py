"""The local over-limit cache: answers without Redis until the window ends, within its
byte bound, least recently used out first."""

from __future__ import annotations

from typing import Any

import redis

from ferryman.algorithms.fixed_window.local_cache import OverLimitCache
from ferryman.clock import ManualClock

from helpers.redis_procs import RedisProcess
from helpers.server import (
    EPOCH,
    ConfigDir,
    ServerFactory,
    codes,
    overall,
)
from helpers.stores import redis_backend, unique_prefix

LOCAL = """
domain: lc
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 100}
"""


def evalsha_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


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
        backend=redis_backend(own_redis.url, timeout=5.0),
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
