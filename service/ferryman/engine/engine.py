"""The decision pipeline: validate, match, plan each descriptor with its rule kind's limiter,
ask the backend once, answer.

The engine knows the Algorithm protocol, not the kinds: every kind registered in
``ferryman.algorithms`` gets a limiter here, and a request's descriptors are planned, sent
and answered through them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Protocol, TypeVar, cast

from ferryman.algorithms import ALGORITHMS, BY_NAME, COUNTERS
from ferryman.backends.base import Backend
from ferryman.clock import Clock
from ferryman.config.model import Config
from ferryman.core.algorithm import Ask, Counters, Granted, Limiter, Requests
from ferryman.core.answers import (
    MAY_WAIT,
    Code,
    Decision,
    DescriptorRequest,
    EngineOptions,
    Status,
    Tally,
)
from ferryman.core.keys import walk
from ferryman.core.rules import Domain, Level, Rule
from ferryman.engine import response
from ferryman.engine.observe import DecisionWatcher, Requested, Seen, Unconfigured
from ferryman.engine.shaping import Waits
from ferryman.engine.validate import check_descriptor, check_request
from ferryman.errors import BackendError, NotFoundError, RequestError
from ferryman.stats import CALL, GLOBAL_SHADOW_MODE, Stats

__all__ = [
    "ALGORITHMS",
    "BackendTimer",
    "ConfigSource",
    "LatencySink",
    "RateLimitEngine",
    "Request",
]

T = TypeVar("T")

#: Distinct requests whose matches are kept (per engine, least recently used dropped first;
#: all dropped when the config changes).
PLANS = 4096

# One descriptor's match: its kind's limiter and the rule as that limiter prepared it (None:
# an override, no entries, or no rule with a limit).
Match = tuple[Limiter, Any] | None


class ConfigSource(Protocol):
    @property
    def config(self) -> Config | None: ...


class BackendTimer(Protocol):
    """Times and traces one backend call (telemetry); ``algorithm`` names the kind."""

    def __call__(self, algorithm: str, items: int, call: Awaitable[T]) -> Awaitable[T]: ...


class LatencySink(Protocol):
    """Where every backend call's time goes (the console's recorder): ``around`` times a
    call that is awaited, ``record`` one that was answered at once."""

    def record(self, seconds: float, failed: bool = False) -> None: ...

    def around(self, call: Awaitable[T]) -> Awaitable[T]: ...


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
    compiled: Any  # what the counters' limiter answers it with, or None
    # The descriptors no limited rule covers, when the domain records them.
    unmatched: tuple[DescriptorRequest, ...] = ()
    # The rule each descriptor reaches, for the watchers.
    rules: tuple[Rule | None, ...] = ()


@dataclass(slots=True)
class _Plan:
    """One request's work: statuses already known, and each limiter's items."""

    statuses: list[Status | None]
    items: dict[Limiter, list[Any]] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)

    def add(self, limiter: Limiter, item: Any) -> None:
        found = self.items.get(limiter)
        if found is None:
            self.items[limiter] = [item]
        else:
            found.append(item)

    def drop_replaced(self) -> None:
        """A replaced rule answers OK with no limit and leaves its state alone."""
        replaced = self.replaced
        for limiter, items in self.items.items():
            kept = []
            for item in items:
                # An item made of several named limits drops those replaced (``drop``).
                drop = getattr(item, "drop", None)
                if (item.rule is not None and item.rule.name in replaced) or (
                    drop is not None and drop(replaced)
                ):
                    self.statuses[item.index] = Status(Code.OK)
                else:
                    kept.append(item)
            self.items[limiter] = kept


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
        latency: LatencySink | None = None,
    ) -> None:
        self._source = source
        self._backend = backend
        self._timer = timer
        self._latency = latency
        self._clock = clock
        self._stats = stats
        self.options = opts = options or EngineOptions()
        self.limiters: dict[str, Limiter] = {a.name: a.limiter(opts, stats) for a in ALGORITHMS}
        self._counters = cast(Counters, self.limiters[COUNTERS.name])
        # The kinds that answer ferryman.v1's Request, and how an error names them.
        asked = tuple(n for n, limiter in self.limiters.items() if isinstance(limiter, Requests))
        self._requested = asked, " or ".join(k.replace("_", " ") for k in asked)
        self._rules: dict[Rule, tuple[Limiter, Any]] = {}
        self._rules_of: Config | None = None
        self._prepared: OrderedDict[Hashable, _Prepared] = OrderedDict()
        self.plans = PLANS  # how many distinct requests are kept (replay keeps more)
        # allow_unconfigured's tables, and whoever is told every decision (the decision log).
        self.unconfigured = Unconfigured(stats)
        self.watchers: list[DecisionWatcher] = []
        # The answers held until their turn on a node with max_wait (apis/rls holds them).
        self.waits = Waits()

    @property
    def local_cache(self) -> Any:
        """The counters' over-limit cache (LOCAL_CACHE_SIZE_IN_BYTES), or None."""
        return self._counters.local

    def limiter(self, name: str) -> Limiter:
        """The engine's limiter of the kind ``name``."""
        return self.limiters[name]

    def store(self, name: str) -> Any:
        """The backend's store of the kind ``name``."""
        return self._backend.store(name)

    def now(self) -> float:
        return self._clock.now()

    def timed(self, name: str, items: int, call: Awaitable[T]) -> Awaitable[T]:
        """``call``, timed and traced as a store call of the kind ``name``."""
        timer = self._timer
        if timer is not None:
            call = timer(name, items, call)
        latency = self._latency
        return call if latency is None else latency.around(call)

    # -- ShouldRateLimit --------------------------------------------------------------------

    async def should_rate_limit(
        self,
        domain: str,
        descriptors: Sequence[DescriptorRequest],
        hits_addend: int = 0,
        *,
        may_wait: float = 0.0,
    ) -> Decision:
        """The decision on one request; RequestError names a malformed field. ``may_wait``:
        the seconds the caller can hold the answer; a descriptor on a node with max_wait
        whose hits fit within both is booked its turn, and ``Decision.wait`` says how long
        to hold the answer (0: a hit that does not fit now is over the limit)."""
        config = self._config()
        check_request(domain, descriptors)
        dom = config.domains.get(domain)
        if dom is None:
            return self._not_found(domain, descriptors, hits_addend)
        matches = self._match(dom, descriptors)
        now = self._clock.now()
        decision = await self._decide(domain, descriptors, hits_addend, matches, now, may_wait)
        if dom.allow_unconfigured:
            unmatched = _unmatched(descriptors, matches)
            if unmatched:
                self.unconfigured.record(domain, unmatched, hits_addend or 1, now)
        if self.watchers:
            self._tell(now, domain, descriptors, hits_addend, _rules(matches), decision)
        return decision

    async def should_rate_limit_kept(
        self, key: Hashable, convert: Callable[[], Request], *, may_wait: float = 0.0
    ) -> Decision:
        """The decision on the request ``convert()`` gives (domain, descriptors, hits_addend),
        as :meth:`should_rate_limit` makes it, for a request that ``key`` stands for (its
        serialized bytes): the request's conversion, validation and matches, and for a
        request of plain fixed windows its counters, are kept under ``key`` (the last
        ``PLANS`` keys, all dropped when the config changes) and reused for the next
        request with the same key. ``may_wait`` as for :meth:`should_rate_limit` (plain
        fixed windows never wait)."""
        config = self._config()
        kept = self._prepared
        prepared = kept.get(key)
        if prepared is None:
            domain, descriptors, hits_addend = convert()
            check_request(domain, descriptors)
            dom = config.domains.get(domain)
            if dom is None:
                return self._not_found(domain, descriptors, hits_addend)
            prepared = kept[key] = self._compile(domain, dom, descriptors, hits_addend)
            if len(kept) > self.plans:
                kept.popitem(last=False)
        else:
            kept.move_to_end(key)
        now = self._clock.now()
        if prepared.compiled is not None:
            decision = await self._compiled(prepared, now)
        else:
            decision = await self._decide(
                prepared.domain,
                prepared.descriptors,
                prepared.hits_addend,
                prepared.matches,
                now,
                may_wait,
            )
        if prepared.unmatched:
            self.unconfigured.record(
                prepared.domain, prepared.unmatched, prepared.hits_addend or 1, now
            )
        if self.watchers:
            self._tell(
                now,
                prepared.domain,
                prepared.descriptors,
                prepared.hits_addend,
                prepared.rules,
                decision,
            )
        return decision

    def _compile(
        self, domain: str, dom: Domain, descriptors: Sequence[DescriptorRequest], hits_addend: int
    ) -> _Prepared:
        matches = self._match(dom, descriptors)
        request_hits = hits_addend or 1
        hits = [d.hits_of(request_hits) for d in descriptors]
        counters = self._counters
        own = [m[1] if m is not None and m[0] is counters else None for m in matches]
        compiled = counters.compile(own, [d.entries for d in descriptors], hits)
        unmatched = _unmatched(descriptors, matches) if dom.allow_unconfigured else ()
        rules = _rules(matches)
        return _Prepared(domain, descriptors, hits_addend, matches, compiled, unmatched, rules)

    def _not_found(
        self, domain: str, descriptors: Sequence[DescriptorRequest], hits_addend: int
    ) -> Decision:
        self._stats.rule(domain, "domain_not_found", 1, (domain,))
        decision = self._decision(
            domain, descriptors, hits_addend, [None] * len(descriptors), Tally()
        )
        if self.watchers:
            rules = (None,) * len(descriptors)
            self._tell(self._clock.now(), domain, descriptors, hits_addend, rules, decision)
        return decision

    def _tell(
        self,
        now: float,
        domain: str,
        descriptors: Sequence[DescriptorRequest],
        hits_addend: int,
        rules: tuple[Rule | None, ...],
        decision: Decision,
    ) -> None:
        """Every watcher is told the decision, with the rule each descriptor reached."""
        seen = Seen(now, domain, descriptors, hits_addend, rules, decision)
        for watcher in self.watchers:
            watcher.decided(seen)

    async def _decide(
        self,
        domain: str,
        descriptors: Sequence[DescriptorRequest],
        hits_addend: int,
        matches: Sequence[Match],
        now: float,
        may_wait: float = 0.0,
    ) -> Decision:
        """The decision on a matched request at ``now``: planned, one backend call, answered.
        The kinds read ``may_wait`` from ``MAY_WAIT`` (no limiter takes it as an argument)."""
        plan = self._plan(domain, matches, descriptors, hits_addend or 1, now)
        if plan.replaced:
            plan.drop_replaced()
        tally = Tally()
        token = MAY_WAIT.set(may_wait) if may_wait > 0 else None
        try:
            await self._ask_backend(plan, now, tally)
        except BackendError as error:
            return self._degraded(error, descriptors)
        finally:
            if token is not None:
                MAY_WAIT.reset(token)
        return self._decision(domain, descriptors, hits_addend, plan.statuses, tally)

    async def _compiled(self, request: _Prepared, now: float) -> Decision:
        """A request the counters answer whole, compiled: one store call, no plan. A store
        that can answer at once (in this process) is not awaited, unless its calls are
        traced."""
        counters = self._counters
        compiled = request.compiled
        store = self._backend.store(COUNTERS.name)
        replies = None
        if self._timer is None:
            latency = self._latency
            if latency is None:
                replies = counters.answer_now(store, compiled, now)
            else:
                start = perf_counter()
                replies = counters.answer_now(store, compiled, now)
                if replies is not None:
                    latency.record(perf_counter() - start)
        if replies is None:
            items, call = counters.send(store, compiled, now)
            try:
                replies = await self.timed(COUNTERS.name, items, call)
            except BackendError as error:
                return self._degraded(error, request.descriptors)
        statuses, tally = counters.finish(compiled, replies, now)
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
        if config is not self._rules_of:
            self._rules = self._prepare(config)
            self._rules_of = config
            self._prepared.clear()
            recording = [n for n, d in config.domains.items() if d.allow_unconfigured]
            self.unconfigured.forget(recording)
        return config

    def _prepare(self, config: Config) -> dict[Rule, tuple[Limiter, Any]]:
        """Every limited rule of ``config``, prepared by its kind's limiter."""
        out: dict[Rule, tuple[Limiter, Any]] = {}
        quota_mode = self.options.quota_mode

        def visit(domain: str, level: Level, parents: tuple[Rule, ...]) -> None:
            for rule in level.rules:
                path = (*parents, rule)
                if rule.limit is not None:
                    limiter = self.limiters[rule.limit.kind]
                    quota = rule.quota_mode or quota_mode
                    out[rule] = (limiter, limiter.prepare(domain, path, quota))
                visit(domain, rule.children, path)

        for name, domain in config.domains.items():
            visit(name, domain.root, ())
        return out

    def _match(self, dom: Domain, descriptors: Sequence[DescriptorRequest]) -> list[Match]:
        """Each descriptor's limiter and prepared rule."""
        table = self._rules
        out: list[Match] = []
        for desc in descriptors:
            entries = desc.entries
            if desc.limit is not None or not entries:
                out.append(None)
                continue
            if len(entries) == 1:  # the path is the matched rule: no list needed
                last = dom.root.match(*entries[0])
            else:
                path = walk(dom, entries)
                last = path[-1] if path is not None else None
            out.append(table.get(last) if last is not None else None)
        return out

    def _plan(
        self,
        domain: str,
        matches: Sequence[Match],
        descriptors: Sequence[DescriptorRequest],
        request_hits: int,
        now: float,
    ) -> _Plan:
        """Each descriptor's item for its kind's store, or its status when none is needed."""
        plan = _Plan([None] * len(descriptors))
        for i, desc in enumerate(descriptors):
            hits = desc.hits_of(request_hits)
            match = matches[i]
            if match is None:
                if desc.limit is not None:
                    item = self._counters.override(i, desc.limit, domain, desc.entries, hits, now)
                    plan.add(self._counters, item)
                else:  # as the reference: matches no rule, OK with no limit
                    plan.statuses[i] = Status(Code.OK)
                continue
            limiter, prepared = match
            out = limiter.plan(prepared, i, domain, desc.entries, hits, now)
            if isinstance(out, Status):
                plan.statuses[i] = out
                continue
            plan.add(limiter, out)
            replaces = prepared.rule.replaces
            if replaces:
                plan.replaced.update(replaces)
        return plan

    async def _ask_backend(self, plan: _Plan, now: float, tally: Tally) -> None:
        """Every store call of the request, started together: a pipelined Redis sends them
        in one write, so the request costs one round trip. Then each kind answers its
        items, in registry order."""
        parts: list[tuple[Limiter, list[Any], int]] = []
        calls: list[Awaitable[Any]] = []
        for limiter, items in plan.items.items():
            if not items:
                continue
            name = limiter.algorithm.name
            made = limiter.calls(self._backend.store(name), items, now)
            parts.append((limiter, items, len(made)))
            calls.extend(self.timed(name, n, call) for n, call in made)
        if len(calls) == 1:
            replies: list[Any] = [await calls[0]]
        elif calls:
            replies = list(await asyncio.gather(*calls, return_exceptions=True))
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        else:
            replies = []
        start = 0
        for limiter, items, count in parts:
            limiter.answer(items, replies[start : start + count], now, plan.statuses, tally)
            start += count

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
        # A refused request is answered at once: its other descriptors' booked turns stay
        # booked, as every descriptor's hits of a refused request stay counted.
        wait = tally.wait if code is Code.OK else 0.0
        if code is Code.OVER_LIMIT and opts.shadow_mode:
            self._stats.inc(GLOBAL_SHADOW_MODE)
            code = Code.OK
        headers = response.headers(opts, final) if opts.headers else ()
        meta = None
        if opts.dynamic_metadata:
            meta = response.metadata(domain, descriptors, hits_addend, tally.metadata)
        return Decision(code, final, headers, meta, wait)

    # -- ferryman.v1 ------------------------------------------------------------------------

    async def request(
        self,
        domain: str,
        entries: tuple[tuple[str, str], ...],
        copies: int,
        min_copies: int,
        max_wait_millis: int,
    ) -> Granted:
        """ferryman.v1's ``Request``: up to ``copies`` hits (at least ``min_copies`` or
        none) on a node whose kind answers it, or a client error naming what the
        descriptor reaches instead. A domain's ``allow_unconfigured`` grants (and records)
        a descriptor that reaches no such node; its ``ignore_limits`` grants every copy
        asked for, the refused ones counted as the rule's shadow_mode. The watchers are
        told each answer (not the client errors)."""
        kinds, wanted = self._requested
        config = self._source.config
        dom = None if config is None else config.domains.get(domain)
        # One instant per decision, the one logged: a replay decides again at it.
        now = self._clock.now()
        rule: Rule | None = None
        try:
            path = self.resolve(domain, entries, kinds, wanted)
        except NotFoundError:
            if dom is None or not dom.allow_unconfigured:
                raise
            self.unconfigured.record(domain, (DescriptorRequest(entries),), copies, now)
            granted = Granted(copies, {}, {})
        else:
            rule = path[-1]
            ask = Ask(domain, entries, tuple(path), copies, min_copies, max_wait_millis)
            granted = await self._request_node(ask, now, dom is not None and dom.ignore_limits)
        if self.watchers:
            seen = Requested(
                now, domain, entries, copies, min_copies, max_wait_millis, rule, granted.granted
            )
            for watcher in self.watchers:
                watcher.requested(seen)
        return granted

    async def _request_node(self, ask: Ask, now: float, ignore_limits: bool) -> Granted:
        """``ask`` answered by its node's kind at ``now``; with ``ignore_limits`` every copy
        is granted, the refused ones counted as the rule's shadow_mode."""
        rule = ask.path[-1]
        assert rule.limit is not None
        name = rule.limit.kind
        limiter = self.limiters[name]
        assert isinstance(limiter, Requests)

        def timed(items: int, call: Awaitable[Any]) -> Awaitable[Any]:
            return self.timed(name, items, call)

        granted = await limiter.request(self._backend.store(name), ask, lambda: now, timed)
        if ignore_limits and granted.granted < ask.copies:
            self._stats.rule(
                rule.stats_key, "shadow_mode", ask.copies - granted.granted, rule.stats_path
            )
            return Granted(ask.copies, granted.fields, {})
        return granted

    def resolve(
        self, domain: str, entries: Sequence[tuple[str, str]], kinds: Sequence[str], wanted: str
    ) -> list[Rule]:
        """The rules along the path to a node of one of ``kinds`` (``wanted`` says what they
        are, for the error), or a client error that says what the descriptor reaches."""
        check_descriptor(domain, entries, "descriptor")
        config = self._source.config
        if config is None:
            raise RequestError("domain", "no rate limit configuration is loaded")
        dom = config.domains.get(domain)
        if dom is None:
            raise NotFoundError("domain", f"unknown domain {domain!r}")
        path = walk(dom, entries)
        shown = ", ".join(f"{k}={v}" for k, v in entries)
        if path is None:
            raise NotFoundError("descriptor", f"no node of domain {domain!r} matches ({shown})")
        limit = path[-1].limit
        if limit is not None and limit.kind in kinds:
            return path
        if limit is None:
            raise NotFoundError("descriptor", f"{path[-1].stats_key} has no {wanted} configured")
        mark = BY_NAME[limit.kind].keys[0]
        raise RequestError(
            "descriptor",
            f"{path[-1].stats_key} is a {limit.kind.replace('_', ' ')} node ({mark}), not {wanted}",
        )


def _unmatched(
    descriptors: Sequence[DescriptorRequest], matches: Sequence[Match]
) -> tuple[DescriptorRequest, ...]:
    """The descriptors that reach no limited rule (and carry no limit of their own)."""
    return tuple(
        d
        for d, m in zip(descriptors, matches, strict=True)
        if m is None and d.limit is None and d.entries
    )


def _rules(matches: Sequence[Match]) -> tuple[Rule | None, ...]:
    """The rule each match reached (None: no limited rule)."""
    return tuple(None if m is None else m[1].rule for m in matches)
