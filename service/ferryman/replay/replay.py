"""Replay: logged requests decided again, in this process, by the real engine on the memory
backend and a virtual clock set to each request's time, as fast as the engine goes.

Every rule kind replays as it runs: the engine, its limiters and the memory stores are the
service's own; only the clock is the log's. The replay reaches kinds only through the engine.
A ferryman.v1 ``Request`` line is asked again through ``engine.request``; it counts for its
rule as one request, refused when granted fewer than ``min_copies`` (none).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import overload

from ferryman.backends.memory import MemoryBackend
from ferryman.config.model import Config
from ferryman.core.algorithm import Granted
from ferryman.core.answers import Code, Decision, EngineOptions
from ferryman.engine import RateLimitEngine
from ferryman.engine.observe import Requested, Seen
from ferryman.errors import RequestError
from ferryman.replay.decision_log import Logged, LoggedRequest
from ferryman.stats import RATE_LIMIT, Stats

__all__ = ["Change", "Outcome", "Replay", "RuleResult", "replay"]

Entries = tuple[tuple[str, str], ...]


def tenant_name(entries: Entries) -> str:
    return ",".join(f"{k}={v}" for k, v in entries)


@dataclass(slots=True)
class RuleResult:
    """What one rule answered over a replay."""

    rule: str
    requests: int = 0
    shadow: int = 0
    first_refusal: float | None = None
    refused_by_tenant: Counter[Entries] = field(default_factory=Counter)
    # second -> [allowed, refused], for the plot
    seconds: dict[int, list[int]] = field(default_factory=dict)

    @property
    def refused(self) -> int:
        return sum(self.refused_by_tenant.values())

    @property
    def allowed(self) -> int:
        return self.requests - self.refused

    def as_dict(self, tenants: int = 5) -> dict[str, object]:
        return {
            "rule": self.rule,
            "requests": self.requests,
            "allowed": self.allowed,
            "refused": self.refused,
            "shadow_violations": self.shadow,
            "first_refusal": self.first_refusal,
            "refused_tenants": [
                {"tenant": tenant_name(t), "refused": n}
                for t, n in self.refused_by_tenant.most_common(tenants)
            ],
        }


class VirtualClock:
    """The log's time: set before each request (no lock: one task reads and sets it)."""

    __slots__ = ("t",)

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def set(self, t: float) -> None:
        self.t = t


class _Source:
    def __init__(self, config: Config) -> None:
        self.config: Config | None = config


class Replay:
    """One config's engine on a virtual clock, and what each rule answered."""

    def __init__(self, config: Config, options: EngineOptions | None = None) -> None:
        self.clock = VirtualClock()
        self.stats = Stats(max_series=1_000_000)
        self.backend = MemoryBackend(self.clock)
        source = _Source(config)
        self.engine = RateLimitEngine(source, self.backend, self.clock, self.stats, options)
        # A log repeats its requests: keep the matches of many (bounded: memory).
        self.engine.plans = 1 << 16
        self.engine.watchers.append(self)
        self.rules: dict[str, RuleResult] = {}
        self.decisions = 0
        self.refused = 0
        self.last: Seen | Requested | None = None

    def decided(self, seen: Seen) -> None:
        self.last = seen
        self.decisions += 1
        statuses = seen.decision.statuses
        second = int(seen.now)
        results = self.rules
        over = Code.OVER_LIMIT
        i = -1
        for rule in seen.rules:
            i += 1
            if rule is None:
                continue
            result = results.get(rule.stats_key)
            if result is None:
                result = results[rule.stats_key] = RuleResult(rule.stats_key)
            result.requests += 1
            refused = statuses[i].code is over
            bucket = result.seconds.get(second)
            if bucket is None:
                bucket = result.seconds[second] = [0, 0]
            bucket[refused] += 1
            if refused:
                result.refused_by_tenant[seen.descriptors[i].entries] += 1
                if result.first_refusal is None:
                    result.first_refusal = seen.now
        if seen.decision.code is over:
            self.refused += 1

    def requested(self, seen: Requested) -> None:
        """A Request counts for the node it reached (none: unconfigured, counted nowhere)."""
        self.last = seen
        self.decisions += 1
        refused = seen.refused
        if refused:
            self.refused += 1
        rule = seen.rule
        if rule is None:
            return
        result = self.rules.get(rule.stats_key)
        if result is None:
            result = self.rules[rule.stats_key] = RuleResult(rule.stats_key)
        result.requests += 1
        result.seconds.setdefault(int(seen.now), [0, 0])[refused] += 1
        if refused:
            result.refused_by_tenant[seen.entries] += 1
            if result.first_refusal is None:
                result.first_refusal = seen.now

    @overload
    async def decide(self, logged: Logged) -> Decision: ...

    @overload
    async def decide(self, logged: LoggedRequest) -> Granted: ...

    async def decide(self, logged: Logged | LoggedRequest) -> Decision | Granted:
        """``logged`` decided again at its own time (a Request line: the copies granted)."""
        self.clock.t = logged.t
        if isinstance(logged, LoggedRequest):
            return await self.engine.request(
                logged.domain,
                logged.entries,
                logged.copies,
                logged.min_copies,
                logged.max_wait_millis,
            )
        if logged.key is None:
            return await self.engine.should_rate_limit(
                logged.domain, logged.descriptors, logged.hits
            )
        return await self.engine.should_rate_limit_kept(
            logged.key, lambda: (logged.domain, logged.descriptors, logged.hits)
        )

    def results(self) -> list[RuleResult]:
        """Each rule reached, by its stats key, with the over-limit hits its shadow mode
        let through (the engine's own count)."""
        for name, value in self.stats:
            if name.startswith(RATE_LIMIT) and name.endswith(".shadow_mode"):
                key = name[len(RATE_LIMIT) + 1 : -len(".shadow_mode")]
                if key in self.rules:
                    self.rules[key].shadow = value
        return [self.rules[k] for k in sorted(self.rules)]


@dataclass(slots=True)
class Change:
    """How one tenant's answers differ between two configs."""

    requests: int = 0
    newly_refused: int = 0
    newly_allowed: int = 0
    first: float | None = None
    last: float | None = None


@dataclass(slots=True)
class Outcome:
    """A replay's figures: decisions, how fast, and per config its rules."""

    decisions: int
    seconds: float
    config: Replay
    against: Replay | None = None
    changes: dict[Entries, Change] = field(default_factory=dict)
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else float("inf")


def _compare_requests(changes: dict[Entries, Change], a: Requested, b: Requested) -> None:
    """A Request's answer under the two configs, for its tenant (its entries)."""
    change = changes.get(a.entries)
    if change is None:
        change = changes[a.entries] = Change()
    change.requests += 1
    before, after = a.refused, b.refused
    if after and not before:
        change.newly_refused += 1
        change.first = a.now if change.first is None else change.first
        change.last = a.now
    elif before and not after:
        change.newly_allowed += 1


def _compare(changes: dict[Entries, Change], a: Seen | Requested, b: Seen | Requested) -> None:
    """Each descriptor's answer under the two configs, by tenant (its entries)."""
    if isinstance(a, Requested) or isinstance(b, Requested):
        assert isinstance(a, Requested) and isinstance(b, Requested)
        _compare_requests(changes, a, b)
        return
    sa, sb = a.decision.statuses, b.decision.statuses
    for i, desc in enumerate(a.descriptors):
        entries = desc.entries
        change = changes.get(entries)
        if change is None:
            change = changes[entries] = Change()
        change.requests += 1
        before = sa[i].code is Code.OVER_LIMIT
        after = sb[i].code is Code.OVER_LIMIT
        if before == after:
            continue
        if after:
            change.newly_refused += 1
            change.first = a.now if change.first is None else change.first
            change.last = a.now
        else:
            change.newly_allowed += 1


async def replay(
    logged: Iterable[Logged | LoggedRequest],
    config: Config,
    against: Config | None = None,
    options: EngineOptions | None = None,
) -> Outcome:
    """Every logged request decided under ``config`` (and under ``against``, compared)."""
    first = Replay(config, options)
    second = None if against is None else Replay(against, options)
    changes: dict[Entries, Change] = {}
    count = 0
    started = time.perf_counter()
    errors = 0
    for item in logged:
        count += 1
        try:
            await first.decide(item)
            if second is not None:
                await second.decide(item)
        except RequestError:  # a request the service would refuse as malformed
            errors += 1
            continue
        if second is not None and first.last is not None and second.last is not None:
            _compare(changes, first.last, second.last)
    elapsed = time.perf_counter() - started
    return Outcome(count, elapsed, first, second, changes, errors)
