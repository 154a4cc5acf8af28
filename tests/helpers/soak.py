"""A soak of two `ferryman serve` replicas on real Redis: mixed traffic at a steady rate while
the configuration reloads, Redis restarts, Sentinel fails over and the replicas restart one
after the other; what each replica uses, minute by minute, and what was lost or leaked.

Shared by ``tests/bench/bench_soak.py`` (the figures) and ``tests/test_soak_short.py`` (what
cannot be timing: nothing lost or doubled, nothing held, nothing leaked).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import redis
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.rate_limit_quota.v3 import rlqs_pb2
from envoy.service.ratelimit.v3 import rls_pb2

import ferryman.client
from ferryman._proto.quotaservice import quota_service_pb2

from helpers.config_api import TOKENS, Served
from helpers.pacing import paced
from helpers.redis_procs import RedisProcess, SentinelProcess
from helpers.rlqs_mesh import STREAM as RLQS_STREAM
from helpers.server import quota_stub, rls_stub, wait_for

#: Seconds of each accounting period: the fixed-window descriptor's value names the period
#: its request was sent in, so that Redis's counters can be summed per period.
PERIOD = 10
#: A period this close to a fault (seconds) is not held to "nothing lost".
FAULT_MARGIN = 3.0
#: The fixed-window counters: ``soak_period_p<N>_<window start>``.
PERIOD_KEY = re.compile(r"^soak_period_p(\d+)_\d+$")

DESCRIPTORS = """\
domain: soak
descriptors:
  - key: period
    rate_limit: {{unit: hour, requests_per_unit: 100000000}}
  - key: minute
    rate_limit: {{unit: minute, requests_per_unit: 400}}
  - key: sliding
    sliding_window: {{unit: second, requests_per_unit: 3}}
  - key: bucket
    token_bucket: {{size: 5, fill_rate: 2}}
  - key: gcra
    gcra: {{rate: 3, per: 1s, burst: 2}}
  - key: job
    copies: {{limit: 40}}
  - key: reloaded
    rate_limit: {{unit: second, requests_per_unit: {reload}}}
"""
RLQS_DOMAIN = (
    "domain: soak_rlqs\ndescriptors:\n  - key: tenant\n"
    "    rate_limit: {unit: second, requests_per_unit: 20}\n"
)
QUOTA = "namespaces:\n  soak:\n    default_bucket: {size: 40, fill_rate: 20}\n"
LEASE_LENGTH = 5
RESOURCES = """\
resources:
  - identifier_glob: fair*
    capacity: 100
    algorithm: {{kind: FAIR_SHARE, lease_length: {lease}, refresh_interval: 1}}
"""
API_DOCUMENT = (
    "domain: soak_api\ndescriptors:\n  - key: tenant\n"
    "    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n"
)
KINDS = ("minute", "sliding", "bucket", "gcra")


@dataclass(frozen=True)
class Plan:
    """What a soak does and when (seconds from its start)."""

    seconds: float
    rate: float = 40.0  # ShouldRateLimit calls per second, all replicas together
    holders: int = 4
    quota: bool = True
    rlqs: bool = True
    leases: bool = True
    api_writes: bool = True
    reload_every: float = 10.0
    api_every: float = 30.0
    redis_restarts: tuple[float, ...] = ()
    failover_at: float | None = None
    rolling_at: float | None = None
    warmup: float = 60.0
    sample_every: float = 5.0


@dataclass
class Sample:
    at: float
    replica: int
    incarnation: int
    rss_kib: int
    fds: int
    tasks: int


@dataclass
class Fault:
    name: str
    start: float
    end: float


@dataclass
class Outcome:
    """What a soak saw: per minute and at the end."""

    plan: Plan
    minutes: list[dict[str, Any]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    ok: Counter[int] = field(default_factory=Counter)  # per period: OK answers
    unknown: Counter[int] = field(default_factory=Counter)  # per period: errors
    stored: dict[int, int] = field(default_factory=dict)  # per period: Redis's count
    copies_held: int = 0
    sessions: int = 0
    leases_out: float = 0.0
    leases_before: float = 0.0  # what the replicas had leased just before the clients let go
    leases_later: float = 0.0  # leased out once a lease's length passed after the end
    lease_detail: list[str] = field(default_factory=list)  # who still held one at the end
    holds: int = 0
    events: Counter[str] = field(default_factory=Counter)
    finals: list[Sample] = field(default_factory=list)

    def excluded(self, period: int) -> str:
        """The Redis fault a period overlapped (hits may be lost there), or ''."""
        start, end = period * PERIOD - FAULT_MARGIN, (period + 1) * PERIOD + FAULT_MARGIN
        for fault in self.faults:
            if fault.name.startswith("redis") and fault.start < end and fault.end > start:
                return fault.name
        return ""

    def accounting(self) -> tuple[list[int], list[int], dict[int, str]]:
        """Periods with hits lost (Redis below the OK answers), periods with hits counted
        twice (Redis above the OK answers and the calls whose answer was an error), and
        the periods left out for a Redis fault, with that fault."""
        lost, doubled, skipped = [], [], {}
        for period in sorted(set(self.ok) | set(self.stored)):
            stored, ok = self.stored.get(period, 0), self.ok[period]
            if fault := self.excluded(period):
                skipped[period] = fault
                continue
            if stored < ok:
                lost.append(period)
            if stored > ok + self.unknown[period]:
                doubled.append(period)
        return lost, doubled, skipped

    def baseline(self, replica: int, incarnation: int) -> Sample | None:
        """The first sample of a replica's process taken after its warm-up."""
        own = [s for s in self.samples if (s.replica, s.incarnation) == (replica, incarnation)]
        if not own:
            return None
        start = own[0].at
        later = [s for s in own if s.at - start >= self.plan.warmup]
        return later[0] if later else None


class Topology:
    """One redis-server (or, for a failover, a master, its replica and a Sentinel)."""

    def __init__(self, workdir: Path, sentinel: bool) -> None:
        self.workdir = workdir
        self.nodes = {0: RedisProcess(workdir / "redis0").start()}
        self.sentinel: SentinelProcess | None = None
        if sentinel:
            master = self.nodes[0].port
            replica = RedisProcess(
                workdir / "redis1", None, "--replicaof", "127.0.0.1", str(master)
            )
            self.nodes[1] = replica.start()
            watcher = SentinelProcess(workdir / "sentinel", master)
            # A restart of the master must not look like a failure to it.
            watcher.conf.write_text(watcher.conf.read_text().replace(" 1000", " 10000"))
            self.sentinel = watcher.start()
            self._wait_synced()

    @property
    def url(self) -> str:
        if self.sentinel is None:
            return self.nodes[0].url
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/mymaster"

    def master(self) -> int:
        """The index of the node that is master now."""
        if self.sentinel is None:
            return 0
        with self.sentinel.client() as client:
            _, port = client.sentinel_get_master_addr_by_name("mymaster")
        return next(i for i, node in self.nodes.items() if node.port == int(port))

    def client(self) -> redis.Redis:
        return self.nodes[self.master()].client()

    def restart_master(self) -> None:
        """The master stopped and started again on its port, empty (no persistence)."""
        index = self.master()
        old = self.nodes[index]
        old.stop()
        self.nodes[index] = RedisProcess(old.workdir, old.port).start()
        if self.sentinel is not None:
            self._wait_synced()

    def failover(self) -> None:
        assert self.sentinel is not None
        before = self.master()
        with self.sentinel.client() as client:
            client.execute_command("SENTINEL", "FAILOVER", "mymaster")
        wait_for("the Sentinel failover", lambda: self.master() != before, 30, 0.1)
        self._wait_synced()

    def _wait_synced(self) -> None:
        def synced() -> bool:
            master = self.master()
            for index, node in self.nodes.items():
                if index == master:
                    continue
                with node.client() as client:
                    info = client.info("replication")
                if info.get("role") != "slave" or info.get("master_link_status") != "up":
                    return False
            return True

        wait_for("the replica in sync", synced, 60, 0.1, ignoring=(redis.RedisError,))

    def stop(self) -> None:
        if self.sentinel is not None:
            self.sentinel.stop()
        for node in self.nodes.values():
            node.stop()


class Soak:
    """Two replicas on the topology, the traffic and the faults of ``plan``."""

    def __init__(self, workdir: Path, plan: Plan, log: Callable[[str], None] = print) -> None:
        self.plan = plan
        self.workdir = workdir
        self.log = log
        self.outcome = Outcome(plan)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.codes: defaultdict[int, Counter[str]] = defaultdict(Counter)
        self.latencies: defaultdict[int, list[float]] = defaultdict(list)
        self.incarnations = [0, 0]
        self.reloads = 0
        self.started = time.monotonic()
        self.config = workdir / "config"
        self.config.mkdir(parents=True)
        self._write_config()
        tokens = workdir / "tokens"
        tokens.write_text(TOKENS)
        self.topology = Topology(workdir / "redis", sentinel=plan.failover_at is not None)
        env = {
            "ADMIN_TOKENS_FILE": str(tokens),
            "USE_STATSD": "false",
            "LOG_LEVEL": "warning",
        }
        args = ["--backend", self.topology.url]
        self.replicas = [Served(self.config, workdir, env, args) for _ in range(2)]
        self.threads: list[threading.Thread] = []
        self.calls: list[Any] = []  # the open RLQS streams, cancelled at the end

    # -- set-up -----------------------------------------------------------------------

    def _write_config(self) -> None:
        self.reloads += 1
        text = DESCRIPTORS.format(reload=100 + self.reloads % 7)
        tmp = self.config / ".soak.yaml.tmp"
        tmp.write_text(text)
        tmp.rename(self.config / "soak.yaml")
        if self.reloads == 1:
            if self.plan.rlqs:
                (self.config / "rlqs.yaml").write_text(RLQS_DOMAIN)
            if self.plan.quota:
                (self.config / "quota.yaml").write_text(QUOTA)
            if self.plan.leases:
                (self.config / "resources.yaml").write_text(RESOURCES.format(lease=LEASE_LENGTH))

    def now(self) -> float:
        return time.monotonic() - self.started

    def minute(self) -> int:
        return int(self.now() // 60)

    def target(self, i: int) -> str:
        return f"127.0.0.1:{self.replicas[i % 2].grpc}"

    def record(self, what: str, code: str, latency: float | None = None) -> None:
        minute = self.minute()
        with self.lock:
            self.codes[minute][f"{what} {code}"] += 1
            if latency is not None:
                self.latencies[minute].append(latency)

    # -- traffic ------------------------------------------------------------------------

    def _spawn(self, name: str, body: Callable[[], None]) -> None:
        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _rls(self) -> None:
        channels = [grpc.insecure_channel(self.target(i)) for i in range(2)]
        stubs = [rls_stub(c) for c in channels]
        for n, _ in enumerate(paced(self.plan.rate, self.stop)):
            period = int(self.now() // PERIOD)
            if n % 2 == 0:
                entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="period", value=f"p{period}")
            else:
                kind = KINDS[(n // 2) % len(KINDS)]
                entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=kind, value=f"u{n % 5}")
            request = rls_pb2.RateLimitRequest(
                domain="soak", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
            )
            began = time.monotonic()
            try:
                reply = stubs[n % 2].ShouldRateLimit(request, timeout=1.0)
                code = rls_pb2.RateLimitResponse.Code.Name(reply.overall_code)
            except grpc.RpcError as exc:
                code = exc.code().name
            self.record("rls", code, time.monotonic() - began)
            if entry.key == "period":
                with self.lock:
                    if code == "OK":
                        self.outcome.ok[period] += 1
                    elif code != "OVER_LIMIT":
                        self.outcome.unknown[period] += 1
        for channel in channels:
            channel.close()

    def _holder(self, index: int) -> None:
        client = ferryman.client.Client(self.target(index), fail_open=False, timeout=2.0)
        try:
            while not self.stop.is_set():
                try:
                    with client.hold_copy("soak", {"job": f"j{index % 2}"}, copies=2) as hold:
                        self.record("hold", "OK" if hold.success else "REFUSED")
                        if hold.success:
                            with self.lock:
                                self.outcome.holds += 1
                        self.stop.wait(0.3 + 0.1 * index)
                except Exception as exc:  # a failed hold is an answer to count
                    self.record("hold", type(exc).__name__)
                    self.stop.wait(0.5)
                self.stop.wait(0.1)
        finally:
            client.close()

    def _quota(self) -> None:
        channels = [grpc.insecure_channel(self.target(i)) for i in range(2)]
        for n, _ in enumerate(paced(10, self.stop)):
            request = quota_service_pb2.AllowRequest(
                namespace="soak", bucket_name=f"b{n % 3}", tokens_requested=1
            )
            try:
                reply = quota_stub(channels[n % 2]).Allow(request, timeout=1.0)
                code = quota_service_pb2.AllowResponse.Status.Name(reply.status)
            except grpc.RpcError as exc:
                code = exc.code().name
            self.record("allow", code)
        for channel in channels:
            channel.close()

    def _rlqs(self, index: int) -> None:
        """One simulated Envoy: a report a second on its stream, opened again when it ends."""
        while not self.stop.is_set():
            with grpc.insecure_channel(self.target(index)) as channel:
                reports = _Reports(self.stop, index)
                call = channel.stream_stream(
                    RLQS_STREAM,
                    rlqs_pb2.RateLimitQuotaUsageReports.SerializeToString,
                    rlqs_pb2.RateLimitQuotaResponse.FromString,
                )(iter(reports), metadata=(("ferryman-envoy", f"soak-{index}"),))
                self.record("rlqs", "OPENED")
                self.calls.append(call)
                try:
                    for _ in call:
                        self.record("rlqs", "ANSWER")
                    self.record("rlqs", "ENDED")
                except grpc.RpcError as exc:
                    self.record("rlqs", exc.code().name)
                finally:
                    reports.close()
                    self.calls.remove(call)
            self.stop.wait(0.5)

    def _leases(self) -> Iterator[tuple[ferryman.client.CapacityClient, Any]]:
        for index in range(3):
            client = ferryman.client.CapacityClient(self.target(index), f"soak-{index}")
            yield client, client.resource("fair_soak", wants=20.0 + 10 * index)

    # -- what the replicas use ----------------------------------------------------------

    def sample(self) -> list[Sample]:
        out = []
        for index, replica in enumerate(self.replicas):
            assert replica.proc is not None
            pid = replica.proc.pid
            try:
                rss = _rss_kib(pid)
                fds = len(os.listdir(f"/proc/{pid}/fd"))
                tasks = int(replica.status()["asyncio_tasks"])
            except (OSError, ValueError, KeyError, AssertionError):
                continue
            out.append(Sample(self.now(), index, self.incarnations[index], rss, fds, tasks))
        return out

    def _sampler(self) -> None:
        while not self.stop.wait(self.plan.sample_every):
            found = self.sample()
            with self.lock:
                self.outcome.samples.extend(found)

    def _counters(self) -> None:
        while not self.stop.wait(2.0):
            self.read_counters()

    def read_counters(self) -> None:
        """The fixed-window counters now: per period, the most ever seen in Redis."""
        try:
            with self.topology.client() as client:
                keys = [k.decode() for k in client.scan_iter("soak_period_p*", count=1000)]
                values = client.mget(keys) if keys else []
        except (redis.RedisError, StopIteration):
            return
        per_period: Counter[int] = Counter()
        for key, value in zip(keys, values, strict=True):
            match = PERIOD_KEY.match(key)
            if match and value is not None:
                per_period[int(match.group(1))] += int(value)
        with self.lock:
            for period, count in per_period.items():
                self.outcome.stored[period] = max(self.outcome.stored.get(period, 0), count)

    # -- faults ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def fault(self, name: str) -> Iterator[None]:
        start = self.now()
        self.log(f"  [{start:6.1f}s] {name}")
        try:
            yield
        finally:
            self.outcome.faults.append(Fault(name, start, self.now()))

    def restart_replica(self, index: int) -> None:
        with self.fault(f"replica {index} restart"):
            self.replicas[index].stop()
            self.incarnations[index] += 1
            self.replicas[index].start()

    def _api_write(self, writes: int) -> None:
        replica = self.replicas[writes % 2]
        text = API_DOCUMENT.format(limit=100 + writes)
        for _ in range(3):
            try:
                status = replica.put("api.yaml", text, replica.version())[0]
            except (OSError, KeyError, ValueError):
                status = 0
            self.record("config-api", str(status))
            if status != 412:  # another version landed in between: read it and try again
                return

    def _schedule(self) -> list[tuple[float, str, Callable[[], None]]]:
        plan = self.plan
        events: list[tuple[float, str, Callable[[], None]]] = []
        at = plan.reload_every
        while at < plan.seconds:
            events.append((at, "reload", self._write_config))
            at += plan.reload_every
        if plan.api_writes:
            for n, at in enumerate(_every(plan.api_every, plan.seconds)):
                events.append((at + 5, "config-api", functools.partial(self._api_write, n)))
        for at in plan.redis_restarts:
            events.append((at, "redis", self._redis_restart))
        if plan.failover_at is not None:
            events.append((plan.failover_at, "failover", self._failover))
        if plan.rolling_at is not None:
            events.append((plan.rolling_at, "rolling", self._rolling))
        return sorted(events, key=lambda e: e[0])

    def _redis_restart(self) -> None:
        with self.fault("redis restart"):
            self.topology.restart_master()
            self._wait_answering()

    def _failover(self) -> None:
        with self.fault("redis failover"):
            self.topology.failover()
            self._wait_answering()

    def _rolling(self) -> None:
        for index in range(2):
            self.restart_replica(index)

    def _wait_answering(self) -> None:
        """Until a period's fixed window is counted on each replica again."""
        probe = rls_pb2.RateLimitRequest(
            domain="soak",
            descriptors=[
                ratelimit_pb2.RateLimitDescriptor(
                    entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="minute", value="probe")]
                )
            ],
        )

        def answering() -> bool:
            for index in range(2):
                with grpc.insecure_channel(self.target(index)) as channel:
                    rls_stub(channel).ShouldRateLimit(probe, timeout=1.0)
            return True

        wait_for("the replicas answering", answering, 60, 0.2, ignoring=(grpc.RpcError,))

    # -- the run --------------------------------------------------------------------------

    def run(self) -> Outcome:
        for replica in self.replicas:
            replica.start()
        plan = self.plan
        self.started = time.monotonic()
        self._spawn("rls", self._rls)
        for index in range(plan.holders):
            self._spawn(f"holder-{index}", functools.partial(self._holder, index))
        if plan.quota:
            self._spawn("quota", self._quota)
        if plan.rlqs:
            for index in range(2):
                self._spawn(f"rlqs-{index}", functools.partial(self._rlqs, index))
        leases = list(self._leases()) if plan.leases else []
        self._spawn("sampler", self._sampler)
        self._spawn("counters", self._counters)
        reported = 0
        try:
            for at, _, action in self._schedule():
                reported = self._until(at, reported)
                action()
            reported = self._until(plan.seconds, reported)
            if plan.leases:
                self.outcome.leases_before = self.leases_out()
        finally:
            self.stop.set()
            for call in list(self.calls):
                call.cancel()
            for thread in self.threads:
                thread.join(30)
            for client, resource in leases:
                client.release(resource)
                client.close()
        self._finish(reported)
        return self.outcome

    def _until(self, at: float, reported: int) -> int:
        while self.now() < at:
            time.sleep(min(1.0, max(0.0, at - self.now())))
            while self.minute() > reported:
                self._report(reported)
                reported += 1
        return reported

    def _report(self, minute: int) -> None:
        with self.lock:
            codes = dict(self.codes[minute])
            latencies = sorted(self.latencies[minute])
            samples = [s for s in self.outcome.samples if minute * 60 <= s.at < minute * 60 + 60]
        start, end = minute * 60, minute * 60 + 60
        faults = [f.name for f in self.outcome.faults if f.start < end and f.end > start]
        last: dict[int, Sample] = {s.replica: s for s in samples}
        row = {
            "minute": minute + 1,
            "faults": faults,
            "codes": codes,
            "p50_ms": _quantile(latencies, 0.5) * 1000,
            "p99_ms": _quantile(latencies, 0.99) * 1000,
            "replicas": [
                {"rss_mib": s.rss_kib / 1024, "fds": s.fds, "tasks": s.tasks}
                for _, s in sorted(last.items())
            ],
        }
        self.outcome.minutes.append(row)
        self.log(format_minute(row))

    def _finish(self, reported: int) -> None:
        if self.now() - reported * 60 > 5:
            self._report(reported)
        time.sleep(2.0)  # the last answers' hits are in Redis; sessions have closed
        self.read_counters()
        for replica in self.replicas:
            status = replica.status()
            self.outcome.copies_held += int(status["holds"]["copies_held"])
            self.outcome.sessions += int(status["holds"]["sessions"])
        if self.plan.leases:
            self.outcome.leases_out = self.leases_out()
            self.outcome.lease_detail = self.lease_holders()
            if self.outcome.leases_out:
                time.sleep(LEASE_LENGTH + 2)
                self.outcome.leases_later = self.leases_out()
        self.outcome.finals = self.sample()
        for minute in self.codes.values():
            self.outcome.events.update(minute)

    def leases_out(self) -> float:
        """The capacity leased out now to the soak's capacity clients (the replicas' own
        quota-service leases, also listed on /capacity, are not theirs)."""
        return sum(
            float(client["capacity"])
            for replica in self.replicas
            for resource in _capacity(replica)["resources"]
            for client in resource["clients"]
            if client["client_id"].startswith("soak-")
        )

    def lease_holders(self) -> list[str]:
        """Each lease still out: the replica (and whether it is master), client, capacity."""
        out = []
        for index, replica in enumerate(self.replicas):
            page = _capacity(replica)
            for resource in page["resources"]:
                for client in resource["clients"]:
                    out.append(
                        f"r{index} (master {page['is_master']}): {client['client_id']}"
                        f" {client['capacity']:g} for {client['expires_in']:g} s more"
                    )
        return out

    def close(self) -> None:
        self.stop.set()
        for replica in self.replicas:
            replica.stop()
        self.topology.stop()


class _Reports:
    """A simulated Envoy's reports: one bucket, a report a second until closed."""

    def __init__(self, stop: threading.Event, index: int) -> None:
        self.stop = stop
        self.closed = threading.Event()
        self.index = index

    def __iter__(self) -> Iterator[rlqs_pb2.RateLimitQuotaUsageReports]:
        usage = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage
        first = True
        while not (self.stop.is_set() or self.closed.is_set()):
            yield rlqs_pb2.RateLimitQuotaUsageReports(
                domain="soak_rlqs",
                bucket_quota_usages=[
                    usage(
                        bucket_id=rlqs_pb2.BucketId(bucket={"tenant": f"t{self.index}"}),
                        num_requests_allowed=0 if first else 5,
                        time_elapsed={"seconds": 0 if first else 1},
                    )
                ],
            )
            first = False
            self.closed.wait(1.0)

    def close(self) -> None:
        self.closed.set()


def _every(step: float, seconds: float) -> Iterator[float]:
    at = step
    while at < seconds:
        yield at
        at += step


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError("no VmRSS")


def _capacity(replica: Served) -> dict[str, Any]:
    status, _, raw = replica.request("GET", "/capacity")
    assert status == 200, raw
    page: dict[str, Any] = json.loads(raw)
    return page


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def format_minute(row: dict[str, Any]) -> str:
    codes = ", ".join(f"{k} {v}" for k, v in sorted(row["codes"].items()))
    replicas = "; ".join(
        f"r{i} {r['rss_mib']:.1f} MiB {r['fds']} fds {r['tasks']} tasks"
        for i, r in enumerate(row["replicas"])
    )
    faults = f" [{', '.join(row['faults'])}]" if row["faults"] else ""
    return (
        f"minute {row['minute']}{faults}: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms;"
        f" {replicas}\n    {codes}"
    )


def leaked(outcome: Outcome, fds: int = 8, tasks: int = 8) -> list[str]:
    """Each replica whose descriptors or tasks at the end are above its warmed-up baseline by
    more than the margin."""
    out = []
    for final in outcome.finals:
        base = outcome.baseline(final.replica, final.incarnation)
        if base is None:
            out.append(f"replica {final.replica}: no sample after its warm-up")
            continue
        if final.fds > base.fds + fds:
            out.append(f"replica {final.replica}: {base.fds} -> {final.fds} descriptors")
        if final.tasks > base.tasks + tasks:
            out.append(f"replica {final.replica}: {base.tasks} -> {final.tasks} tasks")
    return out
