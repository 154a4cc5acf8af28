"""The limiter shape of the kinds that keep one key per tenant (GCRA, token buckets, sliding
windows, rate-limit lists): a node's rule prepared once, each descriptor planned as one item
on its tenant's key, one store call per item, and each answer made a status, counted and
tallied; and, for explain, the console and resets, a descriptor's state found at its
tenant's key and cleared by deleting it. A kind says what it keeps of its limit, which call
it makes, whether an answer fits and what status it gives; the rest is written here once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar

from ferryman.core.algorithm import Algorithm, AlgorithmBase, Ask, Call, Target
from ferryman.core.answers import MAY_WAIT, Code, EngineOptions, Status, Tally
from ferryman.core.keys import stats_key, tenant_key
from ferryman.core.rules import Rule
from ferryman.errors import BackendError
from ferryman.stats import REQUEST_CALL, Stats

__all__ = ["TenantItem", "TenantKeyed", "TenantLimiter", "TenantRule", "first_granted"]

L = TypeVar("L")  # what a kind keeps of a node's limit
R = TypeVar("R")  # the store's answer for one item

#: The per-rule stats of a kind whose hits may wait for their turn (ferryman.v1's
#: ``Request`` with ``max_wait``, ShouldRateLimit on a node with ``max_wait``).
WAIT_STATS: Mapping[str, str] = MappingProxyType(
    {
        "served_with_wait": "Hits granted on a GCRA or token-bucket node after a wait.",
        "waited_ms": "Milliseconds waited by the hits granted after a wait, in all "
        "(over served_with_wait: the mean wait).",
    }
)


@dataclass(frozen=True, slots=True)
class TenantRule(Generic[L]):
    """A node's rule as its kind prepared it, once per config."""

    rule: Rule
    limit: L
    path: tuple[Rule, ...]
    quota: bool


@dataclass(slots=True)
class TenantItem(Generic[L]):
    """One descriptor of a request, on its tenant's key."""

    index: int
    rule: Rule
    limit: L
    key: str
    stats_key: str
    stats_path: tuple[str, ...]
    hits: int
    quota: bool


class TenantLimiter(Generic[L, R]):
    """Plans and answers the descriptors of one kind that keeps a key per tenant."""

    #: The kind's part of its keys (``ferryman_<tag>_{...}``).
    tag: ClassVar[str]
    item: ClassVar[type[TenantItem[Any]]] = TenantItem

    def __init__(self, algorithm: Algorithm, opts: EngineOptions, stats: Stats) -> None:
        self.algorithm = algorithm
        self.opts = opts
        self.stats = stats

    # -- what a kind says ------------------------------------------------------------------

    def keep(self, rule: Rule) -> L:
        """What the kind keeps of ``rule``'s limit, worked out once per config."""
        raise NotImplementedError

    def call(self, store: Any, item: TenantItem[L], now: float) -> Awaitable[R]:
        """The store's call deciding ``item``."""
        raise NotImplementedError

    def fits(self, reply: R) -> bool:
        """Whether the store let the item's hits pass."""
        raise NotImplementedError

    def status(self, item: TenantItem[L], reply: R) -> Status:
        """The Envoy view of the decision, its stats counted."""
        raise NotImplementedError

    def waited(self, reply: R) -> float:
        """The seconds a fitting reply's hits were booked to wait (0: they pass now)."""
        return 0.0

    # -- written once ----------------------------------------------------------------------

    def key(self, rule: Rule, entries: Sequence[tuple[str, str]]) -> str:
        """One tenant's state (the request's values): one key, its own hash tag."""
        return tenant_key(self.opts.cache_key_prefix, self.tag, rule, entries)

    def prepare(self, domain: str, path: tuple[Rule, ...], quota: bool) -> TenantRule[L]:
        rule = path[-1]
        return TenantRule(rule, self.keep(rule), path, quota)

    def plan(
        self,
        prepared: TenantRule[L],
        index: int,
        domain: str,
        entries: Sequence[tuple[str, str]],
        hits: int,
        now: float,
    ) -> TenantItem[L]:
        key, parts = stats_key(domain, entries, prepared.path)
        rule = prepared.rule
        # Nothing these kinds take is given back: a negative hit only looks.
        hits = max(hits, 0)
        tenant = self.key(rule, entries)
        return self.item(index, rule, prepared.limit, tenant, key, parts, hits, prepared.quota)

    def asked(self, ask: Ask, key: str) -> TenantItem[L]:
        """The item a ferryman.v1 ``Request`` stands for (its copies as the hits)."""
        rule = ask.path[-1]
        stats, parts = stats_key(ask.domain, ask.entries, ask.path)
        quota = rule.quota_mode or self.opts.quota_mode
        return self.item(0, rule, self.keep(rule), key, stats, parts, ask.copies, quota)

    def calls(self, store: Any, items: Sequence[TenantItem[L]], now: float) -> list[Call]:
        return [(1, self.call(store, item, now)) for item in items]

    def may_wait(self, rule: Rule) -> float:
        """Seconds a ShouldRateLimit's hits on ``rule`` may be booked to wait: the node's
        ``max_wait``, within what the caller may wait (``MAY_WAIT``); 0 for the others."""
        if not rule.max_wait:
            return 0.0
        return min(rule.max_wait, MAY_WAIT.get())

    def answer(
        self,
        items: Sequence[TenantItem[L]],
        replies: Sequence[Any],
        now: float,
        statuses: list[Status | None],
        tally: Tally,
    ) -> None:
        for item, reply in zip(items, replies, strict=True):
            status = self.status(item, reply)
            statuses[item.index] = status
            fits = self.fits(reply)
            metadata = item.rule.metadata if fits else None
            tally.add(status.code is Code.OVER_LIMIT, item.quota, metadata)
            if fits and item.rule.max_wait:
                tally.wait = max(tally.wait, self.waited(reply))

    def count(self, item: TenantItem[L], granted: bool, wait: float = 0.0) -> None:
        """The node's outcome stats for ``item``; ``wait``: the seconds its hits wait."""
        shadow = item.rule.shadow_mode
        waited = granted and wait > 0
        self.stats.outcome(item.stats_key, item.stats_path, item.hits, granted, shadow, waited)
        if waited:
            ms = max(1, round(wait * 1000)) * item.hits
            self.stats.rule(item.stats_key, "waited_ms", ms, item.stats_path)


async def first_granted(
    limiter: TenantLimiter[Any, R], ask: Ask, take: Callable[[int], Awaitable[R]]
) -> tuple[int, R] | None:
    """ferryman.v1's ``Request`` as a kind that takes copies answers it: ``copies``, else
    ``min_copies``, else none; the copies granted and the last answer. None when the backend
    failed and FAIL_OPEN grants them all (counted); the error otherwise."""
    counts = (ask.copies, ask.min_copies) if ask.min_copies < ask.copies else (ask.copies,)
    try:
        for n in counts:
            reply = await take(n)
            if limiter.fits(reply):
                return n, reply
    except BackendError:
        if not limiter.opts.fail_open:
            raise
        limiter.stats.inc(f"{REQUEST_CALL}.degraded")
        return None
    return 0, reply


class TenantKeyed(AlgorithmBase):
    """The Algorithm of a kind that keeps one key per tenant: a descriptor's state is at
    its tenant's key, and a reset deletes that key."""

    #: The kind's part of its keys (``ferryman_<tag>_{...}``), the same as its limiter's.
    tag: ClassVar[str]

    def state(self, limit: Any) -> Any:
        """What ``peek`` reads the state with: the limit, unless the kind keeps less."""
        return limit

    def target(
        self,
        options: EngineOptions,
        domain: str,
        path: Sequence[Rule],
        entries: Sequence[tuple[str, str]],
        now: float,
    ) -> Target | None:
        rule = path[-1]
        key = tenant_key(options.cache_key_prefix, self.tag, rule, entries)
        return Target(key, self.state(rule.limit))

    async def reset(self, store: Any, target: Target) -> bool:
        return bool(await store.reset(target.key) > 0)
