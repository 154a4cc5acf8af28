"""The decision pipeline: validate, match, plan each descriptor by its rule's policy, ask
the backend once, answer."""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from ferryman.algorithms.burst.model import BurstOutcome, BurstPolicy
from ferryman.algorithms.fixed_window.local_cache import OverLimitCache
from ferryman.algorithms.fixed_window.model import CounterOp, CounterResult
from ferryman.algorithms.sliding_window.model import SlidingResult
from ferryman.algorithms.token_bucket.model import NodeTake
from ferryman.algorithms.token_bucket.model import Status as TakeStatus
from ferryman.backends.base import Backend
from ferryman.clock import Clock
from ferryman.config.model import Config, Domain, Rule
from ferryman.engine import response
from ferryman.engine.buckets import BucketItem, BucketLimiter
from ferryman.engine.bursts import BurstItem, BurstLimiter
from ferryman.engine.copies import CopyItem, CopyLimiter
from ferryman.engine.leased import LeasedItem, LeasedLimiter
from ferryman.engine.matcher import find, stats_key, walk
from ferryman.engine.model import (
    MAX_REMAINING,
    Code,
    ConfigSource,
    Decision,
    DescriptorRequest,
    EngineOptions,
    Status,
    Tally,
)
from ferryman.engine.policy import (
    BucketNode,
    BurstNode,
    CopiesNode,
    LeasedNode,
    Plain,
    Policy,
    SlidingNode,
    Unlimited,
    Window,
    policies,
)
from ferryman.engine.sliding import SlidingItem, SlidingLimiter
from ferryman.engine.validate import check_request
from ferryman.engine.windows import PlainCounter, WindowItem, WindowLimiter
from ferryman.errors import BackendError, RequestError
from ferryman.stats import CALL, GLOBAL_SHADOW_MODE, REQUEST_CALL, Stats

__all__ = ["ALGORITHMS", "BackendTimer", "RateLimitEngine", "Request"]

T = TypeVar("T")

#: The stores a request may call, as BackendTimer names them.
ALGORITHMS = ("fixed_window", "burst", "copies", "token_bucket", "sliding_window")

#: Distinct requests whose matches are kept (per engine, least recently used dropped first;
#: all dropped when the config changes).
PLANS = 4096

# One descriptor's match: its rule's policy (None: an override, no entries or no rule) and,
# for a plain fixed window, its counter key without the window.
Match = tuple[Policy | None, str]


class BackendTimer(Protocol):
    """Times and traces one backend call (telemetry); ``algorithm`` names the store."""

    def __call__(self, algorithm: str, items: int, call: Awaitable[T]) -> Awaitable[T]: ...


# What a request asks, as the server edge converts it: domain, descriptors, hits_addend.
Request = tuple[str, Sequence[DescriptorRequest], int]


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A request as kept for the next one with the same bytes: what it asks, each
    descriptor's match, and the compiled counters when it is all plain windows."""

    domain: str
    descriptors: Sequence[DescriptorRequest]
    hits_addend: int
    matches: list[Match]
    plain: tuple[PlainCounter, ...] | None


@dataclass(slots=True)
class _Plan:
    """One request's work: statuses already known, and what each store must be asked."""

    statuses: list[Status | None]
    windows: list[WindowItem] = field(default_factory=list)
    bursts: list[BurstItem] = field(default_factory=list)
    holds: list[CopyItem] = field(default_factory=list)
    buckets: list[BucketItem] = field(default_factory=list)
    sliding: list[SlidingItem] = field(default_factory=list)
    leased: list[LeasedItem] = field(default_factory=list)
    replaced: set[str] = field(default_factory=set)

    def drop_replaced(self) -> None:
        """A replaced rule answers OK with no limit and leaves its counter alone."""
        if not self.replaced:
            return
        statuses = self.statuses
        for w in self.windows:
            if w.limit.name in self.replaced:
                statuses[w.index] = Status(Code.OK)
        for b in self.bursts:
            if b.rule.name in self.replaced:
                statuses[b.index] = Status(Code.OK)
        self.windows = [w for w in self.windows if statuses[w.index] is None]
        self.bursts = [b for b in self.bursts if statuses[b.index] is None]


class RateLimitEngine:
    """Decides ShouldRateLimit requests (and Charon's Request) against the current config
    and a backend."""

    def __init__(
        self,
        source: ConfigSource,
        backend: Backend,
        clock: Clock,
        stats: Stats,
        options: EngineOptions | None = None,
        *,
        timer: BackendTimer | None = None,
    ) -> None:
        self._source = source
        self._backend = backend
        self._timer = timer
        self._clock = clock
        self._stats = stats
        self.options = opts = options or EngineOptions()
        self.local_cache = (
            OverLimitCache(opts.local_cache_bytes) if opts.local_cache_bytes > 0 else None
        )
        self.windows = WindowLimiter(opts, stats, self.local_cache)
        self.bursts = BurstLimiter(opts, stats)
        self.copies = CopyLimiter(opts, stats)
        self.buckets = BucketLimiter(opts, stats)
        self.sliding = SlidingLimiter(opts, stats)
        self.leased = LeasedLimiter(stats)
        self._policies: dict[Rule, Policy] = {}
        self._policies_of: Config | None = None
        self._prepared: OrderedDict[Hashable, _Prepared] = OrderedDict()

    # -- ShouldRateLimit --------------------------------------------------------------------

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[DescriptorRequest], hits_addend: int = 0
    ) -> Decision:
        """The decision on one request; RequestError names a malformed field."""
        config = self._config()
        check_request(domain, descriptors)
        dom = config.domains.get(domain)
        if dom is None:
            return self._not_found(domain, descriptors, hits_addend)
        return await self._decide(domain, descriptors, hits_addend, self._match(dom, descriptors))

    async def should_rate_limit_kept(
        self, key: Hashable, convert: Callable[[], Request]
    ) -> Decision:
        """The decision on the request ``convert()`` gives (domain, descriptors, hits_addend),
        as :meth:`should_rate_limit` makes it, for a request that ``key`` stands for (its
        serialized bytes): the request's conversion, validation and matches, and for a
        request of plain fixed windows its counters, are kept under ``key`` (the last
        ``PLANS`` keys, all dropped when the config changes) and reused for the next
        request with the same key."""
        config = self._config()
        kept = self._prepared
        prepared = kept.get(key)
        if prepared is None:
            domain, descriptors, hits_addend = convert()
            check_request(domain, descriptors)
            dom = config.domains.get(domain)
            if dom is None:
                return self._not_found(domain, descriptors, hits_addend)
            matches = self._match(dom, descriptors)
            request_hits = hits_addend or 1
            hits = [d.hits_of(request_hits) for d in descriptors]
            plain = self.windows.compile(matches, hits)
            prepared = kept[key] = _Prepared(domain, descriptors, hits_addend, matches, plain)
            if len(kept) > PLANS:
                kept.popitem(last=False)
        else:
            kept.move_to_end(key)
        if prepared.plain is not None:
            return await self._plain(prepared, prepared.plain)
        return await self._decide(
            prepared.domain, prepared.descriptors, prepared.hits_addend, prepared.matches
        )

    def _not_found(
        self, domain: str, descriptors: Sequence[DescriptorRequest], hits_addend: int
    ) -> Decision:
        self._stats.rule(domain, "domain_not_found", 1, (domain,))
        return self._decision(domain, descriptors, hits_addend, [None] * len(descriptors), Tally())

    async def _decide(
        self,
        domain: str,
        descriptors: Sequence[DescriptorRequest],
        hits_addend: int,
        matches: Sequence[Match],
    ) -> Decision:
        """The decision on a matched request: planned, one backend call, answered."""
        request_hits = hits_addend or 1
        now = self._clock.now()
        plan = self._plan(domain, matches, descriptors, request_hits, now)
        if plan.replaced:
            plan.drop_replaced()
        try:
            results, outcomes, held, takes, slid = await self._ask_backend(plan, now)
        except BackendError as error:
            return self._degraded(error, descriptors)
        tally = Tally()
        statuses = plan.statuses
        if plan.windows:
            self.windows.answer(plan.windows, results, now, statuses, tally)
        for h, status in zip(plan.holds, held, strict=True):
            statuses[h.index] = status
            tally.add(status.code is Code.OVER_LIMIT, h.quota, h.rule.metadata, h.index)
        if plan.bursts:
            self.bursts.answer(plan.bursts, outcomes, statuses, tally)
        if plan.buckets:
            self.buckets.answer(plan.buckets, takes, statuses, tally)
        if plan.sliding:
            self.sliding.answer(plan.sliding, slid, statuses, tally)
        if plan.leased:
            self.leased.answer(plan.leased, now, statuses, tally)
        return self._decision(domain, descriptors, hits_addend, statuses, tally)

    async def _plain(self, request: _Prepared, counters: tuple[PlainCounter, ...]) -> Decision:
        """A request of plain windows only, compiled: one store call, no plan."""
        now = self._clock.now()
        windows = self.windows
        ops = windows.plain_ops(counters, now)
        apply = self._backend.windows.apply(ops, stop_when_over=self.options.stop_when_over)
        try:
            results = await self._timed("fixed_window", len(ops), apply)
        except BackendError as error:
            return self._degraded(error, request.descriptors)
        statuses, tally = windows.plain_answer(counters, results, now)
        return self._decision(
            request.domain, request.descriptors, request.hits_addend, statuses, tally
        )

    def _degraded(self, error: BackendError, descriptors: Sequence[DescriptorRequest]) -> Decision:
        """The answer when the backend failed: OK and counted with FAIL_OPEN, else ``error``."""
        if not self.options.fail_open:
            raise error
        self._stats.inc(f"{CALL}.degraded")
        return Decision(Code.OK, tuple(Status(Code.OK) for _ in descriptors))

    def _config(self) -> Config:
        config = self._source.config
        if config is None:
            raise RequestError("domain", "no rate limit configuration is loaded")
        if config is not self._policies_of:
            self._policies = policies(config, self.options)
            self._policies_of = config
            self._prepared.clear()
        return config

    def _match(self, dom: Domain, descriptors: Sequence[DescriptorRequest]) -> list[Match]:
        """Each descriptor's policy, and a plain window's counter key without its window."""
        table = self._policies
        out: list[Match] = []
        for desc in descriptors:
            entries = desc.entries
            if desc.limit is not None or not entries:
                out.append((None, ""))
                continue
            if len(entries) == 1:  # the path is the matched rule: no list needed
                last = dom.root.match(*entries[0])
            else:
                path = walk(dom, entries)
                last = path[-1] if path is not None else None
            policy = table.get(last) if last is not None else None
            base = ""
            if isinstance(policy, Plain):
                base = policy.head + "".join([f"{k}_{v}_" for k, v in entries])
            out.append((policy, base))
        return out

    def _plan(
        self,
        domain: str,
        matches: Sequence[Match],
        descriptors: Sequence[DescriptorRequest],
        request_hits: int,
        now: float,
    ) -> _Plan:
        """Each descriptor's item for its rule's store, or its status when none is needed."""
        plan = _Plan([None] * len(descriptors))
        for i, desc in enumerate(descriptors):
            hits = desc.hits_of(request_hits)
            entries = desc.entries
            policy, base = matches[i]
            if isinstance(policy, Plain):  # the common case first
                if policy.limit.replaces:
                    plan.replaced.update(policy.limit.replaces)
                plan.windows.append(self.windows.plain(i, policy, base, hits, now))
                continue
            if desc.limit is not None:
                plan.windows.append(
                    self.windows.override(i, desc.limit, domain, entries, hits, now)
                )
                continue
            if not entries:  # as the reference: matches no rule, OK with no limit
                plan.statuses[i] = Status(Code.OK)
                continue
            if isinstance(policy, Window):
                plan.replaced.update(policy.limit.replaces)
                plan.windows.append(self.windows.window(i, policy, domain, entries, hits, now))
            elif isinstance(policy, Unlimited):
                plan.statuses[i] = Status(Code.OK, remaining=MAX_REMAINING)
            elif isinstance(policy, CopiesNode):
                key, parts = stats_key(domain, entries, policy.path)
                tenant = "_".join(v for _, v in entries)
                node = self.copies.node(policy.rule)
                plan.holds.append(
                    CopyItem(i, policy.rule, node, tenant, key, parts, hits, policy.quota)
                )
            elif isinstance(policy, LeasedNode):
                leased = policy.rule.leased
                assert leased is not None
                plan.leased.append(LeasedItem(i, policy.rule, leased, hits, policy.quota))
            elif isinstance(policy, BurstNode):
                if hits < 0:
                    # Burst tiers record grants only; nothing to give back.
                    plan.statuses[i] = Status(Code.OK)
                    continue
                rule = policy.rule
                assert rule.burst is not None
                plan.replaced.update(rule.replaces)
                key, parts = stats_key(domain, entries, policy.path)
                request = self.bursts.request(rule, entries, hits, hits)
                plan.bursts.append(
                    BurstItem(i, rule, rule.burst, request, key, parts, hits, policy.quota)
                )
            elif isinstance(policy, BucketNode):
                self._plan_bucket(plan, i, policy, domain, entries, hits)
            elif isinstance(policy, SlidingNode):
                key, parts = stats_key(domain, entries, policy.path)
                unit = policy.limit.unit
                assert unit is not None
                plan.sliding.append(
                    SlidingItem(
                        i,
                        policy.rule,
                        policy.limit,
                        unit.seconds,
                        self.sliding.key(policy, entries),
                        key,
                        parts,
                        max(hits, 0),  # nothing is given back: a negative hit only looks
                        policy.quota,
                    )
                )
            else:
                plan.statuses[i] = Status(Code.OK)
        return plan

    def _plan_bucket(
        self,
        plan: _Plan,
        i: int,
        policy: BucketNode,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        max_wait_millis: int = 0,
    ) -> None:
        rule = policy.rule
        assert rule.token_bucket is not None
        key, parts = stats_key(domain, entries, policy.path)
        plan.buckets.append(
            BucketItem(
                i,
                rule,
                rule.token_bucket,
                self.buckets.key(policy, entries),
                key,
                parts,
                max(hits, 0),  # a bucket gives nothing back: a negative hit only looks
                policy.quota,
                self.buckets.wait_allowed(rule.token_bucket, max_wait_millis),
            )
        )

    def _timed(self, algorithm: str, items: int, call: Awaitable[T]) -> Awaitable[T]:
        timer = self._timer
        return call if timer is None else timer(algorithm, items, call)

    async def _ask_backend(
        self, plan: _Plan, now: float
    ) -> tuple[
        list[CounterResult],
        list[BurstOutcome],
        list[Status],
        list[NodeTake],
        list[SlidingResult],
    ]:
        """Every store call of the request, started together: a pipelined Redis sends them
        in one write, so the request costs one round trip. They run in descriptor order."""
        backend = self._backend
        stop = self.options.stop_when_over
        windows = plan.windows
        ops: list[CounterOp] = [w.op for w in windows if w.op is not None and not w.cached]
        if (
            stop
            and ops
            and len(ops) < len(windows)
            and any(w.cached and w.hits > 0 for w in windows)
        ):
            # A descriptor known to be over (local cache) blocks the request: as with one
            # found over in the store, the others are read, not incremented.
            ops = [replace(op, hits=0) if op.hits > 0 else op for op in ops]
        if not (plan.bursts or plan.holds or plan.buckets or plan.sliding):
            # The common request: fixed windows only, one store call (or none).
            if not ops:
                return [], [], [], [], []
            results: list[CounterResult] = await self._timed(
                "fixed_window", len(ops), backend.windows.apply(ops, stop_when_over=stop)
            )
            return results, [], [], [], []
        calls: list[Awaitable[Any]] = []
        if ops:
            calls.append(
                self._timed(
                    "fixed_window", len(ops), backend.windows.apply(ops, stop_when_over=stop)
                )
            )
        timed = self._timed
        for b in plan.bursts:
            calls.append(timed("burst", 1, backend.bursts.decide(b.request, now)))
        for h in plan.holds:
            calls.append(timed("copies", 1, self.copies.hold(backend.copies, h, now)))
        for t in plan.buckets:
            calls.append(
                timed(
                    "token_bucket",
                    1,
                    backend.buckets.take(t.key, t.spec, t.hits, t.max_wait_millis, now),
                )
            )
        for s in plan.sliding:
            calls.append(
                timed(
                    "sliding_window",
                    1,
                    backend.sliding.hit(s.key, s.limit.requests_per_unit, s.seconds, s.hits, now),
                )
            )
        if not calls:
            return [], [], [], [], []
        if len(calls) == 1:
            replies: list[Any] = [await calls[0]]
        else:
            replies = list(await asyncio.gather(*calls, return_exceptions=True))
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        first = 1 if ops else 0
        results = replies[0] if ops else []
        outcomes: list[BurstOutcome] = replies[first : first + len(plan.bursts)]
        start = first + len(plan.bursts)
        held: list[Status] = replies[start : start + len(plan.holds)]
        start += len(plan.holds)
        takes: list[NodeTake] = replies[start : start + len(plan.buckets)]
        slid: list[SlidingResult] = replies[start + len(plan.buckets) :]
        return results, outcomes, held, takes, slid

    def _decision(
        self,
        domain: str,
        descriptors: Sequence[DescriptorRequest],
        hits_addend: int,
        statuses: list[Status | None],
        tally: Tally,
    ) -> Decision:
        opts = self.options
        final = tuple([s if s is not None else Status(Code.OK) for s in statuses])
        code = tally.code
        if code is Code.OVER_LIMIT and opts.shadow_mode:
            self._stats.inc(GLOBAL_SHADOW_MODE)
            code = Code.OK
        headers = response.headers(opts, final) if opts.headers else ()
        meta = None
        if opts.dynamic_metadata:
            meta = response.metadata(domain, descriptors, hits_addend, tally.metadata)
        return Decision(code, final, headers, meta)

    # -- ferryman.v1 ------------------------------------------------------------------------

    def resolve(self, domain: str, entries: Sequence[tuple[str, str]], kind: str) -> list[Rule]:
        """The rules along the path to a ``burst`` or ``copies`` node, or a client error."""
        return find(self._source.config, domain, entries, kind)

    def copies_node(self, rule: Rule) -> str:
        """The backend name of a copy-limited node (its keys share one hash tag)."""
        return self.copies.node(rule)

    async def request_bucket(
        self,
        domain: str,
        entries: Sequence[tuple[str, str]],
        path: Sequence[Rule],
        copies: int,
        min_copies: int,
        max_wait_millis: int,
    ) -> tuple[int, NodeTake]:
        """``Limiter.Request`` on a token-bucket node (``path`` from ``resolve``): ``copies``
        tokens, else ``min_copies``, else none; granted after a wait of at most
        ``max_wait_millis`` (and the node's wait_timeout_millis). (granted, the answer)."""
        self._config()
        rule = path[-1]
        policy = self._policies.get(rule)
        assert isinstance(policy, BucketNode) and rule.token_bucket is not None
        spec = rule.token_bucket
        stats, parts = stats_key(domain, entries, path)
        key = self.buckets.key(policy, entries)
        wait = self.buckets.wait_allowed(spec, max_wait_millis)
        backend = self._backend
        granted, take = 0, None
        try:
            for n in (copies, min_copies) if min_copies < copies else (copies,):
                take = await self._timed(
                    "token_bucket",
                    1,
                    backend.buckets.take(key, spec, n, wait, self._clock.now()),
                )
                if take.status is TakeStatus.OK:
                    granted = n
                    break
        except BackendError:
            if not self.options.fail_open:
                raise
            self._stats.inc(f"{REQUEST_CALL}.degraded")
            return copies, NodeTake(TakeStatus.OK, 0, float(spec.size), 0.0)
        assert take is not None
        item = BucketItem(0, rule, spec, key, stats, parts, copies, policy.quota)
        self.buckets.count(item, granted > 0, take.wait_millis > 0)
        return granted, take

    async def request_rate(
        self,
        domain: str,
        entries: Sequence[tuple[str, str]],
        copies: int,
        min_copies: int,
        path: Sequence[Rule] | None = None,
    ) -> tuple[BurstPolicy, BurstOutcome]:
        """Charon's ``request``: up to ``copies`` hits on a burst-tier node, at least
        ``min_copies`` or none. Raises RequestError / NotFoundError naming the problem."""
        if path is None:
            path = self.resolve(domain, entries, "burst")
        rule = path[-1]
        assert rule.burst is not None
        request = self.bursts.request(rule, entries, copies, min_copies)
        key, parts = stats_key(domain, entries, path)
        try:
            outcome = await self._timed(
                "burst", 1, self._backend.bursts.decide(request, self._clock.now())
            )
        except BackendError:
            if not self.options.fail_open:
                raise
            self._stats.inc(f"{REQUEST_CALL}.degraded")
            outcome = BurstOutcome(copies, 0, 0, 0, math.inf, False, False, False, 0, 0, 0.0)
            return rule.burst, outcome
        self.bursts.count(key, parts, copies, outcome, False)
        return rule.burst, outcome
