"""Every fixture the suite shares, in one layer: clocks, config directories, real Redis
processes, the store under test and real ferryman servers. Plain helpers live in ``helpers``.

The store a test runs on is chosen one way: ``store_kind`` ("memory" unless a test or module
is marked with ``helpers.stores.on_stores``), which ``make_store``, ``store`` and
``make_server`` all follow.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ferryman.backends.base import Backend
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock
from ferryman.settings import Settings
from ferryman.telemetry import Telemetry

from helpers.client_domain import Echo
from helpers.redis_procs import RedisCluster, RedisFactory, RedisProcess
from helpers.server import EPOCH, ConfigDir, Server, ServerFactory
from helpers.stores import REDIS_FIXTURES, Store, redis_backend, unique_prefix

StoreFactory = Callable[..., Backend]

#: Seconds a test may take in all (setup, call, teardown) before the run is stopped with
#: every thread's stack printed. pytest-timeout's limit (and pytest's faulthandler timeout)
#: stop counting once a test has failed, so a teardown that then waited forever would hold
#: the whole run until CI's own limit, with nothing printed.
HARD_LIMIT = 300


def _overrun(item: pytest.Item) -> None:
    """On the watchdog's thread: print every stack, then interrupt the run."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=False)
    sys.stderr.write(f"\n{item.nodeid}: over {HARD_LIMIT} s in all; every thread's stack:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    main = threading.main_thread().ident
    if main is not None:
        signal.pthread_kill(main, signal.SIGINT)  # ends a blocked call, unlike interrupt_main
    time.sleep(60)
    os._exit(1)  # the interrupt did not end the run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    watchdog = threading.Timer(HARD_LIMIT, _overrun, (item,))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()


@pytest.fixture
def config_dir(tmp_path: Path) -> ConfigDir:
    return ConfigDir(tmp_path / "config")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(EPOCH)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """One real redis-server shared by the session; tests keep apart by key prefix."""
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real 3-node Redis Cluster shared by the session."""
    cluster = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def make_redis(tmp_path: Path) -> Iterator[RedisFactory]:
    """Builds (not starts) redis-servers of this test alone; stops every one at teardown."""
    made: list[RedisProcess] = []

    def factory(port: int | None = None, *extra: str) -> RedisProcess:
        proc = RedisProcess(tmp_path / f"redis{len(made)}", port, *extra)
        made.append(proc)
        return proc

    yield factory
    for proc in made:
        proc.stop()


@pytest.fixture
def own_redis(make_redis: RedisFactory) -> RedisProcess:
    """A redis-server of this test alone, so its command stats are this test's."""
    return make_redis().start()


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    """Which store the test runs on: memory, redis or cluster (see ``on_stores``)."""
    return str(getattr(request, "param", "memory"))


@pytest.fixture
def redis_url(store_kind: str, request: pytest.FixtureRequest) -> str:
    """The URL of the session's Redis of ``store_kind`` (a redis or cluster store only)."""
    assert store_kind in REDIS_FIXTURES, f"{store_kind} is not a Redis store"
    url: str = request.getfixturevalue(REDIS_FIXTURES[store_kind]).url
    return url


@pytest.fixture
def make_store(store_kind: str, clock: ManualClock, request: pytest.FixtureRequest) -> StoreFactory:
    """Builds a new, unstarted backend of ``store_kind``: memory on the test's clock, or a
    RedisBackend on the session's redis-server or Cluster (options as ``redis_backend``)."""

    def factory(**options: Any) -> Backend:
        if store_kind == "memory":
            return MemoryBackend(clock)
        return redis_backend(request.getfixturevalue("redis_url"), **options)

    return factory


@pytest.fixture
def store(
    store_kind: str, make_store: StoreFactory, clock: ManualClock, request: pytest.FixtureRequest
) -> Iterator[Store]:
    """A started store of ``store_kind`` for the conformance suite; closed afterwards."""
    port = None
    if store_kind != "memory":
        redis = request.getfixturevalue(REDIS_FIXTURES[store_kind])
        port = redis.port if store_kind == "redis" else redis.nodes[0].port
    started = Store(store_kind, make_store(server_time=False), clock, port)
    yield started
    started.close()


@pytest.fixture
def make_server(
    config_dir: ConfigDir, clock: ManualClock, store_kind: str, make_store: StoreFactory
) -> Iterator[ServerFactory]:
    servers: list[Server] = []
    prefix = unique_prefix()

    def factory(
        backend: Backend | None = None,
        telemetry: Callable[[Settings], Telemetry] | None = None,
        real_clock: bool = False,
        store_of: Server | None = None,
        **overrides: Any,
    ) -> Server:
        """A started Server; ``telemetry`` builds the Service's Telemetry from its settings.

        Without ``backend`` it runs on ``store_kind``: memory is the Service's own, on its
        clock. ``store_of`` shares another server's store (its backend object for memory, a
        new backend on the same Redis otherwise) under that server's key prefix.
        ``real_clock`` runs the Service on the system clock (for clients that really sleep).
        """
        if store_of is not None:
            overrides.setdefault("cache_key_prefix", store_of.settings.cache_key_prefix)
            if backend is None and store_kind == "memory":
                backend = store_of.service.backend
        if backend is None:
            if store_kind != "memory":
                backend = make_store(pool_size=8, server_time=False)
            overrides.setdefault("cache_key_prefix", prefix)
        settings = Settings(
            host="127.0.0.1",
            port=0,
            grpc_host="127.0.0.1",
            grpc_port=0,
            debug_host="127.0.0.1",
            debug_port=0,
            config_dir=config_dir.path,
            # A test's server is new to every Envoy: nothing held before to learn.
            rlqs_learning=0.0,
        ).with_overrides(**overrides)
        server = Server(
            settings, clock, backend, telemetry(settings) if telemetry else None, real_clock
        )
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()


@pytest.fixture
def echo() -> Iterator[Echo]:
    """A running Echo gRPC service, for the client interceptors to guard."""
    service = Echo()
    yield service
    service.stop()
