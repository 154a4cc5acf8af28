"""The ShouldRateLimit decision: match descriptors, count in one backend call, answer."""

from __future__ import annotations

import asyncio
import enum
import math
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ferryman.backends.base import Backend, BurstRequest, CounterOp, CounterResult
from ferryman.clock import Clock
from ferryman.config.model import UNIT_SECONDS, Config, Domain, RateLimit, Rule, Unit
from ferryman.errors import BackendError, NotFoundError, RequestError
from ferryman.limits.burst import BurstOutcome, BurstPolicy
from ferryman.limits.fixed_window import classify, reset_after, window_start
from ferryman.limits.local_cache import OverLimitCache
from ferryman.stats import CALL, GLOBAL_SHADOW_MODE, LOCAL_CACHE_HITS, Stats

__all__ = [
    "MAX_REMAINING",
    "Code",
    "Decision",
    "DescriptorRequest",
    "EngineOptions",
    "FixedWindowCall",
    "RateLimitEngine",
    "Status",
]

MAX_REMAINING = 2**32 - 1
_UNKNOWN: Any = object()  # a rule not looked at yet, in RateLimitEngine._plain


class Code(enum.IntEnum):
    """The numbers are those of the RLS proto's ``RateLimitResponse.Code``."""

    UNKNOWN = 0
    OK = 1
    OVER_LIMIT = 2


@dataclass(slots=True)
class DescriptorRequest:
    """One descriptor of a request: its entries, optional override, optional own hits."""

    entries: tuple[tuple[str, str], ...]
    limit: RateLimit | None = None
    hits: int | None = None
    negative: bool = False


@dataclass(slots=True)
class Status:
    code: Code
    limit: RateLimit | None = None
    remaining: int = 0
    reset_after: int | None = None
    quota: bool = False
    window: float | None = None  # a burst tier's exact window, for the response headers


@dataclass(slots=True)
class Decision:
    code: Code
    statuses: tuple[Status, ...]
    headers: tuple[tuple[str, str], ...] = ()
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The global switches of the reference service (see Settings)."""

    near_limit_ratio: float = 0.8
    shadow_mode: bool = False
    quota_mode: bool = False
    stop_when_over: bool = False
    headers: bool = False
    limit_header: str = "RateLimit-Limit"
    remaining_header: str = "RateLimit-Remaining"
    reset_header: str = "RateLimit-Reset"
    dynamic_metadata: bool = False
    cache_key_prefix: str = ""
    local_cache_bytes: int = 0
    fail_open: bool = False


class ConfigSource(Protocol):
    @property
    def config(self) -> Config | None: ...


class FixedWindowCall(Protocol):
    """The shape of ``Backend.fixed_window``, for a wrapper that times or traces it."""

    async def __call__(
        self, ops: Sequence[CounterOp], *, stop_when_over: bool
    ) -> list[CounterResult]: ...


@dataclass(slots=True)
class _Planned:
    index: int
    limit: RateLimit
    seconds: int
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    shadow: bool
    quota: bool
    rule: Rule | None
    op: CounterOp | None = None
    cached: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Plain:
    """A fixed-window rule whose stats key and counter key take nothing from the request
    but its entries (no detailed_metric, value_to_metric or share_threshold on its path):
    what all its descriptors share, worked out once per rule and config."""

    limit: RateLimit
    seconds: int
    stats_key: str
    stats_path: tuple[str, ...]
    shadow: bool
    quota: bool
    metadata: Mapping[str, Any]
    head: str  # the counter key's start, <prefix><domain>_

    @staticmethod
    def of(domain: str, path: Sequence[Rule], opts: EngineOptions) -> _Plain | None:
        rule = path[-1]
        limit = rule.rate_limit
        if (
            limit is None
            or limit.unlimited
            or limit.unit is None
            or rule.copies is not None
            or rule.burst is not None
            or rule.detailed_metric
            or any(r.value_to_metric or r.share_threshold for r in path)
        ):
            return None
        return _Plain(
            limit,
            limit.unit.seconds,
            rule.stats_key,
            rule.stats_path,
            rule.shadow_mode,
            rule.quota_mode or opts.quota_mode,
            rule.metadata,
            f"{opts.cache_key_prefix}{domain}_",
        )


@dataclass(slots=True)
class _CopyItem:
    index: int
    rule: Rule
    node: str
    tenant: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


@dataclass(slots=True)
class _BurstItem:
    index: int
    rule: Rule
    policy: BurstPolicy
    request: BurstRequest
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


def unit_for(window: float) -> Unit:
    """The smallest unit not shorter than ``window`` (how a burst tier's limit is reported)."""
    for unit in sorted(UNIT_SECONDS, key=UNIT_SECONDS.__getitem__):
        if window <= UNIT_SECONDS[unit]:
            return unit
    return Unit.YEAR


def _segment(key: str, value: str) -> str:
    return f"{key}_{value}" if value else key


def _match(domain: Domain, entries: Sequence[tuple[str, str]]) -> list[Rule] | None:
    """The rules along the path of ``entries``, or None when the tree has no such path."""
    level = domain.root
    path: list[Rule] = []
    for key, value in entries:
        rule = level.match(key, value)
        if rule is None:
            return None
        path.append(rule)
        level = rule.children
    return path


def _stats_key(
    domain: str, entries: Sequence[tuple[str, str]], path: Sequence[Rule]
) -> tuple[str, tuple[str, ...]]:
    """The rule's stats key and its parts (domain, level1, ...), request values included
    where ``detailed_metric`` or ``value_to_metric`` ask for them."""
    last = path[-1]
    if last.detailed_metric:
        parts = [
            _segment(k, rule.value if rule.share_threshold else v)
            for (k, v), rule in zip(entries, path, strict=True)
        ]
        return domain + "." + ".".join(parts), (domain, *parts)
    for rule in path:
        if rule.value_to_metric:
            break
    else:
        return last.stats_key, last.stats_path
    parts = []
    for (k, v), rule in zip(entries, path, strict=True):
        if rule.value_to_metric:
            parts.append(_segment(k, rule.value if rule.share_threshold else v))
        else:
            parts.append(_segment(rule.key, rule.value))
    return domain + "." + ".".join(parts), (domain, *parts)


def _cache_key(
    prefix: str, domain: str, entries: Sequence[tuple[str, str]], path: Sequence[Rule] | None
) -> str:
    parts = [prefix, domain, "_"]
    for i, (k, v) in enumerate(entries):
        if path is not None and path[i].share_threshold:
            v = path[i].value
        parts.append(f"{k}_{v}_")
    return "".join(parts)


class RateLimitEngine:
    """Decides ShouldRateLimit requests against the current config and a backend."""

    def __init__(
        self,
        source: ConfigSource,
        backend: Backend,
        clock: Clock,
        stats: Stats,
        options: EngineOptions | None = None,
        *,
        backend_call: FixedWindowCall | None = None,
    ) -> None:
        """``backend_call`` stands in for ``backend.fixed_window`` (telemetry wraps it)."""
        self._source = source
        self._backend = backend
        self._fixed_window: FixedWindowCall = (
            backend.fixed_window if backend_call is None else backend_call
        )
        self._clock = clock
        self._stats = stats
        self.options = options or EngineOptions()
        self.local_cache = (
            OverLimitCache(self.options.local_cache_bytes)
            if self.options.local_cache_bytes > 0
            else None
        )
        # Rule -> its _Plain (None: not plain), for the config and options they came from.
        self._plain: dict[Rule, _Plain | None] = {}
        self._plain_for: tuple[Config | None, EngineOptions | None] = (None, None)

    @staticmethod
    def validate(domain: str, descriptors: Sequence[DescriptorRequest]) -> None:
        """Raise RequestError naming the first malformed field."""
        if not domain:
            raise RequestError("domain", "must not be empty")
        if not descriptors:
            raise RequestError("descriptors", "must not be empty")
        for i, descriptor in enumerate(descriptors):
            if not descriptor.entries:
                raise RequestError(f"descriptors[{i}].entries", "must not be empty")
            for j, (key, _value) in enumerate(descriptor.entries):
                if not key:
                    raise RequestError(f"descriptors[{i}].entries[{j}].key", "must not be empty")

    async def should_rate_limit(
        self, domain: str, descriptors: Sequence[DescriptorRequest], hits_addend: int = 0
    ) -> Decision:
        self.validate(domain, descriptors)
        config = self._source.config
        if config is None:
            raise RequestError("domain", "no rate limit configuration is loaded")
        opts = self.options
        stats = self._stats
        dom = config.domains.get(domain)
        if dom is None:
            stats.rule(domain, "domain_not_found", 1, (domain,))
            return Decision(Code.OK, tuple(Status(Code.OK) for _ in descriptors))

        if self._plain_for[0] is not config or self._plain_for[1] is not opts:
            self._plain.clear()
            self._plain_for = (config, opts)
        plains = self._plain
        request_hits = hits_addend or 1
        statuses: list[Status | None] = [None] * len(descriptors)
        planned: list[_Planned] = []
        bursts: list[_BurstItem] = []
        holds: list[_CopyItem] = []
        replaced: set[str] = set()
        local = self.local_cache
        now = self._clock.now()
        for i, desc in enumerate(descriptors):
            hits = request_hits if desc.hits is None else desc.hits
            if desc.negative:
                hits = -hits
            if desc.limit is not None:
                parts = tuple(_segment(k, v) for k, v in desc.entries)
                key = domain + "." + ".".join(parts)
                item = _Planned(
                    i, desc.limit, 0, key, (domain, *parts), hits, False, opts.quota_mode, None
                )
                cache_base = _cache_key(opts.cache_key_prefix, domain, desc.entries, None)
            else:
                entries = desc.entries
                path: list[Rule] | None
                if len(entries) == 1:  # the path is the matched rule: no list needed yet
                    last, path = dom.root.match(*entries[0]), None
                else:
                    path = _match(dom, entries)
                    last = path[-1] if path is not None else None
                plain = plains.get(last, _UNKNOWN) if last is not None else None
                if plain is _UNKNOWN:
                    assert last is not None
                    plain = plains[last] = _Plain.of(domain, path or [last], opts)
                if isinstance(plain, _Plain):
                    # The common case, without the general path's per-request work.
                    if plain.limit.replaces:
                        replaced.update(plain.limit.replaces)
                    item = _Planned(
                        i,
                        plain.limit,
                        plain.seconds,
                        plain.stats_key,
                        plain.stats_path,
                        hits,
                        plain.shadow,
                        plain.quota,
                        last,
                        metadata=plain.metadata,
                    )
                    cache_base = plain.head + "".join([f"{k}_{v}_" for k, v in desc.entries])
                elif last is None or (
                    last.rate_limit is None and last.burst is None and last.copies is None
                ):
                    statuses[i] = Status(Code.OK)
                    continue
                else:
                    assert last is not None
                    path = path or [last]
                    rule = last
                    if rule.copies is not None:
                        # Concurrency through Envoy: hits hold copies, negative hits (sent when
                        # the stream ends) give them back.
                        key, parts = _stats_key(domain, desc.entries, path)
                        tenant = "_".join(v for _, v in desc.entries)
                        holds.append(
                            _CopyItem(
                                i,
                                rule,
                                self.copies_node(rule),
                                tenant,
                                key,
                                parts,
                                hits,
                                rule.quota_mode or opts.quota_mode,
                            )
                        )
                        continue
                    if rule.burst is not None:
                        if hits < 0:
                            # Burst tiers record grants only; nothing to give back.
                            statuses[i] = Status(Code.OK)
                            continue
                        replaced.update(rule.replaces)
                        key, parts = _stats_key(domain, desc.entries, path)
                        bursts.append(
                            _BurstItem(
                                i,
                                rule,
                                rule.burst,
                                self._burst_request(rule, desc.entries, hits, hits),
                                key,
                                parts,
                                hits,
                                rule.quota_mode or opts.quota_mode,
                            )
                        )
                        continue
                    limit = rule.rate_limit
                    assert limit is not None
                    if limit.unlimited:
                        statuses[i] = Status(Code.OK, remaining=MAX_REMAINING)
                        continue
                    replaced.update(limit.replaces)
                    key, parts = _stats_key(domain, desc.entries, path)
                    item = _Planned(
                        i,
                        limit,
                        0,
                        key,
                        parts,
                        hits,
                        rule.shadow_mode,
                        rule.quota_mode or opts.quota_mode,
                        rule,
                        metadata=rule.metadata,
                    )
                    cache_base = _cache_key(opts.cache_key_prefix, domain, desc.entries, path)
            seconds = item.seconds
            if not seconds:
                assert item.limit.unit is not None
                seconds = item.seconds = item.limit.unit.seconds
            start = window_start(now, seconds)
            item.op = CounterOp(
                cache_base + str(start),
                hits,
                item.limit.requests_per_unit,
                start + seconds,
                seconds,
            )
            if local is not None:
                if hits < 0:
                    local.discard(item.op.key)
                elif local.contains(item.op.key, now):
                    item.cached = True
            planned.append(item)

        if replaced:
            # A replaced rule answers OK with no limit and leaves its counter alone.
            for index in [i.index for i in planned if i.limit.name in replaced]:
                statuses[index] = Status(Code.OK)
            for index in [b.index for b in bursts if b.rule.name in replaced]:
                statuses[index] = Status(Code.OK)
            planned = [i for i in planned if statuses[i.index] is None]
            bursts = [b for b in bursts if statuses[b.index] is None]

        ops = [item.op for item in planned if item.op is not None and not item.cached]
        try:
            if (ops and (bursts or holds)) or len(bursts) + len(holds) > 1:
                results, outcomes, held = await self._all_at_once(
                    ops, bursts, holds, now, opts.stop_when_over
                )
            else:
                results = (
                    await self._fixed_window(ops, stop_when_over=opts.stop_when_over) if ops else []
                )
                outcomes = [await self._backend.burst(b.request, now) for b in bursts]
                held = [await self._envoy_hold(h, now) for h in holds]
        except BackendError:
            if not opts.fail_open:
                raise
            stats.inc(f"{CALL}.degraded")
            return Decision(Code.OK, tuple(Status(Code.OK) for _ in descriptors))
        result_iter = iter(results)

        ratio = opts.near_limit_ratio
        quota_total = quota_over = 0
        over_hard = False
        counts: list[tuple[str, tuple[str, ...], tuple[int, ...]]] = []
        metadata: dict[str, Any] = {}
        for item in planned:
            limit = item.limit
            rpu = limit.requests_per_unit
            reset = reset_after(now, item.seconds)
            key = item.stats_key
            labels = item.stats_path
            hits = item.hits
            if item.cached:
                over = True
                counts.append((key, labels, (hits, 0, 0, hits)))
                stats.inc(LOCAL_CACHE_HITS)
                stats.rule(key, "over_limit_with_local_cache", hits, labels)
            else:
                result = next(result_iter)
                after = result.after
                if hits < 0:
                    remaining = max(0, rpu - after)
                    statuses[item.index] = Status(Code.OK, limit, remaining, reset, item.quota)
                    continue
                over, delta = classify(hits, rpu, after - result.applied, after, ratio)
                counts.append((key, labels, (hits, delta.within, delta.near, delta.over)))
                if over and local is not None and item.op is not None:
                    local.add(item.op.key, item.op.expires_at)
            if over and item.shadow:
                stats.rule(key, "shadow_mode", item.hits, labels)
                over = False
                remaining = 0
            else:
                remaining = 0 if over else rpu - after
            code = Code.OVER_LIMIT if over else Code.OK
            statuses[item.index] = Status(code, limit, remaining, reset, item.quota)
            if item.quota:
                quota_total += 1
                quota_over += over
            elif over:
                over_hard = True
            if not over:
                for name, value in item.metadata.items():
                    metadata.setdefault(name, value)

        if counts:
            stats.rule_counts(counts)
        for h, status in zip(holds, held, strict=True):
            statuses[h.index] = status
            if status.code is Code.OVER_LIMIT:
                if h.quota:
                    quota_total += 1
                    quota_over += 1
                else:
                    over_hard = True
            elif h.quota:
                quota_total += 1
        for b, outcome in zip(bursts, outcomes, strict=True):
            over = outcome.granted < b.hits
            status = self._burst_status(b, outcome, over)
            if status.code is Code.OK and not over:
                for name, value in b.rule.metadata.items():
                    metadata.setdefault(name, value)
            statuses[b.index] = status
            over = status.code is Code.OVER_LIMIT
            if b.quota:
                quota_total += 1
                quota_over += over
            elif over:
                over_hard = True

        final = [s if s is not None else Status(Code.OK) for s in statuses]
        code = Code.OK
        if over_hard or (quota_total and quota_over == quota_total):
            code = Code.OVER_LIMIT
        if code is Code.OVER_LIMIT and opts.shadow_mode:
            stats.inc(GLOBAL_SHADOW_MODE)
            code = Code.OK
        headers = self._headers(final) if opts.headers else ()
        meta = None
        if opts.dynamic_metadata:
            meta = {
                "domain": domain,
                "descriptors": [
                    {
                        "entries": [{"key": k, "value": v} for k, v in d.entries],
                        **({} if d.hits is None else {"hitsAddend": d.hits}),
                    }
                    for d in descriptors
                ],
                "hitsAddend": request_hits,
            }
            for name, value in metadata.items():
                meta.setdefault(name, value)
        return Decision(code, tuple(final), headers, meta)

    async def _all_at_once(
        self,
        ops: list[CounterOp],
        bursts: list[_BurstItem],
        holds: list[_CopyItem],
        now: float,
        stop_when_over: bool,
    ) -> tuple[list[CounterResult], list[BurstOutcome], list[Status]]:
        """The backend calls of a request that mixes kinds (or has several burst or held
        descriptors), started together: a pipelined Redis sends them in one write, so the
        request still costs one round trip. They run in descriptor order, as one by one."""
        calls: list[Awaitable[Any]] = []
        if ops:
            calls.append(self._fixed_window(ops, stop_when_over=stop_when_over))
        calls.extend(self._backend.burst(b.request, now) for b in bursts)
        calls.extend(self._envoy_hold(h, now) for h in holds)
        replies: list[Any] = list(await asyncio.gather(*calls, return_exceptions=True))
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        first = 1 if ops else 0
        results: list[CounterResult] = replies[0] if ops else []
        outcomes: list[BurstOutcome] = replies[first : first + len(bursts)]
        held: list[Status] = replies[first + len(bursts) :]
        return results, outcomes, held

    async def _envoy_hold(self, h: _CopyItem, now: float) -> Status:
        """Take (or give back) an Envoy hold on a copy-limited node, as a descriptor status."""
        policy = h.rule.copies
        assert policy is not None
        stats = self._stats
        if h.hits < 0:
            await self._backend.envoy_release(h.node, h.tenant, -h.hits, "envoy", now)
            return Status(Code.OK)
        groups = policy.groups_of(h.tenant)
        out = await self._backend.envoy_reserve(
            h.node, h.tenant, policy, groups, h.hits, uuid.uuid4().hex, "envoy", now
        )
        stats.rule(h.stats_key, "total_hits", h.hits, h.stats_path)
        rooms = [g.limit - out.group_held.get(g.name, 0) for g in groups]
        if policy.limit is not None:
            rooms.append(policy.limit - out.tenant_held)
        if policy.global_limit is not None:
            rooms.append(policy.global_limit - out.global_held)
        remaining = max(0, min(rooms)) if rooms else MAX_REMAINING
        if h.hits == 0 or out.granted:
            stats.rule(h.stats_key, "within_limit", h.hits, h.stats_path)
            return Status(Code.OK, remaining=remaining, quota=h.quota)
        stats.rule(h.stats_key, "over_limit", h.hits, h.stats_path)
        if h.rule.shadow_mode:
            stats.rule(h.stats_key, "shadow_mode", h.hits, h.stats_path)
            return Status(Code.OK, quota=h.quota)
        return Status(Code.OVER_LIMIT, quota=h.quota)

    def _burst_request(
        self, rule: Rule, entries: Sequence[tuple[str, str]], copies: int, min_copies: int
    ) -> BurstRequest:
        assert rule.burst is not None
        node = f"{self.options.cache_key_prefix}ferryman_burst_{rule.stats_key}"
        tenant = "_".join(v for _, v in entries)
        return BurstRequest(node, tenant, rule.burst, copies, min_copies)

    def _count_burst(
        self, key: str, labels: tuple[str, ...], hits: int, outcome: BurstOutcome, shadow: bool
    ) -> None:
        stats = self._stats
        granted = outcome.granted
        stats.rule(key, "total_hits", hits, labels)
        stats.rule(key, "within_limit", granted, labels)
        # Tiers come from configuration: one series per tier at most.
        stats.rule(key, "tier_hits", granted, labels, (("tier", str(outcome.tier_index)),))
        if granted < hits:
            stats.rule(key, "over_limit", hits - granted, labels)
            if shadow:
                stats.rule(key, "shadow_mode", hits, labels)

    def _burst_status(self, b: _BurstItem, outcome: BurstOutcome, over: bool) -> Status:
        """The Envoy view of a burst decision: the current tier as the limit."""
        self._count_burst(b.stats_key, b.stats_path, b.hits, outcome, b.rule.shadow_mode)
        if outcome.burst:
            self._stats.rule(b.stats_key, "burst", 1, b.stats_path)
        policy = b.policy
        window = outcome.tier_window
        if not math.isfinite(window):
            window = policy.tiers[0].window if policy.tiers else 1.0
        limit = RateLimit(outcome.tier_limit, unit_for(window), name=b.rule.name)
        remaining = max(0, outcome.tier_limit - outcome.tier_hits)
        reset = math.ceil(outcome.retry_after) if math.isfinite(outcome.retry_after) else None
        if over and b.rule.shadow_mode:
            return Status(Code.OK, limit, 0, reset, b.quota, window)
        code = Code.OVER_LIMIT if over else Code.OK
        return Status(code, limit, 0 if over else remaining, reset, b.quota, window)

    def resolve(self, domain: str, entries: Sequence[tuple[str, str]], kind: str) -> list[Rule]:
        """The rules along the path to a ``burst`` or ``copies`` node, or a client error."""
        if not domain:
            raise RequestError("domain", "must not be empty")
        if not entries:
            raise RequestError("descriptor", "must not be empty")
        for j, (key, _value) in enumerate(entries):
            if not key:
                raise RequestError(f"descriptor[{j}].key", "must not be empty")
        config = self._source.config
        if config is None:
            raise RequestError("domain", "no rate limit configuration is loaded")
        dom = config.domains.get(domain)
        if dom is None:
            raise NotFoundError("domain", f"unknown domain {domain!r}")
        path = _match(dom, entries)
        shown = ", ".join(f"{k}={v}" for k, v in entries)
        if path is None:
            raise NotFoundError("descriptor", f"no node of domain {domain!r} matches ({shown})")
        rule = path[-1]
        if (rule.burst if kind == "burst" else rule.copies) is not None:
            return path
        wanted = "burst tiers" if kind == "burst" else "copies (held resources)"
        if rule.rate_limit is not None:
            raise RequestError(
                "descriptor",
                f"{rule.stats_key} is limited by a fixed window (rate_limit), not {wanted}: "
                "ask it with ShouldRateLimit",
            )
        if rule.burst is not None:
            raise RequestError(
                "descriptor",
                f"{rule.stats_key} is rate-limited by burst tiers, not {wanted}: use Request",
            )
        if rule.copies is not None:
            raise RequestError(
                "descriptor",
                f"{rule.stats_key} is copy-limited (held resources), not {wanted}: use Reserve",
            )
        raise NotFoundError("descriptor", f"{rule.stats_key} has no {wanted} configured")

    def copies_node(self, rule: Rule) -> str:
        """The backend name of a copy-limited node (its keys share one hash tag)."""
        return f"{self.options.cache_key_prefix}ferryman_copies_{rule.stats_key}"

    async def request_rate(
        self, domain: str, entries: Sequence[tuple[str, str]], copies: int, min_copies: int
    ) -> tuple[BurstPolicy, BurstOutcome]:
        """Charon's ``request``: up to ``copies`` hits on a burst-tier node, at least
        ``min_copies`` or none. Raises RequestError / NotFoundError naming the problem."""
        path = self.resolve(domain, entries, "burst")
        rule = path[-1]
        assert rule.burst is not None
        request = self._burst_request(rule, entries, copies, min_copies)
        key, parts = _stats_key(domain, entries, path)
        try:
            outcome = await self._backend.burst(request, self._clock.now())
        except BackendError:
            if not self.options.fail_open:
                raise
            self._stats.inc(f"{CALL}.degraded")
            outcome = BurstOutcome(copies, 0, 0, 0, math.inf, False, False, False, 0, 0, 0.0)
            return rule.burst, outcome
        self._count_burst(key, parts, copies, outcome, False)
        if outcome.burst:
            self._stats.rule(key, "burst", 1, parts)
        return rule.burst, outcome

    def _headers(self, statuses: Sequence[Status]) -> tuple[tuple[str, str], ...]:
        best: Status | None = None
        for status in statuses:
            if status.limit is None or status.reset_after is None:
                continue
            if best is None:
                best = status
                continue
            rank = (status.code is not Code.OVER_LIMIT or status.quota, status.remaining)
            best_rank = (best.code is not Code.OVER_LIMIT or best.quota, best.remaining)
            if rank < best_rank:
                best = status
        if best is None or best.limit is None:
            return ()
        opts = self.options
        limit = str(best.limit.requests_per_unit)
        if best.window is not None:
            limit = f"{limit}, {limit};w={best.window:g}"
        return (
            (opts.limit_header, limit),
            (opts.remaining_header, str(best.remaining)),
            (opts.reset_header, str(best.reset_after)),
        )
