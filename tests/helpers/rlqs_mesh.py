"""A simulated mesh of Envoys on Envoy's rate limit quota service, over real gRPC: N streams
from one process, each a named Envoy, reporting as Envoy 1.40 reports and recording every
assignment it receives.

What each simulated Envoy does, as Envoy 1.40 does it:

- a bucket it sees for the first time is reported at once, alone, with ``time_elapsed`` 0 s;
- then every ``interval`` seconds one report carries every bucket it has seen, each with
  the whole seconds since that bucket's last report; the Envoys' cadences are staggered over
  the interval (as Envoys started at different times), not all in the same instant;
- its requests per second on each bucket (its demand) are set by the caller, and split into
  allowed and denied by what it holds: a token bucket lets its rate through, DENY_ALL none,
  ALLOW_ALL (and no assignment yet: the filter's fallback) all of them;
- a bucket it is told to abandon leaves its reports until :meth:`Mesh.see` brings it back.

Streams are spread over several channels, each its own connection, so that no connection's
HTTP/2 stream limit serializes them. Every assignment received is kept (the latest per
bucket, with the time it came) and handed to the mesh's listeners.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2

__all__ = [
    "BucketKey",
    "Envoy",
    "Held",
    "Listener",
    "Mesh",
    "fair_shares",
    "key_of",
    "until",
]

STREAM = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
ENVOY_HEADER = "ferryman-envoy"
#: Streams per channel (one connection each) when the caller does not choose.
STREAMS_PER_CHANNEL = 100
MAX_CHANNELS = 64

#: A bucket id as a hashable key: its entries sorted by key.
BucketKey = tuple[tuple[str, str], ...]
Usage = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]


def key_of(bucket: Mapping[str, str]) -> BucketKey:
    return tuple(sorted(bucket.items()))


@dataclass(frozen=True, slots=True)
class Held:
    """What an Envoy holds for a bucket: a token bucket's ``rate`` per second (``tokens``
    every ``fill_seconds``), or a blanket answer (``ALLOW_ALL``, ``DENY_ALL``, ``ABANDON``)
    with ``rate`` None (DENY_ALL: 0); ``at``, when it came (``time.monotonic()``)."""

    rate: float | None
    blanket: str | None
    at: float
    tokens: int = 0
    fill_seconds: int = 0


#: Called for every assignment received: (envoy, bucket, what it held before, what now).
Listener = Callable[["Envoy", BucketKey, "Held | None", Held], None]


def _held(action: Any, at: float) -> Held:
    if action.HasField("abandon_action"):
        return Held(None, "ABANDON", at)
    strategy = action.quota_assignment_action.rate_limit_strategy
    if strategy.HasField("token_bucket"):
        bucket = strategy.token_bucket
        tokens, seconds = bucket.tokens_per_fill.value, bucket.fill_interval.seconds
        return Held(tokens / max(seconds, 1), None, at, tokens, seconds)
    blanket = strategy.BlanketRule.Name(strategy.blanket_rule)
    return Held(0.0 if blanket == "DENY_ALL" else None, blanket, at)


@dataclass(slots=True)
class _Seen:
    """One bucket on one Envoy: its demand, when it was last reported, requests owed."""

    demand: float
    last: float
    carry: float = 0.0


@dataclass(eq=False)
class Envoy:
    """One simulated Envoy: its stream, its buckets and what it holds for each."""

    index: int
    name: str
    held: dict[BucketKey, Held] = field(default_factory=dict)
    #: When its first answer came (None: none yet).
    answered_at: float | None = None
    #: How its stream ended (None: still open, or ended by the mesh's close).
    code: grpc.StatusCode | None = None
    details: str = ""
    reports: int = 0
    entries: int = 0
    # When its last report was sent, until something comes back on its stream.
    _asked: float | None = None
    _settled: bool = False
    _seen: dict[BucketKey, _Seen] = field(default_factory=dict)
    _call: Any = None
    # One write at a time on a stream: the cadence's and a new bucket's.
    _writing: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def buckets(self) -> list[BucketKey]:
        return list(self._seen)

    def demand(self, bucket: BucketKey) -> float:
        """Its requests per second on ``bucket`` (0 once it has dropped the bucket)."""
        seen = self._seen.get(bucket)
        return 0.0 if seen is None else seen.demand


class Mesh:
    """``len(buckets)`` Envoys on the quota service at ``target`` (host:port), Envoy ``i``
    reporting the bucket ids ``buckets[i]`` of ``domain`` every ``interval`` seconds, each at
    ``demand`` requests per second until :meth:`set_demand` changes it."""

    def __init__(
        self,
        target: str,
        domain: str,
        buckets: Sequence[Sequence[Mapping[str, str]]],
        *,
        interval: float = 5.0,
        demand: float = 0.0,
        channels: int | None = None,
        name: Callable[[int], str] = lambda i: f"envoy-{i}",
    ) -> None:
        self.target = target
        self.domain = domain
        self.interval = interval
        self.envoys = [Envoy(i, name(i)) for i in range(len(buckets))]
        self._buckets = [[key_of(b) for b in own] for own in buckets]
        self._demand = demand
        count = channels or min(MAX_CHANNELS, math.ceil(len(buckets) / STREAMS_PER_CHANNEL))
        self._channel_count = max(1, count)
        self._channels: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.listeners: list[Listener] = []
        self.started_at = 0.0
        self._closing = False
        #: Seconds from a report to the next message on its stream (its answer, or a push).
        self.lags: list[float] = []
        #: Set once every stream has been answered or has ended.
        self.answered = asyncio.Event()
        self._unsettled = len(self.envoys)

    # -- opening and closing -------------------------------------------------------------

    async def start(self) -> None:
        """Open every stream at once, each sending its 0 s first report of every bucket."""
        # A local subchannel pool: each channel its own connection (channels to one target
        # otherwise share one).
        options = [("grpc.use_local_subchannel_pool", 1)]
        self._channels = [
            grpc.aio.insecure_channel(self.target, options=options)
            for _ in range(self._channel_count)
        ]
        self.started_at = time.monotonic()
        loop = asyncio.get_running_loop()
        for envoy in self.envoys:
            channel = self._channels[envoy.index % len(self._channels)]
            envoy._call = channel.stream_stream(
                STREAM,
                rlqs_pb2.RateLimitQuotaUsageReports.SerializeToString,
                rlqs_pb2.RateLimitQuotaResponse.FromString,
            )(metadata=((ENVOY_HEADER, envoy.name),))
        await asyncio.gather(*(self._open(e) for e in self.envoys))
        self._tasks.append(loop.create_task(self._report_forever()))

    async def _open(self, envoy: Envoy) -> None:
        now = time.monotonic()
        for key in self._buckets[envoy.index]:
            envoy._seen[key] = _Seen(self._demand, now)
        await self._send(envoy, [(key, 0) for key in envoy._seen], now)
        self._tasks.append(asyncio.get_running_loop().create_task(self._read(envoy)))

    @property
    def opened_seconds(self) -> float:
        """Seconds from the start to the last first answer received so far."""
        ends = [e.answered_at for e in self.envoys if e.answered_at is not None]
        return max(ends, default=self.started_at) - self.started_at

    def _settled(self, envoy: Envoy) -> None:
        # Its first answer, or its end: the stream is no longer waiting to be answered.
        if not envoy._settled:
            envoy._settled = True
            self._unsettled -= 1
            if not self._unsettled:
                self.answered.set()

    async def close(self) -> None:
        """End every stream (the client cancels it, as an Envoy that goes away)."""
        self._closing = True
        for envoy in self.envoys:
            if envoy._call is not None:
                envoy._call.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels:
            await channel.close()
        self._tasks, self._channels = [], []

    # -- what the caller sets and reads --------------------------------------------------

    def set_demand(
        self, demand: Callable[[Envoy, BucketKey], float], envoys: Iterable[Envoy] | None = None
    ) -> None:
        """Each Envoy's requests per second on each of its buckets from now on."""
        for envoy in self.envoys if envoys is None else envoys:
            for key, seen in envoy._seen.items():
                seen.demand = demand(envoy, key)

    async def see(self, envoy: Envoy, bucket: Mapping[str, str], demand: float) -> None:
        """A new bucket on ``envoy``: reported at once, alone, with 0 s."""
        key, now = key_of(bucket), time.monotonic()
        if key not in envoy._seen:
            envoy._seen[key] = _Seen(demand, now)
            await self._send(envoy, [(key, 0)], now)

    @property
    def accepted(self) -> list[Envoy]:
        """The Envoys answered at least once whose streams did not end in an error."""
        return [e for e in self.envoys if e.answered_at is not None and e.code is None]

    @property
    def refused(self) -> list[Envoy]:
        return [e for e in self.envoys if e.code is not None]

    @property
    def entries(self) -> int:
        """Bucket entries reported in all (the 0 s first reports included)."""
        return sum(e.entries for e in self.envoys)

    # -- the streams ---------------------------------------------------------------------

    async def _report_forever(self) -> None:
        """Every Envoy's periodic report, its cadence staggered over the interval."""
        count = len(self.envoys)
        due = [(self.started_at + self.interval * (1 + i / count), i) for i in range(count)]
        heapq.heapify(due)
        while due:
            at, i = due[0]
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            heapq.heapreplace(due, (at + self.interval, i))
            envoy = self.envoys[i]
            if envoy.code is None and envoy._seen:
                seen = envoy._seen.items()
                # Whole seconds, as Envoy sends them (its cadence is exact: so is ours).
                await self._send(envoy, [(k, round(at - s.last)) for k, s in seen], at)

    async def _send(self, envoy: Envoy, buckets: list[tuple[BucketKey, int]], at: float) -> None:
        usages = []
        for key, seconds in buckets:
            seen = envoy._seen[key]
            owed = seen.demand * seconds + seen.carry
            hits = math.floor(owed)
            seen.carry, seen.last = owed - hits, at
            allowed = hits
            held = envoy.held.get(key)
            if held is not None and held.rate is not None:
                allowed = min(hits, math.floor(held.rate * seconds))
            usages.append(
                Usage(
                    bucket_id=rlqs_pb2.BucketId(bucket=dict(key)),
                    num_requests_allowed=allowed,
                    num_requests_denied=hits - allowed,
                    time_elapsed={"seconds": seconds},
                )
            )
        message = rlqs_pb2.RateLimitQuotaUsageReports(
            domain=self.domain, bucket_quota_usages=usages
        )
        if envoy._asked is None:  # before the write: its answer may come before it returns
            envoy._asked = time.monotonic()
        try:
            async with envoy._writing:
                await envoy._call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return  # the stream ended: its reader records how
        envoy.reports += 1
        envoy.entries += len(usages)

    async def _read(self, envoy: Envoy) -> None:
        call = envoy._call
        try:
            while (response := await call.read()) is not _EOF:
                at = time.monotonic()
                if envoy.answered_at is None:
                    envoy.answered_at = at
                    self._settled(envoy)
                if envoy._asked is not None:
                    self.lags.append(at - envoy._asked)
                    envoy._asked = None
                for action in response.bucket_action:
                    key = key_of(action.bucket_id.bucket)
                    new = _held(action, at)
                    old = envoy.held.get(key)
                    envoy.held[key] = new
                    if new.blanket == "ABANDON":
                        # Envoy drops the bucket, until a request brings it back (see()).
                        envoy._seen.pop(key, None)
                    for listener in self.listeners:
                        listener(envoy, key, old, new)
            await self._ended(envoy, await call.code(), await call.details())
        except grpc.aio.AioRpcError as error:
            await self._ended(envoy, error.code(), error.details() or "")

    async def _ended(self, envoy: Envoy, code: grpc.StatusCode, details: str) -> None:
        if not self._closing:
            envoy.code, envoy.details = code, details
            self._settled(envoy)


async def until(predicate: Callable[[], bool]) -> float:
    """Seconds until ``predicate()`` holds, polled every 20 ms (the caller bounds the wait
    with ``asyncio.timeout``)."""
    start = time.monotonic()
    # Polled, not an Event: what it reads changes with every assignment and with time.
    while not predicate():  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def fair_shares(rate: float, demands: Mapping[Any, float]) -> dict[Any, float]:
    """Max-min fair shares of ``rate`` by ``demands`` (those wanting less than an equal share
    get what they want, the others split the rest), what is left over spread evenly: what
    each Envoy should hold once the server has seen the demands."""
    shares: dict[Any, float] = {}
    left, ordered = rate, sorted(demands.items(), key=lambda item: item[1])
    for n, (name, demand) in enumerate(ordered):
        equal = left / (len(ordered) - n)
        shares[name] = min(demand, equal)
        left -= shares[name]
    if shares and left > 0:
        shares = {name: share + left / len(shares) for name, share in shares.items()}
    return shares
