"""Processes that use a capacity lease: ``python tests/helpers/leased.py TARGET RESOURCE
DEMAND FALLBACK`` runs a RateLimiter at up to DEMAND per second and prints, every second, a
JSON line: the wall-clock second, the permits taken in it, the capacity and the mode."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any


class LeasedWorker:
    """A worker process and what it reported, second by second."""

    def __init__(self, target: str, resource: str, demand: float, fallback: str) -> None:
        command = [sys.executable, __file__, target, resource, str(demand), fallback]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.permits: Counter[int] = Counter()
        self.capacity: dict[int, float] = {}
        self.mode: dict[int, str] = defaultdict(str)
        self.fell_back_at = 0.0
        self.expiry = 0.0  # the lease's expiry when it gave way to the fallback
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            row = json.loads(line)
            self.permits[row["second"]] = row["permits"]
            self.capacity[row["second"]] = row["capacity"]
            self.mode[row["second"]] = row["mode"]
            self.fell_back_at = row["fell_back_at"]
            self.expiry = row["expiry"]

    def last(self) -> tuple[float, str]:
        """The capacity and mode of the last reported second."""
        if not self.capacity:
            return (math.nan, "")
        second = max(self.capacity)
        return self.capacity[second], self.mode[second]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def per_second(workers: list[LeasedWorker], seconds: range) -> list[list[int]]:
    """Each worker's permits in each whole second of ``seconds``."""
    return [[w.permits[s] for s in seconds] for w in workers]


def _main(target: str, resource_id: str, demand: float, fallback: str) -> None:
    from ferryman.client import CapacityClient, RateLimiter

    with CapacityClient(target, fallback=fallback) as client:  # type: ignore[arg-type]
        resource = client.resource(resource_id, demand)
        limiter = RateLimiter(resource)
        taken: Counter[int] = Counter()
        threading.Thread(target=_report, args=(resource, taken), daemon=True).start()
        next_try = time.monotonic()
        while True:
            now = time.monotonic()
            if next_try > now:  # the demand itself: no more tries than DEMAND per second
                time.sleep(next_try - now)
            next_try = max(next_try, time.monotonic() - 1 / demand) + 1 / demand
            limiter.wait()
            taken[int(time.time())] += 1


def _report(resource: Any, taken: Counter[int]) -> None:
    """Every 20 ms: note when the lease gives way to the fallback; after each wall-clock
    second: its line."""
    second = int(time.time())
    fell_back_at = expiry = 0.0
    was = ""
    while True:
        time.sleep(0.02)
        capacity, mode = resource.capacity, resource.mode
        if was == "lease" and mode != "lease":
            fell_back_at = time.time()
            expiry = resource.lease.expiry_time if resource.lease is not None else 0.0
        was = mode
        if int(time.time()) == second:
            continue
        row = {
            "second": second,
            "permits": taken.pop(second, 0),
            "capacity": capacity,
            "mode": mode,
            "fell_back_at": fell_back_at,
            "expiry": expiry,
        }
        print(json.dumps(row), flush=True)
        second = int(time.time())


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])


class Driver:
    """A thread sending ShouldRateLimit to ``address`` at ``rate`` per second, counting the
    OK answers of each wall-clock second (those sent and answered within it) and keeping
    the last answer."""

    def __init__(self, address: str, domain: str, entries: list[tuple[str, str]], rate: float):
        import grpc
        from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
        from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

        self.rate = rate
        self.ok: Counter[int] = Counter()
        self.sent: Counter[int] = Counter()
        self.last: rls_pb2.RateLimitResponse | None = None
        self.errors = 0
        self.straddled = 0
        self._channel = grpc.insecure_channel(address)
        self._stub = rls_pb2_grpc.RateLimitServiceStub(self._channel)  # type: ignore[no-untyped-call]
        descriptor = ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
        )
        self._request = rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor])
        self._ok_code = rls_pb2.RateLimitResponse.OK
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import grpc

        # Here, not at the top: the module also runs as a script, without the tests/ path.
        from helpers.pacing import paced

        for second in paced(self.rate, self._stop):
            try:
                reply = self._stub.ShouldRateLimit(self._request, timeout=5)
            except grpc.RpcError:
                self.errors += 1
                continue
            self.sent[second] += 1
            self.last = reply
            if int(time.time()) != second:
                # Answered in the next second: the server may have decided in either, so
                # the answer is counted in neither.
                self.straddled += 1
            elif reply.overall_code == self._ok_code:
                self.ok[second] += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._channel.close()
