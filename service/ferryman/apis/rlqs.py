"""Envoy's rate limit quota service, ``envoy.service.rate_limit_quota.v3.RateLimitQuotaService``
``StreamRateLimitQuotas``: Envoy enforces locally what it is assigned and reports its usage;
ferryman divides each bucket's global rate among the Envoys by demand and pushes the shares.

A bucket is a descriptor: its ``BucketId`` walks the tree of the filter's ``domain`` (at each
level the first node, in config order, whose key the id has and whose value matches as
ShouldRateLimit matches), and the rule reached gives the global rate through its kind's
``Algorithm.rate()``. The arithmetic (demand, split, token buckets) is ``rlqs_shares``.

What each answer is:

- a rule with a rate: each Envoy's share as a token bucket (the limit 0: DENY_ALL);
- ``unlimited``, shadow mode, a kind with no rate, no rule: ALLOW_ALL (all but ``unlimited``
  counted, so that an operator sees traffic nothing limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from ferryman._version import __version__
from ferryman.algorithms import algorithm_of
from ferryman.algorithms.leases.model import Kind, find_template
from ferryman.apis import api
from ferryman.apis.rlqs_leases import PREFIX, BucketLeases, resource_id
from ferryman.apis.rlqs_shares import (
    TTL_SECONDS,
    Bucket,
    Meter,
    buckets_of,
    observe,
    split_by_claimant,
)
from ferryman.clock import Clock
from ferryman.config.model import Config
from ferryman.config.reloader import ConfigHolder
from ferryman.core.algorithm import Rate
from ferryman.core.answers import EngineOptions
from ferryman.core.rules import Domain, Rule
from ferryman.engine.explain import explain, rule_text
from ferryman.errors import FerrymanError, RequestError, TooManyStreamsError
from ferryman.settings import Settings
from ferryman.stats import Stats
from ferryman.tasks import cancel
from ferryman.telemetry import SCOPE, Telemetry

__all__ = [
    "ENVOY_HEADER",
    "LIMITS",
    "Limits",
    "QuotaShares",
    "Resolved",
    "bucket_entries",
    "explain_bucket",
    "render_bucket",
    "resolve",
    "resolve_in",
    "rlqs_limits",
    "serving",
]

log = logging.getLogger("ferryman.rlqs")

#: The initial metadata that names an Envoy (``rlqs_server.initial_metadata``); else its peer.
ENVOY_HEADER = "ferryman-envoy"
RLQS = "ratelimit.service.rlqs"
#: Answers, by what they are, as counted (``ratelimit.service.rlqs.assigned.<what>``).
ANSWERS = ("share", "deny", "unlimited", "unconfigured", "no_rate", "shadow_mode")
Context = grpc.aio.ServicerContext[Any, Any]
# An increase this small is not pushed: Envoy starts a changed bucket full.
_NUDGE = 0.02
#: The divisions a bucket may name: those whose shares add up to the rate at most.
SHARING = frozenset({Kind.FAIR_SHARE, Kind.PROPORTIONAL_SHARE})
#: Seconds between two looks, after a tick, for rises whose falls have been written.
RAISE_AFTER = 0.05
#: Reports in a row with no request after which an Envoy's bucket is abandoned.
IDLE_REPORTS = 12


@dataclass(frozen=True, slots=True)
class Limits:
    """What one stream and the whole service hold at most; a report over them is refused
    (INVALID_ARGUMENT naming the field), a stream over them RESOURCE_EXHAUSTED."""

    streams: int = 10_000
    buckets_per_report: int = 1000
    buckets_per_stream: int = 1000
    buckets: int = 100_000
    #: (Envoy, bucket) pairs held in all: what memory grows with.
    pairs: int = 1_000_000
    #: What one caller (an identity, or an address without one) holds at most (0: only the
    #: limits of the whole process).
    streams_per_caller: int = 0
    pairs_per_caller: int = 0
    #: Seconds between two divisions of a bucket whose demand, Envoys, config or lease changed.
    tick_seconds: float = 1.0
    #: Seconds after the start during which demand is learnt and nothing is assigned (0:
    #: none): Envoys that held shares before a restart still enforce them meanwhile.
    learning_seconds: float = 0.0
    id_entries: int = 16
    id_chars: int = 256
    requests_per_report: int = 1_000_000_000
    seconds_per_report: int = 86_400


LIMITS = Limits()


def rlqs_limits(settings: Settings) -> Limits:
    """The limits the settings give (``RLQS_MAX_STREAMS``, ``RLQS_MAX_PAIRS``...)."""
    return replace(
        LIMITS,
        streams=settings.rlqs_max_streams,
        pairs=settings.rlqs_max_pairs,
        buckets=settings.rlqs_max_buckets,
        streams_per_caller=settings.rlqs_max_streams_per_caller,
        pairs_per_caller=settings.rlqs_max_pairs_per_caller,
        tick_seconds=settings.rlqs_tick,
        learning_seconds=settings.rlqs_learning,
    )


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a bucket id reaches: its rule (None: no path), what every Envoy is answered
    (``share`` or one of the blanket answers of ``ANSWERS``), and the rate shared."""

    answer: str
    rule: Rule | None = None
    rate: Rate | None = None
    kind: Kind = Kind.FAIR_SHARE


def bucket_entries(domain: Domain, bucket: Mapping[str, str]) -> list[tuple[str, str]] | None:
    """The id's entries in the order of the path they walk, or None when there is none: at
    each level the first node (config order) whose key the id has and whose value matches;
    every entry of the id must be used."""
    level, left, path = domain.root, dict(bucket), []
    while left:
        for key in dict.fromkeys(rule.key for rule in level.rules):
            if key in left and (rule := level.match(key, left[key])) is not None:
                path.append((key, left.pop(key)))
                level = rule.children
                break
        else:
            return None
    return path


def resolve(domain: Domain | None, bucket: Mapping[str, str], shadow_mode: bool) -> Resolved:
    """What the bucket id ``bucket`` of ``domain`` (None: not configured) is answered."""
    entries = None if domain is None else bucket_entries(domain, bucket)
    if domain is None or not entries:
        return Resolved("unconfigured")
    level, rule = domain.root, None
    for key, value in entries:
        rule = level.match(key, value)
        assert rule is not None
        level = rule.children
    if rule is None or rule.limit is None:
        return Resolved("unconfigured", rule)
    algorithm = algorithm_of(rule.limit.kind)
    rate = algorithm.rate(rule.limit)
    if rate is None:
        reported = algorithm.reported(rule.limit)
        unlimited = reported is not None and reported.unlimited
        return Resolved("unlimited" if unlimited else "no_rate", rule)
    if shadow_mode or rule.shadow_mode:
        return Resolved("shadow_mode", rule, rate)
    if rate.per_second <= 0:
        return Resolved("deny", rule, rate)
    return Resolved("share", rule, rate)


def resolve_in(
    config: Config | None, domain: str, bucket: Mapping[str, str], shadow_mode: bool
) -> Resolved:
    """:func:`resolve` in ``config``; a resources file may name how a shared bucket is
    divided, with a template whose glob starts ``rlqs/`` (FAIR_SHARE or PROPORTIONAL_SHARE)."""
    dom = None if config is None else config.domains.get(domain)
    resolved = resolve(dom, bucket, shadow_mode)
    if config is None or resolved.answer != "share":
        return resolved
    template = find_template(config.resources, resource_id(_key(domain, bucket)))
    if template is None or not template.identifier_glob.startswith(PREFIX):
        return resolved
    kind = template.algorithm.kind
    return replace(resolved, kind=kind) if kind in SHARING else resolved


def explain_bucket(
    config: Config, options: EngineOptions, domain: str, bucket: Mapping[str, str], now: float
) -> dict[str, Any]:
    """``ferryman explain --bucket``: the path the bucket id walks, the rule it reaches and
    what every Envoy reporting it is answered (with the walk as ShouldRateLimit explains it)."""
    dom = config.domains.get(domain)
    entries = None if dom is None else bucket_entries(dom, bucket)
    resolved = resolve_in(config, domain, bucket, options.shadow_mode)
    rate = resolved.rate
    out: dict[str, Any] = {
        "domain": domain,
        "bucket_id": dict(bucket),
        "entries": entries,
        "answer": resolved.answer,
        "rate_per_second": None if rate is None else rate.per_second,
        "burst": None if rate is None else rate.burst,
        "algorithm": resolved.kind.name,
    }
    if entries:
        out["explain"] = explain(config, domain, [entries], options, now).as_dict()
    return out


_ANSWER_TEXT = {
    "share": "each Envoy its share by demand, as a token bucket",
    "deny": "DENY_ALL (a limit of 0)",
    "unlimited": "ALLOW_ALL (unlimited)",
    "unconfigured": "ALLOW_ALL, counted (no rule: traffic no limit governs)",
    "no_rate": "ALLOW_ALL, counted (the rule's kind has no rate to share)",
    "shadow_mode": "ALLOW_ALL, counted (shadow mode)",
}


def render_bucket(answer: Mapping[str, Any]) -> str:
    """:func:`explain_bucket`'s answer as text."""
    shown = ",".join(f"{k}={v}" for k, v in sorted(answer["bucket_id"].items()))
    lines = [f"domain {answer['domain']} bucket {shown}"]
    entries = answer["entries"]
    if entries is None:
        lines.append("  walk: no path of the tree uses every entry of the id")
    else:
        lines.append("  walk: " + " -> ".join(f"{k}={v}" for k, v in entries))
    rule = answer.get("explain", {}).get("descriptors", [{}])[0].get("rule")
    if rule is not None:
        lines.append("  rule: " + rule_text(rule))
    lines.append("  envoys are assigned: " + _ANSWER_TEXT[answer["answer"]])
    if answer["rate_per_second"] is not None:
        lines.append(
            f"  global rate: {answer['rate_per_second']:g}/s, burst {answer['burst']:g}, "
            f"divided by {answer['algorithm']}"
        )
    for e in answer.get("envoys", ()):
        share, demand = e["share_per_second"], e["demand_per_second"]
        lines.append(
            f"  envoy {e['envoy']}: share {'-' if share is None else f'{share:.2f}/s'}, "
            f"demand {'-' if demand is None else f'{demand:.2f}/s'}, "
            f"allowed {e['allowed']}, denied {e['denied']}"
        )
    return "\n".join(lines) + "\n"


BucketKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(slots=True)
class _Usage:
    """One Envoy's side of one bucket."""

    meter: Meter = field(default_factory=Meter)
    allowed: int = 0
    denied: int = 0
    reports: int = 0
    idle: int = 0
    share: float | None = None
    sent: Bucket | str | None = None
    sent_at: float = 0.0
    # Who the Envoy is (its caller's key): one claimant however many streams it opens.
    claimant: str = ""
    # The BucketAction of ``sent``: a report renewing the same assignment reuses it.
    action: Any = None
    envoy: str = ""
    # Its stream has ended: the Envoy enforces the last bucket sent until its TTL, which
    # stays reserved until then (handed to the others at once, the sum would pass the limit).
    gone: bool = False


@dataclass(slots=True)
class _Bucket:
    key: BucketKey
    resolved: Resolved
    users: dict[int, _Usage] = field(default_factory=dict)
    # The rate divided among this replica's Envoys: the rule's, or this replica's lease of it.
    capacity: float | None = None
    # The streams whose fall is queued but not yet handed to gRPC: rises wait for them.
    falling: set[int] = field(default_factory=set)


@dataclass(slots=True, eq=False)
class _Stream:
    id: int
    envoy: str
    claimant: str = ""
    domain: str | None = None
    buckets: dict[BucketKey, _Bucket] = field(default_factory=dict)
    # Coalesced: a stream that does not read holds one pending action per bucket at most.
    pending: dict[BucketKey, Any] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    error: FerrymanError | None = None
    closed: bool = False


def _check_report(message: Any, limits: Limits) -> None:
    """Refuse what no Envoy sends: RequestError names the field."""
    if not message.domain:
        raise RequestError("domain", "a report names the filter's domain")
    if len(message.domain) > limits.id_chars:
        raise RequestError("domain", f"longer than {limits.id_chars} characters")
    usages = message.bucket_quota_usages
    if len(usages) > limits.buckets_per_report:
        raise RequestError(
            "bucket_quota_usages", f"{len(usages)} buckets; at most {limits.buckets_per_report}"
        )
    for i, usage in enumerate(usages):
        where = f"bucket_quota_usages[{i}]"
        bucket = usage.bucket_id.bucket
        if not bucket:
            raise RequestError(f"{where}.bucket_id", "an empty bucket id")
        if len(bucket) > limits.id_entries:
            raise RequestError(f"{where}.bucket_id", f"more than {limits.id_entries} entries")
        if any(len(k) > limits.id_chars or len(v) > limits.id_chars for k, v in bucket.items()):
            raise RequestError(f"{where}.bucket_id", f"longer than {limits.id_chars} characters")
        hits = usage.num_requests_allowed + usage.num_requests_denied
        if hits > limits.requests_per_report:
            raise RequestError(where, f"{hits} requests in one report")
        seconds = usage.time_elapsed.seconds
        if seconds < 0 or usage.time_elapsed.nanos < 0 or seconds > limits.seconds_per_report:
            raise RequestError(f"{where}.time_elapsed", f"{seconds}s is no report interval")


def _key(domain: str, bucket: Mapping[str, str]) -> BucketKey:
    return (domain, tuple(sorted(bucket.items())))


def _bucket_id(key: BucketKey) -> Any:
    from envoy.service.rate_limit_quota.v3 import rlqs_pb2  # loaded by the first stream

    return rlqs_pb2.BucketId(bucket=dict(key[1]))


def _action(key: BucketKey, sent: Bucket | str) -> Any:
    """The BucketAction that assigns ``sent`` (a token bucket or a blanket answer)."""
    from envoy.service.rate_limit_quota.v3 import rlqs_pb2
    from envoy.type.v3.ratelimit_strategy_pb2 import RateLimitStrategy

    action = rlqs_pb2.RateLimitQuotaResponse.BucketAction(bucket_id=_bucket_id(key))
    if sent == "abandon":
        action.abandon_action.SetInParent()
        return action
    assignment = action.quota_assignment_action
    assignment.assignment_time_to_live.seconds = TTL_SECONDS
    strategy = assignment.rate_limit_strategy
    if isinstance(sent, Bucket) and sent.tokens_per_fill > 0:
        strategy.token_bucket.max_tokens = sent.max_tokens
        strategy.token_bucket.tokens_per_fill.value = sent.tokens_per_fill
        strategy.token_bucket.fill_interval.seconds = sent.fill_seconds
    else:
        rule = RateLimitStrategy.BlanketRule
        strategy.blanket_rule = rule.DENY_ALL if isinstance(sent, Bucket) else rule.ALLOW_ALL
    return action


def _worth_sending(old: Bucket | str | None, new: Bucket | str) -> bool:
    """Whether a new assignment replaces the last one sent: any decrease (the shares must not
    add up to more than the limit), an increase only beyond a nudge (a changed bucket
    restarts full, which lets a burst through)."""
    if not isinstance(old, Bucket) or not isinstance(new, Bucket):
        return old != new
    if new.per_second <= old.per_second:
        return new != old
    return new.per_second > old.per_second * (1 + _NUDGE) or old.tokens_per_fill == 0


class QuotaShares:
    """Every stream's buckets and usage, and the shares they are assigned.

    A report only records its Envoy's demand and is answered at once with that Envoy's
    current assignment (renewing its time to live). Every change (a report, a stream opened
    or closed, a new config, a lease) marks the buckets it touches, and :meth:`tick`
    re-divides each marked bucket once and queues, for each stream, only the assignments
    that changed: a bucket costs one division per tick, however many Envoys report it."""

    def __init__(
        self,
        holder: ConfigHolder,
        clock: Clock,
        stats: Stats,
        *,
        shadow_mode: bool = False,
        limits: Limits = LIMITS,
    ) -> None:
        self._holder = holder
        self._clock = clock
        self._stats = stats
        self._shadow_mode = shadow_mode
        self.limits = limits
        self._ids = itertools.count(1)
        self.streams: dict[int, _Stream] = {}
        self.buckets: dict[BucketKey, _Bucket] = {}
        self._version = holder.version
        # Set with a shared backend: the rates are leased from the capacity master.
        self.leases: BucketLeases | None = None
        # Buckets to divide again at the next tick, in the order they were marked.
        self._marked: dict[BucketKey, _Bucket] = {}
        # Buckets some of whose rises wait for the falls sent before them to be written.
        self._deferred: dict[BucketKey, _Bucket] = {}
        # Ended streams' assignments, by when their time to live runs out.
        self._ending: list[tuple[float, int, BucketKey]] = []
        self.pairs = 0
        # Streams and pairs held by each caller, for the caps per caller, and each caller's
        # idle buckets (stream, bucket), the first to go when room is needed.
        self._streams_of: dict[str, int] = {}
        self._pairs_of: dict[str, int] = {}
        self._idle_of: dict[str, dict[tuple[int, BucketKey], None]] = {}
        # Learning: until then demand is recorded and nothing is divided (see tick).
        self._learning_until = clock.now() + limits.learning_seconds
        self.learning = limits.learning_seconds > 0

    def open(self, envoy: str, claimant: str | None = None) -> _Stream:
        """A new stream of the Envoy named ``envoy``, for the caller ``claimant`` (whose
        streams count as one claimant; None: the Envoy's name); TooManyStreamsError past a
        limit."""
        limits = self.limits
        claimant = envoy if claimant is None else claimant
        mine = self._streams_of.get(claimant, 0)
        if len(self.streams) >= limits.streams or (
            limits.streams_per_caller and mine >= limits.streams_per_caller
        ):
            self._stats.inc(f"{RLQS}.streams_refused")
            most = limits.streams if len(self.streams) >= limits.streams else None
            raise TooManyStreamsError(
                f"at most {most} quota streams at once"
                if most is not None
                else f"at most {limits.streams_per_caller} quota streams per caller"
            )
        stream = _Stream(next(self._ids), envoy[: limits.id_chars], claimant)
        self._streams_of[claimant] = mine + 1
        self.streams[stream.id] = stream
        self._stats.inc(f"{RLQS}.streams_opened")
        return stream

    def close(self, stream: _Stream) -> None:
        stream.closed = True
        stream.wake.set()
        if self.streams.pop(stream.id, None) is None:
            return
        _forget(self._streams_of, stream.claimant)
        for bucket in stream.buckets.values():
            bucket.falling.discard(stream.id)
            user = bucket.users.get(stream.id)
            if user is None:
                continue
            if isinstance(user.sent, Bucket) and user.sent.tokens_per_fill > 0:
                user.gone = True
                heapq.heappush(self._ending, (user.sent_at + TTL_SECONDS, stream.id, bucket.key))
                continue
            self._leave(bucket, stream.id)

    def _leave(self, bucket: _Bucket, sid: int) -> None:
        user = bucket.users.pop(sid)
        self.pairs -= 1
        _forget(self._pairs_of, user.claimant)
        idle = self._idle_of.get(user.claimant)
        if idle is not None:
            idle.pop((sid, bucket.key), None)
            if not idle:
                del self._idle_of[user.claimant]
        if bucket.users:
            self._mark(bucket)
        else:
            self._drop(bucket)

    def _mark(self, bucket: _Bucket) -> None:
        self._marked[bucket.key] = bucket

    def expire(self) -> None:
        """Hand the shares of ended streams to the others once their TTL has run out (the
        others get them at the next tick)."""
        now = self._clock.now()
        while self._ending and self._ending[0][0] <= now:
            _, sid, key = heapq.heappop(self._ending)
            bucket = self.buckets.get(key)
            user = None if bucket is None else bucket.users.get(sid)
            if bucket is not None and user is not None and user.gone:
                self._leave(bucket, sid)

    def tick(self) -> None:
        """Divide every marked bucket again, once, and queue the assignments that changed."""
        if self.learning and self._clock.now() >= self._learning_until:
            self.learning = False
            self._marked.update(self.buckets)
        self.refresh()
        self.expire()
        self.poll_leases()
        marked, self._marked = self._marked, {}
        for key, bucket in marked.items():
            if self.buckets.get(key) is bucket:
                self._reshare(bucket)

    def report(self, stream: _Stream, message: Any) -> None:
        """One usage report of ``stream``: its demand recorded and its buckets marked for the
        next tick; the stream answered at once for every bucket it reported that holds an
        assignment (the answer renews its TTL). A bucket's first Envoy is assigned at once
        (its whole division is that one share); a later one at the next tick."""
        _check_report(message, self.limits)
        if stream.domain is None:
            stream.domain = message.domain
        elif message.domain != stream.domain:
            raise RequestError("domain", f"{message.domain!r}: this stream is {stream.domain!r}")
        self._stats.inc(f"{RLQS}.reports")
        self.refresh()
        for usage in message.bucket_quota_usages:
            bucket = self._bucket_of(stream, _key(message.domain, usage.bucket_id.bucket))
            if bucket is None:
                continue
            user = bucket.users.get(stream.id)
            if user is None:
                user = bucket.users[stream.id] = _Usage(envoy=stream.envoy)
                user.claimant = stream.claimant
                self.pairs += 1
                self._pairs_of[stream.claimant] = self._pairs_of.get(stream.claimant, 0) + 1
            hits = usage.num_requests_allowed + usage.num_requests_denied
            user.meter = observe(user.meter, hits, usage.time_elapsed.seconds)
            user.allowed += usage.num_requests_allowed
            user.denied += usage.num_requests_denied
            user.reports += 1
            user.idle = 0 if hits else user.idle + 1
            self._note_idle(stream, bucket.key, user)
            if user.idle >= IDLE_REPORTS:
                self._abandon(stream, bucket)
            elif user.sent is not None:
                self._queue(stream, bucket, user, user.sent)
                self._mark(bucket)
            elif len(bucket.users) == 1 and not self.learning:
                self._reshare(bucket)
            else:
                self._mark(bucket)

    def _bucket_of(self, stream: _Stream, key: BucketKey) -> _Bucket | None:
        bucket = stream.buckets.get(key)
        if bucket is not None:
            return bucket
        if not self._room_for(stream, key):
            # No answer: Envoy applies the filter's no-assignment behaviour to it.
            self._stats.inc(f"{RLQS}.buckets_refused")
            return None
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = _Bucket(key, self._resolve(key))
            self.buckets[key] = bucket
        stream.buckets[key] = bucket
        return bucket

    def _room_for(self, stream: _Stream, key: BucketKey) -> bool:
        """Whether ``stream`` may hold one more bucket, ``key``. A caller at its own cap
        makes room among its own idle buckets; a full table, among the idle buckets of
        the caller holding the most (an idle bucket: its last report had no request)."""
        limits = self.limits
        if len(stream.buckets) >= limits.buckets_per_stream:
            return False
        mine = self._pairs_of.get(stream.claimant, 0)
        capped = bool(limits.pairs_per_caller) and mine >= limits.pairs_per_caller
        if capped and not self._evict_idle(stream.claimant, need_bucket=False):
            return False
        new_bucket = key not in self.buckets
        while self.pairs >= limits.pairs or (new_bucket and len(self.buckets) >= limits.buckets):
            most = max(self._idle_of, key=lambda c: self._pairs_of.get(c, 0), default=None)
            full = len(self.buckets) >= limits.buckets and new_bucket
            if most is None or not self._evict_idle(most, need_bucket=full):
                return False
        return True

    def _note_idle(self, stream: _Stream, key: BucketKey, user: _Usage) -> None:
        idle = self._idle_of.setdefault(stream.claimant, {})
        if user.idle:
            idle[stream.id, key] = None
        else:
            idle.pop((stream.id, key), None)
            if not idle:
                del self._idle_of[stream.claimant]

    def _evict_idle(self, claimant: str, need_bucket: bool) -> bool:
        """Abandon one idle bucket of ``claimant`` (with ``need_bucket``, one no other Envoy
        holds, so that the bucket goes too); whether one was."""
        idle = self._idle_of.get(claimant, {})
        for sid, key in list(idle):
            del idle[sid, key]
            stream, bucket = self.streams.get(sid), self.buckets.get(key)
            if stream is None or bucket is None or sid not in bucket.users:
                continue
            if need_bucket and len(bucket.users) > 1:
                idle[sid, key] = None  # kept: it frees no bucket
                continue
            self._abandon(stream, bucket)
            self._stats.inc(f"{RLQS}.evicted")
            return True
        if not idle:
            self._idle_of.pop(claimant, None)
        return False

    def _resolve(self, key: BucketKey) -> Resolved:
        return resolve_in(self._holder.config, key[0], dict(key[1]), self._shadow_mode)

    def rate_of(self, key: BucketKey) -> tuple[float, Kind] | None:
        """The rate the bucket ``key`` is shared at and how (None: not shared), for the
        capacity master."""
        resolved = self._resolve(key)
        if resolved.answer != "share" or resolved.rate is None:
            return None
        return resolved.rate.per_second, resolved.kind

    def _capacity(self, bucket: _Bucket, rate: Rate) -> float | None:
        if self.leases is None:
            return rate.per_second
        wants = sum(
            rate.per_second if (d := u.meter.rate) is None else d for u in bucket.users.values()
        )
        return self.leases.capacity(bucket.key, min(wants, rate.per_second))

    def poll_leases(self) -> None:
        """Mark every bucket whose lease changed (and so reach a new bucket's Envoys once its
        first lease comes): a look at each lease, not at its Envoys (their demand is asked
        for when the bucket is divided)."""
        leases = self.leases
        if leases is None:
            return
        for key, bucket in self.buckets.items():
            if bucket.resolved.answer == "share" and leases.current(key) != bucket.capacity:
                self._mark(bucket)

    def refresh(self) -> None:
        """After a config change: every bucket resolved again and marked."""
        if self._holder.version == self._version:
            return
        self._version = self._holder.version
        for bucket in self.buckets.values():
            bucket.resolved = self._resolve(bucket.key)
            self._mark(bucket)

    def _reshare(self, bucket: _Bucket) -> None:
        """Divide ``bucket`` again; queue each stream's changed assignment (and a first one
        to an Envoy that has none yet); nothing while learning."""
        if self.learning:
            return
        resolved = bucket.resolved
        rate = resolved.rate
        shares: dict[int, float] = {}
        if resolved.answer == "share" and rate is not None:
            bucket.capacity = self._capacity(bucket, rate)
            if bucket.capacity is None:
                return  # no lease yet, or none live: nothing new is assigned
            users = bucket.users.values()
            reserved = sum(
                u.sent.per_second for u in users if u.gone and isinstance(u.sent, Bucket)
            )
            live = {sid: u for sid, u in bucket.users.items() if not u.gone}
            shares = split_by_claimant(
                resolved.kind,
                max(0.0, bucket.capacity - reserved),
                {sid: u.meter.rate for sid, u in live.items()},
                {sid: u.claimant for sid, u in live.items()},
            )
        self._push(bucket, shares)

    def _push(self, bucket: _Bucket, shares: dict[int, float]) -> None:
        """Queue each Envoy's changed assignment. A rise is sent only while what is in force
        (the assignments sent, a fall counted at its old rate until it has been written)
        leaves room for it under the capacity; the rest wait for :meth:`raise_deferred`,
        so that the Envoys never hold more than the limit between two answers."""
        resolved, rate = bucket.resolved, bucket.resolved.rate
        burst_ratio = rate.burst / rate.per_second if rate and rate.per_second > 0 else None
        buckets = buckets_of(shares, burst_ratio)
        users = bucket.users
        in_force = sum(u.sent.per_second for u in users.values() if isinstance(u.sent, Bucket))
        room = (bucket.capacity or 0.0) - in_force
        for sid, user in list(users.items()):
            stream = self.streams.get(sid)
            if stream is None:
                continue
            new: Bucket | str
            if sid in shares and rate is not None:
                user.share, new = shares[sid], buckets[sid]
            elif resolved.answer == "deny":
                user.share, new = 0.0, Bucket(0, 0, 1)
            else:
                user.share, new = None, resolved.answer
            if user.sent is not None and not _worth_sending(user.sent, new):
                continue
            if isinstance(new, Bucket) and sid in shares:
                rise = new.per_second - (
                    user.sent.per_second if isinstance(user.sent, Bucket) else 0.0
                )
                if rise > 0:
                    if rise > room + 1e-9:
                        self._deferred[bucket.key] = bucket
                        continue
                    room -= rise
                elif rise < 0:
                    bucket.falling.add(sid)
            self._queue(stream, bucket, user, new)

    def raise_deferred(self) -> None:
        """Divide again the buckets whose rises waited for room and whose falls have all
        been handed to gRPC (:meth:`take`), sending what now fits; the others wait on."""
        deferred, self._deferred = self._deferred, {}
        for key, bucket in deferred.items():
            if self.buckets.get(key) is not bucket:
                continue
            if bucket.falling:
                self._deferred[key] = bucket
            else:
                self._reshare(bucket)

    def _queue(self, stream: _Stream, bucket: _Bucket, user: _Usage, sent: Bucket | str) -> None:
        if user.action is None or sent != user.sent:
            user.action = _action(bucket.key, sent)
        user.sent, user.sent_at = sent, self._clock.now()
        stream.pending[bucket.key] = user.action
        stream.wake.set()
        self._stats.inc(f"{RLQS}.assigned.{bucket.resolved.answer}")

    def _abandon(self, stream: _Stream, bucket: _Bucket) -> None:
        """An Envoy's bucket idle for IDLE_REPORTS reports is abandoned (never a busy one:
        Envoy re-creates an abandoned bucket on its next request and reports it at once)."""
        stream.pending[bucket.key] = _action(bucket.key, "abandon")
        stream.wake.set()
        self._stats.inc(f"{RLQS}.abandoned")
        stream.buckets.pop(bucket.key, None)
        self._leave(bucket, stream.id)

    def _drop(self, bucket: _Bucket) -> None:
        self.buckets.pop(bucket.key, None)
        self._marked.pop(bucket.key, None)
        self._deferred.pop(bucket.key, None)
        if self.leases is not None:
            self.leases.forget(bucket.key)

    def take(self, stream: _Stream) -> Any | None:
        """The stream's queued assignments as one response (None: nothing queued)."""
        if not stream.pending:
            return None
        from envoy.service.rate_limit_quota.v3 import rlqs_pb2

        for key in stream.pending:
            bucket = stream.buckets.get(key)
            if bucket is not None:
                bucket.falling.discard(stream.id)
        actions = list(stream.pending.values())
        stream.pending.clear()
        return rlqs_pb2.RateLimitQuotaResponse(bucket_action=actions)

    def close_all(self) -> None:
        """End every stream (at shutdown): each Envoy keeps its bucket until the TTL."""
        for stream in list(self.streams.values()):
            self.close(stream)

    def status(self, limit: int = 1000) -> dict[str, Any]:
        """The debug port's ``/rlqs``: streams, and per bucket and Envoy the share, demand
        and what its reports said (the ``limit`` buckets with the most Envoys)."""
        ranked = sorted(self.buckets.values(), key=lambda b: (-len(b.users), b.key))
        return {
            "streams": [
                {"envoy": s.envoy, "domain": s.domain, "buckets": len(s.buckets)}
                for s in self.streams.values()
            ],
            "bucket_count": len(self.buckets),
            "pairs": self.pairs,
            "leases": self.leases.status() if self.leases is not None else None,
            "buckets": [self._bucket_status(b) for b in ranked[:limit]],
        }

    def envoys_of(self, domain: str, bucket: Mapping[str, str]) -> list[dict[str, Any]]:
        """Each Envoy's share, demand and usage of one bucket ([] when none reports it)."""
        held = self.buckets.get(_key(domain, bucket))
        return [] if held is None else self._bucket_status(held)["envoys"]

    def _bucket_status(self, bucket: _Bucket) -> dict[str, Any]:
        resolved = bucket.resolved
        rate = resolved.rate
        envoys = []
        for user in bucket.users.values():
            sent = user.sent
            envoys.append(
                {
                    "envoy": user.envoy,
                    "connected": not user.gone,
                    "share_per_second": user.share,
                    "demand_per_second": user.meter.rate,
                    "allowed": user.allowed,
                    "denied": user.denied,
                    "reports": user.reports,
                    "assigned": _described(sent),
                }
            )
        return {
            "domain": bucket.key[0],
            "bucket_id": dict(bucket.key[1]),
            "answer": resolved.answer,
            "rule": resolved.rule.stats_key if resolved.rule is not None else None,
            "rate_per_second": rate.per_second if rate is not None else None,
            "capacity_per_second": bucket.capacity,
            "burst": rate.burst if rate is not None else None,
            "algorithm": resolved.kind.name,
            "envoys": envoys,
        }

    def panel(self) -> dict[str, object]:
        """The console's table: one row per bucket and Envoy (the 30 busiest buckets)."""
        rows: list[list[object]] = []
        for b in self.status(30)["buckets"]:
            bucket_id = ",".join(f"{k}={v}" for k, v in b["bucket_id"].items())
            for e in b["envoys"]:
                share, demand = e["share_per_second"], e["demand_per_second"]
                rows.append(
                    [
                        f"{b['domain']}: {bucket_id}",
                        e["envoy"],
                        b["answer"],
                        "" if share is None else round(share, 2),
                        "" if demand is None else round(demand, 2),
                        e["allowed"],
                        e["denied"],
                    ]
                )
        return {
            "columns": ["bucket", "envoy", "answer", "share/s", "demand/s", "allowed", "denied"],
            "rows": rows,
            "note": f"{len(self.streams)} Envoy streams, {len(self.buckets)} buckets",
        }

    def observe(self, telemetry: Telemetry) -> None:
        """Metrics: reports, assignments by answer, streams and buckets (read when
        collected)."""
        if telemetry.meter_provider is None:
            return
        from opentelemetry.metrics import CallbackOptions, Observation

        meter = telemetry.meter_provider.get_meter(SCOPE, __version__)
        stats = self._stats

        def counted(name: str) -> Any:
            def read(options: CallbackOptions) -> Iterable[Observation]:
                return [Observation(stats.get(f"{RLQS}.{name}"))]

            return read

        def assigned(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(stats.get(f"{RLQS}.assigned.{a}"), {"answer": a}) for a in ANSWERS]

        def sizes(options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(len(self.streams), {"what": "streams"}),
                Observation(len(self.buckets), {"what": "buckets"}),
            ]

        meter.create_observable_counter(
            "ratelimit_service_rlqs_reports",
            callbacks=[counted("reports")],
            description="Usage reports received from Envoys (rate limit quota service).",
        )
        meter.create_observable_counter(
            "ratelimit_service_rlqs_streams_opened",
            callbacks=[counted("streams_opened")],
            description="Envoy quota streams opened.",
        )
        meter.create_observable_counter(
            "ratelimit_service_rlqs_assignments",
            callbacks=[assigned],
            description="Bucket assignments sent to Envoys, by answer.",
        )
        meter.create_observable_gauge(
            "ratelimit_service_rlqs_open",
            callbacks=[sizes],
            description="Envoy quota streams open and buckets held, by what.",
        )


def _forget(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def _described(sent: Bucket | str | None) -> Any:
    if isinstance(sent, Bucket):
        if sent.tokens_per_fill == 0:
            return "DENY_ALL"
        return {
            "max_tokens": sent.max_tokens,
            "tokens_per_fill": sent.tokens_per_fill,
            "fill_interval_seconds": sent.fill_seconds,
        }
    return None if sent is None else "ALLOW_ALL"


async def _tick(shares: QuotaShares) -> None:
    # Reports, ended streams, a new config and leases reach the Envoys within a tick; the
    # rises that wait for falls follow as soon as the streams' writers have taken those.
    every = shares.limits.tick_seconds
    step = min(RAISE_AFTER, every / 4)
    while True:
        await asyncio.sleep(every - step * math.floor(every / step - 1))
        _guarded(shares.tick)
        for _ in range(math.floor(every / step - 1)):
            await asyncio.sleep(step)
            _guarded(shares.raise_deferred)


def _guarded(step: Callable[[], None]) -> None:
    try:
        step()
    except Exception:  # one bad pass must not end the pushes
        log.exception("re-dividing the quota buckets failed")


@contextlib.asynccontextmanager
async def serving(parts: api.Parts) -> AsyncIterator[None]:
    """Envoy's quota service while it is served: the ticks that divide the buckets (and the
    replicas' leases), from the start whether or not an Envoy calls."""
    leases = parts.rlqs.leases
    if leases is not None:
        # Any replica answers where the master is: this one's own capacity service.
        leases.start(parts.capacity.address)
    ticker = asyncio.create_task(_tick(parts.rlqs))
    try:
        yield
    finally:
        await cancel(ticker)
        parts.rlqs.close_all()
        if leases is not None:
            await leases.stop()
