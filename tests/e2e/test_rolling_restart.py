"""Rolling restarts: two ``ferryman serve`` replicas on one real redis-server, each stopped
with SIGTERM (drain, then stop) and started again, one after the other, under steady
traffic. Through a real Envoy failing closed no request fails and Redis counts exactly the
answers; ferryman.v1 clients holding copies move to the other replica and leak none;
Envoys with the quota filter keep an assignment throughout."""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

import ferryman

from envoy_procs import (
    ADMIN,
    ENVOY_DIR,
    FERRYMAN,
    LISTENER,
    UPSTREAM,
    EnvoyProcess,
    FerrymanProcess,
    Load,
    Upstream,
    render,
    request,
    wait_for,
)
from helpers.ports import free_port
from helpers.redis_procs import RedisProcess

pytestmark = pytest.mark.e2e

# Longer than Envoy's health check takes to see NOT_SERVING (an interval of 0.5 s, one
# failure), so that no call reaches a replica that has stopped accepting.
DRAIN = "2s"
RLS_HEALTH = "envoy.service.ratelimit.v3.RateLimitService"
RLQS_HEALTH = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
ROLL = "domain: roll\ndescriptors:\n  - key: generic_key\n    value: roll\n"
ROLL_LIMIT = "    rate_limit: {unit: hour, requests_per_unit: 1000000}\n"
JOBS = "domain: jobs\ndescriptors:\n  - key: tenant\n    copies: {limit: 40}\n"
QUOTA = "domain: quota\ndescriptors:\n  - key: tenant\n"
QUOTA_LIMIT = "    rate_limit: {unit: second, requests_per_unit: 1000}\n"


class Replica:
    """One ``ferryman serve`` on fixed ports: started again, it is where Envoy and the
    clients look for it."""

    def __init__(self, workdir: Path, config: Path, redis: RedisProcess, env: Mapping[str, str]):
        self.workdir = workdir
        self.grpc_port = free_port()
        self.args = ["--config", str(config), "--backend", redis.url]
        self.args += ["--grpc-port", str(self.grpc_port), "--http-port", "0", "--debug-port", "0"]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
        self.env = {**environ, "GRPC_HOST": "127.0.0.1", "USE_STATSD": "false", **env}
        self.env["FERRYMAN_SHUTDOWN_DRAIN"] = DRAIN
        # A stop that waited on a stream (one left open, or opened while stopping) would
        # not end: the stopping replica must end every stream itself.
        self.env["FERRYMAN_SHUTDOWN_GRACE"] = "1h"
        self.runs = 0
        self.process: FerrymanProcess | None = None

    def start(self) -> Replica:
        self.runs += 1
        run = FerrymanProcess(self.workdir / f"run-{self.runs}", self.args, self.env)
        self.process = run.start()
        return self

    def restart(self) -> None:
        """SIGTERM (it drains and stops: exit 0), then a new process on the same ports."""
        assert self.process is not None
        assert self.process.stop(timeout=60) == 0
        self.start()

    def page(self, path: str) -> Any:
        assert self.process is not None
        url = f"http://127.0.0.1:{self.process.debug_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.load(reply)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    """The test's replicas (it adds them), killed at teardown whatever happened."""
    made: list[Replica] = []
    yield made
    for replica in made:
        replica.kill()


def _start(made: list[Replica], *new: Replica) -> None:
    made.extend(new)
    threads = [threading.Thread(target=replica.start) for replica in new]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(replica.process is not None for replica in new)


# Both replicas over HTTP/2, each checked on ferryman's gRPC health service every 0.5 s
# (one NOT_SERVING takes it out, one SERVING brings it back).
CLUSTER = """
name: ferryman
type: STATIC
connect_timeout: 1s
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http2_protocol_options: {}}
health_checks:
  - timeout: 1s
    interval: 0.5s
    no_traffic_interval: 0.5s
    unhealthy_interval: 0.5s
    unhealthy_threshold: 1
    healthy_threshold: 1
    grpc_health_check: {}
load_assignment:
  cluster_name: ferryman
  endpoints:
    - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8081}}}
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8082}}}
"""


def _bootstrap(
    source: Path, ports: Mapping[int, int], replicas: list[Replica], service: str
) -> dict[str, Any]:
    """``source`` with its ports mapped and its ferryman cluster made of both replicas,
    health-checked under ``service``."""
    config = render(source, {**ports, FERRYMAN: replicas[0].grpc_port})
    endpoints = {8081: replicas[0].grpc_port, 8082: replicas[1].grpc_port}
    cluster = render(yaml.safe_load(CLUSTER), endpoints)
    cluster["health_checks"][0]["grpc_health_check"]["service_name"] = service
    clusters = config["static_resources"]["clusters"]
    [index] = [i for i, c in enumerate(clusters) if c["name"] == "ferryman"]
    clusters[index] = cluster
    return config


def _manager(config: dict[str, Any]) -> dict[str, Any]:
    [listener] = config["static_resources"]["listeners"]
    manager: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager


def _front_proxy(ports: Mapping[int, int], replicas: list[Replica]) -> dict[str, Any]:
    """envoy/front-proxy-fail-closed.yaml asking domain ``roll`` one descriptor per request."""
    config = _bootstrap(ENVOY_DIR / "front-proxy-fail-closed.yaml", ports, replicas, RLS_HEALTH)
    manager = _manager(config)
    [limiter] = [f for f in manager["http_filters"] if f["name"].endswith(".ratelimit")]
    assert limiter["typed_config"]["failure_mode_deny"] is True
    limiter["typed_config"]["domain"] = "roll"
    [host] = manager["route_config"]["virtual_hosts"]
    host["rate_limits"] = [{"actions": [{"generic_key": {"descriptor_value": "roll"}}]}]
    host["routes"] = [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}]
    return config


def _quota_envoy(name: str, ports: Mapping[int, int], replicas: list[Replica]) -> dict[str, Any]:
    """envoy/quota/envoy-NAME.yaml, denying every request of a bucket it holds no live
    assignment for (no assignment yet, or one whose TTL ran out)."""
    source = ENVOY_DIR / "quota" / f"envoy-{name}.yaml"
    config = _bootstrap(source, ports, replicas, RLQS_HEALTH)
    [quota] = [f for f in _manager(config)["http_filters"] if "quota" in f["name"]]
    for matcher in quota["typed_config"]["bucket_matchers"]["matcher_list"]["matchers"]:
        bucket = matcher["on_match"]["action"]["typed_config"]
        deny = {"fallback_rate_limit": {"blanket_rule": "DENY_ALL"}}
        bucket["no_assignment_behavior"] = deny
        bucket["expired_assignment_behavior"] = deny
    return config


def _healthy(envoy: EnvoyProcess, replica: Replica) -> bool:
    """Whether Envoy's health check sees ``replica`` serving."""
    _, _, body = request(envoy.admin_port, "/clusters")
    flags = f"ferryman::127.0.0.1:{replica.grpc_port}::health_flags::"
    lines = [line for line in body.decode().splitlines() if line.startswith(flags)]
    return lines == [flags + "healthy"]


def _serving(envoys: list[EnvoyProcess], replica: Replica) -> None:
    """Wait until every Envoy's health check sees ``replica`` serving."""
    for envoy in envoys:
        wait_for(partial(_healthy, envoy, replica), timeout=30)


def _roll(replicas: list[Replica], envoys: list[EnvoyProcess]) -> None:
    """Restart each replica in turn, the next once every Envoy sees this one serving."""
    for replica in replicas:
        replica.restart()
        _serving(envoys, replica)


def _answered(load: Load, at_least: int) -> bool:
    return load.statuses[200] >= at_least


def _config(tmp_path: Path, name: str, text: str) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    (config / name).write_text(text)
    return config


def _counted(redis: RedisProcess, prefix: str) -> int:
    client = redis.client()
    return sum(int(client.get(key) or 0) for key in client.scan_iter(f"{prefix}*"))


@pytest.mark.parametrize("sync", ["0", "1s"], ids=["exact", "synced"])
def test_a_rolling_restart_behind_envoy_failing_closed_fails_no_request(
    tmp_path: Path, own_redis: RedisProcess, replicas: list[Replica], sync: str
) -> None:
    """Envoy (failure_mode_deny, an active gRPC health check) over two replicas restarted in
    turn under steady traffic answers every request 200, and Redis counts exactly the
    answers (a stopping replica flushes its synced counts)."""
    config = _config(tmp_path, "roll.yaml", ROLL + ROLL_LIMIT)
    prefix = f"roll{sync.replace('s', '')}_"
    env = {"CACHE_KEY_PREFIX": prefix, "REDIS_SYNC_INTERVAL": sync}
    a = Replica(tmp_path / "a", config, own_redis, env)
    b = Replica(tmp_path / "b", config, own_redis, env)
    _start(replicas, a, b)
    upstream = Upstream().start()
    admin, listener = free_port(), free_port()
    ports = {ADMIN: admin, LISTENER: listener, UPSTREAM: upstream.port}
    envoy = EnvoyProcess(_front_proxy(ports, [a, b]), tmp_path / "envoy", admin)
    load: Load | None = None
    try:
        envoy.start()
        _serving([envoy], a)
        _serving([envoy], b)
        load = Load(listener, 50)
        wait_for(partial(_answered, load, 25), timeout=30)
        _roll([a, b], [envoy])
        load.stop()
        assert set(load.statuses) == {200}, load.statuses
        for replica in (a, b):  # their last synced counts
            assert replica.process is not None
            assert replica.process.stop(timeout=60) == 0
        assert _counted(own_redis, prefix) == load.statuses[200]
    finally:
        if load is not None:
            load.stop()
        envoy.stop()
        upstream.stop()


class Holders:
    """Threads, each with its own client (failing closed): ``n`` holding two copies at a
    time for a moment, again and again, and a keeper holding one copy, idle, until its
    session ends (the replica stops), then again: what they got and every error."""

    def __init__(self, target: str, n: int) -> None:
        self.clients = [ferryman.Client(target, timeout=2, fail_open=False) for _ in range(n)]
        self.keeper = ferryman.Client(target, timeout=2, fail_open=False)
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._hold, args=(c,)) for c in self.clients]
        self._threads.append(threading.Thread(target=self._keep))
        for thread in self._threads:
            thread.start()

    def _hold(self, client: ferryman.Client) -> None:
        while not self._stop.is_set():
            try:
                with client.hold_copy("jobs", {"tenant": "t"}, copies=2, max_wait=5) as hold:
                    time.sleep(0.02)
                    self.outcomes["held" if hold.success else "refused"] += 1
                    self.outcomes["lost"] += hold.lost
            except Exception as error:  # every error is the test's failure, reported
                self.errors.append("".join(traceback.format_exception(error)))
                time.sleep(0.1)

    def _keep(self) -> None:
        while not self._stop.is_set():
            try:
                with self.keeper.hold_copy("jobs", {"tenant": "k"}, max_wait=5) as hold:
                    self.outcomes["kept" if hold.success else "refused"] += 1
                    while not (hold.lost or self._stop.wait(0.02)):
                        pass
                    self.outcomes["moved"] += hold.lost
            except Exception as error:  # every error is the test's failure, reported
                self.errors.append("".join(traceback.format_exception(error)))
                time.sleep(0.1)

    @property
    def all_clients(self) -> list[ferryman.Client]:
        return [*self.clients, self.keeper]

    def progress(self, more: int) -> None:
        """Wait until ``more`` further holds have been had, and the keeper holds one."""
        goal = self.outcomes["held"] + more
        wait_for(lambda: self.outcomes["held"] >= goal, timeout=30)
        wait_for(lambda: self.outcomes["kept"] > self.outcomes["moved"], timeout=30)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        for client in self.all_clients:
            client.close()


def _copies_held(redis: RedisProcess, prefix: str) -> dict[str, int]:
    counts = redis.client().hgetall("{" + prefix + "ferryman_copies_jobs.tenant}:n")
    return {repr(field): int(value) for field, value in counts.items() if int(value)}


def test_clients_holding_copies_move_across_a_rolling_restart_and_leak_none(
    tmp_path: Path, own_redis: RedisProcess, replicas: list[Replica]
) -> None:
    """ferryman.v1 clients holding copies through both replicas' restarts get every hold
    they ask for (a session ended by a stopping replica is opened again on the other; an
    idle holder is told its hold ended), and once they close Redis holds no copy: each
    stopping replica released its sessions' copies exactly once (the hold lease, an
    hour, freed nothing)."""
    config = _config(tmp_path, "jobs.yaml", JOBS)
    env = {"CACHE_KEY_PREFIX": "rollc_", "HOLD_LEASE_SECONDS": "3600"}
    a = Replica(tmp_path / "a", config, own_redis, env)
    b = Replica(tmp_path / "b", config, own_redis, env)
    _start(replicas, a, b)
    holders = Holders(f"ipv4:127.0.0.1:{a.grpc_port},127.0.0.1:{b.grpc_port}", 3)
    try:
        holders.progress(20)
        for replica in (a, b):
            replica.restart()
            holders.progress(20)
    finally:
        holders.stop()
    # A call that reaches a replica just as it stops accepting, before the client has read
    # the server's GOAWAY, is CANCELLED by gRPC itself (the server never ran it): at most
    # one per client and restart; nothing else fails.
    assert len(holders.errors) <= 2 * len(holders.all_clients), holders.errors
    assert all("CANCELLED" in error for error in holders.errors), holders.errors
    assert holders.outcomes["refused"] == 0, holders.outcomes
    # The keeper, idle on the replica it first reached (a, then b), was told each time.
    assert holders.outcomes["moved"] == 2, holders.outcomes
    assert sum(client.stats().sessions for client in holders.clients) > len(holders.clients)
    wait_for(lambda: not _copies_held(own_redis, "rollc_"), timeout=30)


def _both_streams(replica: Replica) -> bool:
    """Whether both Envoys' quota streams are on ``replica``."""
    streams = replica.page("/rlqs")["streams"]
    return sorted(stream["envoy"] for stream in streams) == ["envoy-a", "envoy-b"]


def _starved(load: Load, after: int) -> list[int]:
    """The seconds from ``after`` on in which every request ``load`` sent was denied."""
    return [s for s, denied in sorted(load.denied.items()) if s >= after and not load.ok[s]]


def test_envoys_keep_a_quota_assignment_across_a_rolling_restart(
    tmp_path: Path, own_redis: RedisProcess, replicas: list[Replica]
) -> None:
    """Two Envoys with the quota filter, denying whatever they hold no live assignment for,
    let requests through in every second while both replicas restart in turn: each
    Envoy's stream moves to the replica still serving, which assigns it there (after the
    first restart both streams are on b, after the second on a)."""
    config = _config(tmp_path, "quota.yaml", QUOTA + QUOTA_LIMIT)
    # No learning after a start: an Envoy is assigned its share of the limit (1000/s, far
    # over the demand), not what it reports it let through.
    env = {"CACHE_KEY_PREFIX": "rollq_", "RLQS_LEARNING": "0"}
    a = Replica(tmp_path / "a", config, own_redis, env)
    b = Replica(tmp_path / "b", config, own_redis, env)
    _start(replicas, a, b)
    upstream = Upstream().start()
    envoys: list[EnvoyProcess] = []
    loads: list[Load] = []
    try:
        for name, admin_port in (("a", ADMIN), ("b", 9902)):
            admin, listener = free_port(), free_port()
            listen = LISTENER if name == "a" else 10001
            ports = {admin_port: admin, listen: listener, UPSTREAM: upstream.port}
            config_of = _quota_envoy(name, ports, [a, b])
            envoys.append(EnvoyProcess(config_of, tmp_path / f"envoy-{name}", admin).start())
            loads.append(Load(listener, 20, headers={"tenant": "acme"}))
        for replica in (a, b):
            _serving(envoys, replica)
        # Denied until its first assignment comes.
        for load in loads:
            wait_for(partial(_answered, load, 20), timeout=30)
        assigned = int(time.time()) + 1
        for replica, other in ((a, b), (b, a)):
            replica.restart()
            wait_for(partial(_both_streams, other), timeout=30)
            _serving(envoys, replica)
        for load in loads:
            load.stop()
        assert [_starved(load, assigned) for load in loads] == [[], []], loads[0].denied
    finally:
        for load in loads:
            load.stop()
        for envoy in envoys:
            envoy.stop()
        upstream.stop()
