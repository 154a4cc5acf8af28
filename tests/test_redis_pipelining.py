"""One round trip per request on Redis: a request's scripts in one write, nothing but
EVALSHA from the client, batched writes (REDIS_PIPELINE_WINDOW/LIMIT), a bounded pool."""

from __future__ import annotations

import asyncio
import enum
import functools
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
import redis

from ferryman.algorithms.fixed_window.model import CounterOp
from ferryman.connections.redis_pipe import DeadlineError, PipelinedRedis, pack_command

from helpers.redis_procs import RedisProcess
from helpers.server import (
    MIXED,
    MIXED_REQUEST,
    ConfigDir,
    ServerFactory,
    codes,
    remaining,
)
from helpers.stores import on_stores, redis_backend, unique_prefix

pytestmark = pytest.mark.redis

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


class CommandLog:
    """Every command a redis-server runs (MONITOR), until a marker ECHO arrives."""

    def __init__(self, server: RedisProcess) -> None:
        # Connected before MONITOR starts, so its handshake is not in the log.
        self._marker_client = server.client()
        self._marker_client.ping()
        self._client = server.client()
        self._monitor = self._client.monitor()  # type: ignore[no-untyped-call]
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
    backend = redis_backend(own_redis.url, timeout=5.0)
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
        backend=redis_backend(own_redis.url, timeout=5.0),
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
    # TIME: the health probe (which also measures Redis's clock)
    assert set(client_verbs) <= {"EVALSHA", "TIME"}, from_clients
    lua_verbs = {c["command"].split(" ", 1)[0].upper() for c in from_lua}
    # TIME: the script's deadline; TTL: a counter found without an expiry
    assert lua_verbs <= {"GET", "INCRBY", "TTL", "EXPIRE", "TIME"}
    assert sum(c["command"].upper().startswith("INCRBY") for c in from_lua) == 30


@on_stores("redis", "cluster")
def test_more_concurrent_requests_than_the_pool_size_wait_for_a_connection(
    redis_url: str,
) -> None:
    """With REDIS_POOL_SIZE=2, 60 concurrent calls all succeed (they queue, never error)."""
    backend = redis_backend(redis_url, pool_size=2, timeout=5.0)
    prefix = unique_prefix()

    async def scenario() -> list[int]:
        await backend.start()
        try:
            calls = [
                backend.store("fixed_window").apply(
                    [CounterOp(f"{prefix}k{i % 3}", 1, 1000, 60, 60)], stop_when_over=False
                )
                for i in range(60)
            ]
            results = await asyncio.gather(*calls)
            final = await backend.store("fixed_window").apply(
                [CounterOp(f"{prefix}k{i}", 0, 1000, 60, 60) for i in range(3)],
                stop_when_over=False,
            )
            assert sorted(r[0].after for r in results) == sorted(list(range(1, 21)) * 3)
            return [r.after for r in final]
        finally:
            await backend.close()

    assert asyncio.run(scenario()) == [20, 20, 20]


class _Writes:
    """Counts the writes a PipelinedRedis connection makes (each is one batch)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def wrap(self, client: PipelinedRedis) -> None:
        channel = client._link
        assert channel is not None and channel.transport is not None
        # The channel writes through a stand-in: uvloop's transports cannot be patched.
        channel.transport = cast(asyncio.Transport, _CountedTransport(channel.transport, self))


class _CountedTransport:
    """A transport that counts the ECHO commands of each write, then writes."""

    def __init__(self, transport: asyncio.Transport, writes: _Writes) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: Any) -> None:
        self._writes.sizes.append(bytes(data).count(b"*2\r\n$4\r\nECHO\r\n"))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _pipelined(server: RedisProcess, **batching: Any) -> PipelinedRedis:
    host, port = server.url.removeprefix("redis://").split(":")
    return PipelinedRedis(5.0, host=host, port=int(port), **batching)


def test_commands_of_one_loop_turn_go_out_in_one_write(redis_server: RedisProcess) -> None:
    """Without a window, everything queued in one event-loop turn is one write."""

    async def scenario() -> tuple[list[int], list[bytes], tuple[int, int]]:
        client = _pipelined(redis_server)
        try:
            await client.ping()
            writes = _Writes()
            writes.wrap(client)
            replies = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(20)))
            return writes.sizes, replies, (client.writes, client.commands)
        finally:
            await client.aclose()

    sizes, replies, counted = asyncio.run(scenario())
    assert replies == [str(i).encode() for i in range(20)]
    assert sizes == [20]
    assert counted == (2, 21)  # the ping's write, then the twenty in one (what /status shows)


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


def _note_end(ended: dict[float, float], key: float, start: float, _: object) -> None:
    ended.setdefault(key, time.monotonic() - start)


def test_callers_deadlines_expire_in_their_order_and_keep_the_connection(
    redis_server: RedisProcess,
) -> None:
    """Callers with deadlines of their own, queued behind a command that holds the
    connection (BLPOP), get DeadlineError each at its own deadline, earliest first whatever
    the order they were sent in; the connection stays open, and once the replies are in no
    deadline is left waiting (one timer per connection, none left armed)."""
    deadlines = (0.25, 0.05, 0.15)

    async def scenario() -> tuple[dict[float, float], list[object], object, object, int]:
        client = _pipelined(redis_server)
        try:
            await client.ping()
            key = f"deadline-{uuid.uuid4().hex}"
            blocker = asyncio.ensure_future(client.execute("BLPOP", key, 0.4))
            start = time.monotonic()
            ended: dict[float, float] = {}
            calls = []
            for d in deadlines:
                call = asyncio.ensure_future(client.execute("PING", by=start + d))
                call.add_done_callback(functools.partial(_note_end, ended, d, start))
                calls.append(call)
            failures = list(await asyncio.gather(*calls, return_exceptions=True))
            held = await blocker
            answered = await client.execute("ECHO", "after")
            channel = client._link
            assert channel is not None
            assert (len(channel.deadlines), channel.deadline_timer) == (0, None)
            return ended, failures, held, answered, client.connects
        finally:
            await client.aclose()

    ended, failures, held, answered, connects = asyncio.run(scenario())
    assert all(isinstance(f, DeadlineError) for f in failures), failures
    assert sorted(ended, key=ended.__getitem__) == sorted(deadlines)
    for d, at in ended.items():
        assert d - 0.001 <= at < d + 0.1, (d, at)  # timers are kept to the millisecond
    assert held is None  # BLPOP ran out on its own: the connection was never closed
    assert answered == b"after"
    assert connects == 1


def test_a_command_queued_on_a_closed_connection_is_refused_at_once(
    redis_server: RedisProcess,
) -> None:
    """A connection that closed after the caller found it open (its replies lost, Redis gone)
    refuses the command at once: nothing would ever answer it otherwise, and no deadline of
    the caller's is left armed on it."""

    async def scenario() -> tuple[bool, BaseException | None, bool]:
        client = _pipelined(redis_server)
        try:
            await client.ping()
            channel = client._link
            assert channel is not None
            channel.close(ConnectionError("gone"))
            waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            channel.queue(pack_command(("PING",)), waiter, time.monotonic() + 5)
            channel.watch(time.monotonic() + 1, waiter)
            return waiter.done(), waiter.exception(), channel.deadline_timer is None
        finally:
            await client.aclose()

    done, error, disarmed = asyncio.run(scenario())
    assert done
    assert isinstance(error, redis.ConnectionError)
    assert disarmed


def test_deadlines_of_answered_calls_are_dropped(redis_server: RedisProcess) -> None:
    """Answered calls leave nothing behind: after their deadlines pass, the connection
    holds no deadline and no armed timer, however many calls had one."""

    async def scenario() -> tuple[int, int, bool]:
        client = _pipelined(redis_server)
        try:
            await client.ping()
            for _ in range(5):
                by = time.monotonic() + 0.05
                await asyncio.gather(*(client.execute("PING", by=by) for _ in range(200)))
            channel = client._link
            assert channel is not None
            during = len(channel.deadlines)
            await asyncio.sleep(0.15)
            return during, len(channel.deadlines), channel.deadline_timer is None
        finally:
            await client.aclose()

    during, after, disarmed = asyncio.run(scenario())
    assert during > 0
    assert (after, disarmed) == (0, True)


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
