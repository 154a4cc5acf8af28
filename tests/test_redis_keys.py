"""Counters in Redis where the reference keeps them: its key format and TTLs, and
per-second limits in a Redis of their own (REDIS_PERSECOND)."""

from __future__ import annotations

import pytest

from ferryman.backends.base import Backend
from ferryman.backends.redis import (
    RoutedBackend,
)
from ferryman.clock import ManualClock
from ferryman.server.app import make_backend
from ferryman.settings import Settings

from helpers.redis_procs import RedisFactory, RedisProcess
from helpers.server import (
    EPOCH,
    MESSAGING,
    ConfigDir,
    ServerFactory,
    codes,
    remaining,
)
from helpers.stores import redis_backend

pytestmark = pytest.mark.redis

DAY = 86400


JITTER = 300


PER_SECOND = """
domain: ps
descriptors:
  - key: sec
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: min
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


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
            backend=redis_backend(redis_server.url, timeout=5.0),
            cache_key_prefix="pfx_",
        )
        entries = [("message_type", "marketing"), ("to_number", "456")]
        first = server.ask("messaging", entries)
        assert (codes(first), remaining(first)) == (["OK"], [0])
        second = server.ask("messaging", entries)
        assert (codes(second), remaining(second)) == (["OVER_LIMIT"], [0])
        assert client.get(key) == b"6"
        assert 0 < client.ttl(key) <= DAY


PerSecond = tuple[RedisProcess, RedisProcess, Backend]


@pytest.fixture
def persecond(config_dir: ConfigDir, make_redis: RedisFactory, clock: ManualClock) -> PerSecond:
    """PER_SECOND served by a main Redis and a per-second one (REDIS_PERSECOND): both, and
    the backend the settings make of them."""
    config_dir.write("ps.yaml", PER_SECOND)
    main, fast = make_redis().start(), make_redis().start()
    settings = Settings(
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
    )
    return main, fast, make_backend(settings, clock)


def test_persecond_counters_go_to_the_persecond_redis(
    make_server: ServerFactory, persecond: PerSecond
) -> None:
    """With REDIS_PERSECOND, one request's second-limit key lands there, its minute key in main."""
    main, fast, backend = persecond
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
    make_server: ServerFactory, persecond: PerSecond
) -> None:
    """STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a per-second over spares the main minute key."""
    main, _, backend = persecond
    routed = make_server(
        backend=backend,
        cache_key_prefix="s_",
        stop_cache_key_increment_when_overlimit=True,
    )
    memory = make_server(stop_cache_key_increment_when_overlimit=True)
    for _ in range(3):
        got = routed.ask("ps", [("sec", "a")], [("min", "b")])
        want = memory.ask("ps", [("sec", "a")], [("min", "b")])
        assert (codes(got), remaining(got)) == (codes(want), remaining(want))
    with main.client() as m:
        assert m.get(f"s_ps_min_b_{int(EPOCH)}") == b"1"
