"""Which Redis the settings name: backend URLs, the reference's REDIS_* environment, and
the pipeline settings reaching the connections."""

from __future__ import annotations

from typing import Any

import pytest

from ferryman.backends.memory import MemoryBackend
from ferryman.backends.redis import (
    RedisBackend,
    RedisTarget,
    RoutedBackend,
    parse_backend_url,
    target_from_env_style,
)
from ferryman.clock import ManualClock
from ferryman.connections.redis_pipe import PipelinedRedis
from ferryman.errors import SettingsError
from ferryman.server.app import make_backend
from ferryman.settings import Settings

from helpers.server import (
    EPOCH,
)


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
    assert routed.main.target.pipeline_window == 0.00015
    fast = routed._per_second.target
    assert (fast.pipeline_window, fast.pipeline_limit) == (0.002, 0)
    url = make_backend(Settings.from_env({"REDIS_PIPELINE_WINDOW": "1ms"}), clock)
    assert isinstance(url, MemoryBackend)  # no Redis asked for: the setting is simply unused
    by_url = make_backend(Settings(backend="redis://h:1", redis_pipeline_window=0.001), clock)
    assert isinstance(by_url, RedisBackend)
    assert by_url.target.pipeline_window == 0.001
