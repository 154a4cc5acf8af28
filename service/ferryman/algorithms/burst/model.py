"""Charon burst tiers: stacked sliding windows with active and cooldown periods.

The decision is a pure function of a tenant's state at one instant (``now``): it never
changes state itself. ``decide`` returns what would be granted and a plan; only a grant is
committed (``commit``), so a rejected request leaves no trace.

Semantics (per node and tenant), all intervals half-open:
- tier i counts the hits it granted in ``(now - window_i, now]``;
- it is active during ``[entered, entered + active_i)``, then in cooldown for ``cooldown_i``,
  then inactive; a tier entered again starts with an empty window;
- the current tier is the active tier with the greatest index, or the fake tier 0 (limit 0);
- a request is granted in the current tier while its window has room; past that it bursts into
  the next tier, which starts its active period; a tier in cooldown blocks the burst unless it
  is skippable (then the burst tries the one above), and so does a skippable tier with limit 0;
- a bulk request (copies, min_copies) takes the largest n in [min_copies, copies] that the hard
  limit (per tenant, per second), the global limit (all tenants, per second) and the tiers
  allow, possibly through several tiers; n < min_copies grants nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

__all__ = [
    "BurstOutcome",
    "BurstPolicy",
    "BurstRequest",
    "BurstStore",
    "HitLog",
    "TenantState",
    "TenantView",
    "Tier",
    "TierView",
    "commit",
    "decide",
    "view",
]

INACTIVE, ACTIVE, COOLDOWN = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Tier:
    """One burst tier: at most ``limit`` hits per sliding ``window`` seconds while active."""

    limit: int
    window: float
    active: float
    cooldown: float = 0.0
    skippable: bool = False

    def phase(self, entered: float | None, now: float) -> int:
        if entered is None:
            return INACTIVE
        elapsed = now - entered
        if elapsed < self.active:
            return ACTIVE
        if elapsed < self.active + self.cooldown:
            return COOLDOWN
        return INACTIVE


@dataclass(frozen=True, slots=True)
class BurstPolicy:
    """A node's tiers and its per-second limits (None: unbounded), with the node's name and
    the names it replaces."""

    tiers: tuple[Tier, ...]
    hard_limit: int | None = None
    global_limit: int | None = None
    name: str = ""
    replaces: tuple[str, ...] = ()
    kind: ClassVar[str] = "burst_tiers"

    def describe(self) -> str:
        """One line for people: the tiers and the per-second limits."""

        def secs(value: float) -> str:
            return f"{value:g}s"

        tiers = "; ".join(
            f"{t.limit}/{secs(t.window)} active {secs(t.active)} cooldown {secs(t.cooldown)}"
            + (" skippable" if t.skippable else "")
            for t in self.tiers
        )
        text = f"burst_tiers [{tiers}]"
        if self.hard_limit is not None:
            text += f" hard_limit={self.hard_limit}/s"
        if self.global_limit is not None:
            text += f" global_limit={self.global_limit}/s"
        return text

    @property
    def horizon(self) -> float:
        """How long a tenant's state can matter after its last grant."""
        longest = max((t.active + t.cooldown for t in self.tiers), default=0.0)
        return max(longest, 1.0)


class HitLog:
    """Grant times with counts, oldest first, and their total: a sliding-window log.

    Kept as two parallel lists and the index of the oldest live entry rather than a deque
    of pairs: a tenant has a log per tier and one for its last second, and an empty deque
    alone costs more than a tenant's whole state in Redis. Pruning moves the index; the
    dead head is cut off once it is half the lists, so each entry is moved at most once."""

    __slots__ = ("_counts", "_start", "_times", "total")

    def __init__(self, entries: Iterable[tuple[float, int]] = ()) -> None:
        self._times: list[float] = []
        self._counts: list[int] = []
        self._start = 0
        for when, count in entries:
            self._times.append(float(when))
            self._counts.append(int(count))
        self.total = sum(self._counts)

    def prune(self, now: float, span: float) -> None:
        """Forget hits outside ``(now - span, now]``."""
        cutoff = now - span
        times, counts = self._times, self._counts
        start, end = self._start, len(times)
        while start < end and times[start] <= cutoff:
            self.total -= counts[start]
            start += 1
        if start == end:
            times.clear()
            counts.clear()
            start = 0
        elif start * 2 > end:
            del times[:start]
            del counts[:start]
            start = 0
        self._start = start

    def add(self, when: float, count: int) -> None:
        if count <= 0:
            return
        times = self._times
        if len(times) > self._start and times[-1] == when:
            self._counts[-1] += count
        else:
            times.append(when)
            self._counts.append(count)
        self.total += count

    def clear(self) -> None:
        self._times.clear()
        self._counts.clear()
        self._start = 0
        self.total = 0

    def oldest(self) -> float | None:
        return self._times[self._start] if len(self._times) > self._start else None

    def items(self) -> Iterator[tuple[float, int]]:
        """The live (time, count) entries, oldest first."""
        start = self._start
        return zip(self._times[start:], self._counts[start:], strict=True)

    def __len__(self) -> int:
        return len(self._times) - self._start


@dataclass
class TenantState:
    """One tenant's tiers on one node: entry time and hit log per tier, and last second."""

    entered: list[float | None]
    logs: list[HitLog]
    second: HitLog = field(default_factory=HitLog)

    @classmethod
    def empty(cls, tiers: int) -> TenantState:
        return cls([None] * tiers, [HitLog() for _ in range(tiers)])

    def fit(self, tiers: int) -> None:
        """Adapt to a reloaded config with a different number of tiers."""
        while len(self.entered) < tiers:
            self.entered.append(None)
            self.logs.append(HitLog())
        del self.entered[tiers:]
        del self.logs[tiers:]


@dataclass(frozen=True, slots=True)
class BurstOutcome:
    """What a request got, with the context the Limiter API reports."""

    granted: int
    tier_index: int
    tier_limit: int
    tier_hits: int
    tier_window: float
    burst: bool
    limited_by_hard_limit: bool
    limited_by_global_limit: bool
    tenant_last_second: int
    global_last_second: int
    retry_after: float


@dataclass(frozen=True, slots=True)
class BurstRequest:
    """A burst-tier request: ``node`` names the configured node, ``tenant`` the values."""

    node: str
    tenant: str
    policy: BurstPolicy
    copies: int
    min_copies: int


class BurstStore(Protocol):
    """Where burst-tier state lives."""

    async def decide(self, request: BurstRequest, now: float | None = None) -> BurstOutcome:
        """Decide and record one burst-tier request atomically.

        ``now`` overrides the store's own clock (tests; the memory store's injected clock).
        """
        ...

    async def peek(
        self, node: str, tenant: str, policy: BurstPolicy, now: float | None = None
    ) -> TenantView:
        """A tenant's tiers at ``now`` (the store's clock by default), changing nothing."""
        ...

    async def reset(self, node: str, tenant: str, tiers: int) -> int:
        """Forget a tenant's tier logs and state (an operator's reset; the node-wide
        last-second log stays); how many pieces of state were held."""
        ...


@dataclass(frozen=True, slots=True)
class TierView:
    """One tier of a tenant at one instant: ``phase`` is inactive, active or cooldown;
    ``hits`` are those in its window; the times are when its active period and cooldown end
    (None while inactive)."""

    phase: str
    hits: int
    entered: float | None
    active_until: float | None
    cooldown_until: float | None


@dataclass(frozen=True, slots=True)
class TenantView:
    """A tenant's tiers at ``now``: the current tier (0: none active), each tier, and the
    hits of its last second (what ``hard_limit`` counts)."""

    now: float
    current: int
    tiers: tuple[TierView, ...]
    last_second: int


_PHASE_NAMES = ("inactive", "active", "cooldown")


def view(
    policy: BurstPolicy,
    entered: Sequence[float | None],
    logs: Sequence[Iterable[tuple[float, int]]],
    second: Iterable[tuple[float, int]],
    now: float,
) -> TenantView:
    """A tenant's state (tier entry times, hit logs per tier and for the last second, as
    the stores keep them) as seen at ``now``, by the rules ``decide`` applies."""
    tiers = []
    for i, tier in enumerate(policy.tiers):
        start = entered[i] if i < len(entered) else None
        phase = tier.phase(start, now)
        if phase == INACTIVE or start is None:
            tiers.append(TierView("inactive", 0, None, None, None))
            continue
        log = logs[i] if i < len(logs) else ()
        hits = sum(count for when, count in log if when > now - tier.window)
        end = start + tier.active
        tiers.append(TierView(_PHASE_NAMES[phase], hits, start, end, end + tier.cooldown))
    current = max((i + 1 for i, t in enumerate(tiers) if t.phase == "active"), default=0)
    last = sum(count for when, count in second if when > now - 1.0)
    return TenantView(now, current, tuple(tiers), last)


@dataclass(frozen=True, slots=True)
class Plan:
    """The changes a grant makes: hits per tier, tiers entered, and the total."""

    now: float
    granted: int
    per_tier: tuple[tuple[int, int], ...]
    entered: tuple[int, ...]


def _refresh(policy: BurstPolicy, state: TenantState, glob: HitLog, now: float) -> None:
    """Drop what no longer matters at ``now`` (expired windows, finished tier instances)."""
    state.fit(len(policy.tiers))
    for i, tier in enumerate(policy.tiers):
        if tier.phase(state.entered[i], now) == INACTIVE:
            state.entered[i] = None
            state.logs[i].clear()
        else:
            state.logs[i].prune(now, tier.window)
    state.second.prune(now, 1.0)
    glob.prune(now, 1.0)


def _current(policy: BurstPolicy, state: TenantState, now: float) -> int:
    for i in range(len(policy.tiers) - 1, -1, -1):
        if policy.tiers[i].phase(state.entered[i], now) == ACTIVE:
            return i + 1
    return 0


def _simulate(
    policy: BurstPolicy, state: TenantState, glob: HitLog, now: float, copies: int
) -> tuple[int, Plan, bool, bool, bool, int]:
    """Grant up to ``copies`` hits at ``now`` on a refreshed state, without changing it.

    Returns (granted, plan, burst, hard_limited, global_limited, final current tier).
    """
    cap_hard = copies if policy.hard_limit is None else policy.hard_limit - state.second.total
    cap_glob = copies if policy.global_limit is None else policy.global_limit - glob.total
    cap = max(0, min(copies, cap_hard, cap_glob))
    hard = cap_hard < copies and cap_hard <= cap_glob
    glob_limited = cap_glob < copies and cap_glob <= cap_hard
    tiers = policy.tiers
    cur = _current(policy, state, now)
    used: dict[int, int] = {}
    entered: list[int] = []
    burst = False
    need = cap
    while need > 0:
        if cur >= 1:
            room = tiers[cur - 1].limit - state.logs[cur - 1].total - used.get(cur, 0)
            if room > 0:
                take = min(room, need)
                used[cur] = used.get(cur, 0) + take
                need -= take
                continue
        target = 0
        j = cur + 1
        while j <= len(tiers):
            tier = tiers[j - 1]
            phase = tier.phase(state.entered[j - 1], now)
            if phase == COOLDOWN or tier.limit <= 0:
                if tier.skippable:
                    j += 1
                    continue
                break
            target = j
            break
        if target == 0:
            break
        entered.append(target)
        burst = True
        cur = target
    granted = cap - need
    plan = Plan(now, granted, tuple(sorted(used.items())), tuple(entered))
    return granted, plan, burst, hard, glob_limited, cur


def decide(
    policy: BurstPolicy,
    state: TenantState,
    glob: HitLog,
    now: float,
    copies: int,
    min_copies: int,
) -> tuple[BurstOutcome, Plan | None]:
    """Decide a request at ``now``; the returned plan (None when nothing is granted) commits it.

    ``state`` and ``glob`` are pruned to ``now`` (forgetting only what can no longer matter)
    but otherwise left as they are.
    """
    _refresh(policy, state, glob, now)
    granted, plan, burst, hard, glob_limited, cur = _simulate(policy, state, glob, now, copies)
    ok = granted >= min_copies
    if not ok:
        granted = 0
        burst = False
        cur = _current(policy, state, now)
    tier_hits = 0
    tier_limit = 0
    tier_window = math.inf
    if cur >= 1:
        used = dict(plan.per_tier) if ok else {}
        tier_hits = state.logs[cur - 1].total + used.get(cur, 0)
        tier_limit = policy.tiers[cur - 1].limit
        tier_window = policy.tiers[cur - 1].window
    outcome = BurstOutcome(
        granted=granted,
        tier_index=cur,
        tier_limit=tier_limit,
        tier_hits=tier_hits,
        tier_window=tier_window,
        burst=burst,
        limited_by_hard_limit=hard and granted < copies,
        limited_by_global_limit=glob_limited and granted < copies,
        tenant_last_second=state.second.total + granted,
        global_last_second=glob.total + granted,
        retry_after=0.0,
    )
    if not ok or granted < copies or copies == 0:
        after = _after(plan, state, glob) if ok else (state, glob)
        outcome = _with_retry(outcome, policy, after[0], after[1], now)
    return outcome, plan if ok and granted > 0 else None


def _after(plan: Plan, state: TenantState, glob: HitLog) -> tuple[TenantState, HitLog]:
    """A copy of the state with ``plan`` applied (to look ahead without touching the real one)."""
    copy = TenantState(
        list(state.entered),
        [HitLog(log.items()) for log in state.logs],
        HitLog(state.second.items()),
    )
    g = HitLog(glob.items())
    commit(plan, copy, g)
    return copy, g


def _events(policy: BurstPolicy, state: TenantState, glob: HitLog, now: float) -> list[float]:
    """Instants after ``now`` at which a rejected hit may first become grantable.

    Phase boundaries of every tier, and for each log the moment its oldest hit leaves the
    window (room appears then, unless a phase boundary changed things first, which is itself
    a candidate).
    """
    times: set[float] = set()
    for i, tier in enumerate(policy.tiers):
        entered = state.entered[i]
        if entered is not None:
            times.add(entered + tier.active)
            times.add(entered + tier.active + tier.cooldown)
        oldest = state.logs[i].oldest()
        if oldest is not None:
            times.add(oldest + tier.window)
    for log in (state.second, glob):
        oldest = log.oldest()
        if oldest is not None:
            times.add(oldest + 1.0)
    return sorted(t for t in times if t > now)


def _with_retry(
    outcome: BurstOutcome, policy: BurstPolicy, state: TenantState, glob: HitLog, now: float
) -> BurstOutcome:
    """Fill in how long until one more hit could be granted (inf if never, as things stand)."""
    retry = math.inf
    for when in _events(policy, state, glob, now):
        probe_state, probe_glob = _after(Plan(now, 0, (), ()), state, glob)
        _refresh(policy, probe_state, probe_glob, when)
        if _simulate(policy, probe_state, probe_glob, when, 1)[0] >= 1:
            retry = when - now
            break
    return replace(outcome, retry_after=retry)


def commit(plan: Plan, state: TenantState, glob: HitLog) -> None:
    """Record a grant: tiers entered at ``plan.now`` start afresh, hits go to their tiers."""
    for index in plan.entered:
        state.entered[index - 1] = plan.now
        state.logs[index - 1].clear()
    for index, count in plan.per_tier:
        state.logs[index - 1].add(plan.now, count)
    state.second.add(plan.now, plan.granted)
    glob.add(plan.now, plan.granted)
