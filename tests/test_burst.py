"""Burst tiers on an injected clock: the paper's figures and cookbook, step by step."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ferryman.algorithms.burst.model import (
    BurstOutcome,
    BurstPolicy,
    HitLog,
    TenantState,
    Tier,
    commit,
    decide,
)

from helpers.bursts import tier_lists, trace_strategy


class Node:
    """One node's burst state for several tenants, driven request by request."""

    def __init__(self, policy: BurstPolicy) -> None:
        self.policy = policy
        self.tenants: dict[str, TenantState] = {}
        self.glob = HitLog()

    def req(
        self, now: float, copies: int = 1, min_copies: int | None = None, tenant: str = "t"
    ) -> BurstOutcome:
        state = self.tenants.setdefault(tenant, TenantState.empty(len(self.policy.tiers)))
        outcome, plan = decide(
            self.policy, state, self.glob, now, copies, copies if min_copies is None else min_copies
        )
        if plan is not None:
            commit(plan, state, self.glob)
        return outcome

    def granted(self, now: float, times: int, tenant: str = "t") -> list[int]:
        return [self.req(now, tenant=tenant).granted for _ in range(times)]


def test_simple_tier_grants_its_limit_per_sliding_window() -> None:
    """5 per second: five pass, the sixth waits until the first hit leaves the window."""
    node = Node(BurstPolicy((Tier(5, 1.0, 3600.0),)))
    assert node.granted(0.0, 5) == [1] * 5
    rejected = node.req(0.4)
    assert rejected.granted == 0
    assert rejected.retry_after == 0.6
    assert rejected.tier_index == 1
    assert rejected.tier_hits == 5
    assert node.req(1.0).granted == 1


def test_sliding_window_is_not_a_fixed_window() -> None:
    """Hits spread over a window free their slots one by one as each one ages out."""
    node = Node(BurstPolicy((Tier(2, 10.0, 3600.0),)))
    assert node.req(0.0).granted == 1
    assert node.req(6.0).granted == 1
    assert node.req(9.0).granted == 0
    assert node.req(10.0).granted == 1  # the hit at 0 left; the one at 6 is still in
    assert node.req(12.0).granted == 0
    assert node.req(12.0).retry_after == 4.0


def test_successful_burst_into_the_next_tier() -> None:
    """A full tier 1 bursts into tier 2, which then serves at its own limit."""
    node = Node(BurstPolicy((Tier(2, 1.0, 100.0), Tier(4, 1.0, 5.0, 15.0))))
    first = node.req(0.0)
    assert (first.granted, first.burst, first.tier_index) == (1, True, 1)  # out of tier 0
    assert node.req(0.0).burst is False
    third = node.req(0.0)
    assert (third.granted, third.burst, third.tier_index, third.tier_limit) == (1, True, 2, 4)
    assert node.granted(0.0, 4) == [1, 1, 1, 0]


def test_burst_blocked_by_cooldown_then_allowed_after_it() -> None:
    """After tier 2's active period it cools down: tier 1 serves, bursting is refused."""
    node = Node(BurstPolicy((Tier(2, 1.0, 100.0), Tier(4, 1.0, 5.0, 15.0))))
    node.granted(0.0, 3)  # into tier 2 at t=0, active until 5, cooling until 20
    back = node.req(6.0)
    assert (back.granted, back.tier_index) == (1, 1)  # fallback to tier 1
    assert node.req(6.0).granted == 1
    blocked = node.req(6.0)
    assert blocked.granted == 0
    assert blocked.retry_after == 1.0  # tier 1's window frees before the cooldown ends
    node.granted(7.0, 2)
    assert node.req(7.5).granted == 0
    # Once tier 2's cooldown has passed, the burst succeeds again.
    node.granted(20.0, 2)
    again = node.req(20.0)
    assert (again.granted, again.burst, again.tier_index) == (1, True, 2)


def test_skippable_tier_in_cooldown_is_skipped() -> None:
    """A skippable tier in cooldown lets the burst go on to the tier above it."""
    tiers = (
        Tier(1, 1.0, 1000.0),
        Tier(1, 1.0, 1.0, 100.0, skippable=True),
        Tier(10, 1.0, 50.0),
    )
    node = Node(BurstPolicy(tiers))
    assert node.granted(0.0, 2) == [1, 1]  # tier 1, then burst into tier 2
    assert node.req(0.0).tier_index == 3  # tier 2 full: the burst continues into tier 3
    # Now with tier 2 cooling and tier 3 inactive at t=60, a burst skips tier 2.
    node2 = Node(BurstPolicy(tiers))
    node2.granted(0.0, 2)
    node2.granted(2.0, 1)  # tier 1 full at t=2 (tier 2 is cooling since t=1)
    skip = node2.req(2.0)
    assert (skip.granted, skip.burst, skip.tier_index) == (1, True, 3)


def test_non_skippable_tier_in_cooldown_blocks_even_with_tiers_above() -> None:
    """Without skippable, a cooling tier stops the burst although tier 3 is free."""
    tiers = (Tier(1, 1.0, 1000.0), Tier(1, 1.0, 1.0, 100.0), Tier(10, 1.0, 50.0))
    node = Node(BurstPolicy(tiers))
    node.granted(0.0, 2)
    node.granted(2.0, 1)
    assert node.req(2.0).granted == 0


def test_fallback_drops_several_levels_at_once() -> None:
    """When tier 3 ends and tier 2 has already ended, tier 1 becomes current directly."""
    tiers = (Tier(1, 1.0, 100.0), Tier(1, 1.0, 2.0, 50.0), Tier(5, 1.0, 4.0, 50.0))
    node = Node(BurstPolicy(tiers))
    outcomes = [node.req(0.0) for _ in range(3)]
    assert [o.tier_index for o in outcomes] == [1, 2, 3]
    assert node.req(3.0).tier_index == 3  # tier 2 ended at 2; tier 3 still active
    after = node.req(4.5)
    assert (after.granted, after.tier_index) == (1, 1)


def test_prison_tier_holds_a_tenant_for_its_active_period() -> None:
    """Bursting into a limit-1 tier with a long active period locks the tenant out."""
    tiers = (Tier(5, 1.0, 3600.0), Tier(1, 15.0, 15.0))
    node = Node(BurstPolicy(tiers))
    assert node.granted(0.0, 6) == [1] * 6  # the sixth enters prison
    assert node.req(1.0).granted == 0  # tier 1 would have room, but prison is current
    assert node.req(14.9).granted == 0
    assert node.req(1.0).retry_after == 14.0
    released = node.req(15.0)
    assert (released.granted, released.tier_index) == (1, 1)


def test_batch_processing_5000_in_300_seconds_then_nothing_for_the_day() -> None:
    """L=5000, Tw=300, Ta=300, Tc=86100: one bulk run, then closed until the next day."""
    node = Node(BurstPolicy((Tier(5000, 300.0, 300.0, 86100.0),)))
    assert node.req(0.0, copies=3000).granted == 3000
    assert node.req(100.0, copies=2000).granted == 2000
    assert node.req(200.0).granted == 0
    cooling = node.req(301.0)
    assert cooling.granted == 0
    assert cooling.retry_after == 86099.0
    assert node.req(86399.0).granted == 0
    assert node.req(86400.0, copies=5000).granted == 5000


def test_bulk_request_passes_through_two_tiers() -> None:
    """copies=6 over tiers of 3 and 5: three in tier 1, three in tier 2, one burst."""
    node = Node(BurstPolicy((Tier(3, 1.0, 100.0), Tier(5, 1.0, 10.0, 10.0))))
    out = node.req(0.0, copies=6)
    assert (out.granted, out.burst, out.tier_index, out.tier_hits) == (6, True, 2, 3)
    assert node.req(0.0, copies=5, min_copies=1).granted == 2


def test_min_copies_failure_records_nothing() -> None:
    """A request that cannot get min_copies is rejected and leaves the state untouched."""
    node = Node(BurstPolicy((Tier(3, 1.0, 100.0),)))
    failed = node.req(0.0, copies=5, min_copies=4)
    assert failed.granted == 0
    assert node.tenants["t"].logs[0].total == 0
    assert node.tenants["t"].entered == [None]
    assert node.glob.total == 0
    partial = node.req(0.0, copies=5, min_copies=2)
    assert partial.granted == 3


def test_hard_limit_binds_per_tenant_and_global_limit_across_tenants() -> None:
    """H caps one tenant's hits per second; G caps all tenants' together."""
    node = Node(BurstPolicy((Tier(100, 1.0, 100.0),), hard_limit=3, global_limit=4))
    a = node.req(0.0, copies=5, min_copies=1, tenant="a")
    assert (a.granted, a.limited_by_hard_limit, a.limited_by_global_limit) == (3, True, False)
    b = node.req(0.0, copies=5, min_copies=1, tenant="b")
    assert (b.granted, b.limited_by_hard_limit, b.limited_by_global_limit) == (1, False, True)
    assert b.global_last_second == 4
    assert b.tenant_last_second == 1
    assert node.req(0.5, tenant="c").granted == 0
    assert node.req(1.0, copies=3, tenant="c").granted == 3


def test_node_without_tiers_is_inaccessible() -> None:
    """n = 0 tiers: every request is rejected, forever."""
    node = Node(BurstPolicy(()))
    out = node.req(0.0)
    assert out.granted == 0
    assert math.isinf(out.retry_after)


class ExactModel:
    """The semantics written plainly: one timestamp per hit, granted one hit at a time."""

    def __init__(self, policy: BurstPolicy) -> None:
        self.policy = policy
        self.entered: dict[str, list[float | None]] = {}
        self.hits: dict[str, list[list[float]]] = {}
        self.second: dict[str, list[float]] = {}
        self.all_second: list[float] = []

    def phase(self, i: int, entered: float | None, now: float) -> str:
        tier = self.policy.tiers[i]
        if entered is None or now - entered >= tier.active + tier.cooldown:
            return "inactive"
        return "active" if now - entered < tier.active else "cooldown"

    def request(self, tenant: str, now: float, copies: int, min_copies: int) -> int:
        n = len(self.policy.tiers)
        entered = list(self.entered.get(tenant, [None] * n))
        hits = [list(h) for h in self.hits.get(tenant, [[] for _ in range(n)])]
        for i in range(n):
            if self.phase(i, entered[i], now) == "inactive":
                entered[i], hits[i] = None, []
        second = [t for t in self.second.get(tenant, []) if t > now - 1]
        all_second = [t for t in self.all_second if t > now - 1]
        granted = 0
        for _ in range(copies):
            if self.policy.hard_limit is not None and len(second) >= self.policy.hard_limit:
                break
            if self.policy.global_limit is not None and len(all_second) >= self.policy.global_limit:
                break
            current = 0
            for i in range(n):
                if self.phase(i, entered[i], now) == "active":
                    current = i + 1
            placed = False
            while not placed:
                if current >= 1:
                    tier = self.policy.tiers[current - 1]
                    inside = [t for t in hits[current - 1] if t > now - tier.window]
                    if len(inside) < tier.limit:
                        hits[current - 1].append(now)
                        placed = True
                        break
                j = current + 1
                while j <= n:
                    tier = self.policy.tiers[j - 1]
                    if self.phase(j - 1, entered[j - 1], now) == "cooldown" or tier.limit <= 0:
                        if tier.skippable:
                            j += 1
                            continue
                        j = n + 1
                    break
                if j > n:
                    break
                entered[j - 1], hits[j - 1], current = now, [], j
            if not placed:
                break
            second.append(now)
            all_second.append(now)
            granted += 1
        if granted < min_copies:
            return 0
        self.entered[tenant], self.hits[tenant] = entered, hits
        self.second[tenant], self.all_second = second, all_second
        return granted


tiers_strategy = tier_lists([1.0, 2.0, 5.0])


@settings(max_examples=300, deadline=None)
@given(
    tiers=tiers_strategy,
    hard=st.one_of(st.none(), st.integers(0, 6)),
    glob=st.one_of(st.none(), st.integers(0, 8)),
    trace=trace_strategy,
)
def test_grants_equal_the_plain_hit_by_hit_model(
    tiers: list[Tier],
    hard: int | None,
    glob: int | None,
    trace: list[tuple[str, float, int, int]],
) -> None:
    """On random configs and traces, every request gets exactly what the exact model grants."""
    policy = BurstPolicy(tuple(tiers), hard, glob)
    node, model = Node(policy), ExactModel(policy)
    now = 0.0
    for tenant, step, copies, min_copies in trace:
        now += step
        expected = model.request(tenant, now, copies, min(min_copies, copies))
        got = node.req(now, copies=copies, min_copies=min(min_copies, copies), tenant=tenant)
        assert got.granted == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "prune", "clear"]), st.integers(0, 3), st.integers(0, 5)),
        max_size=120,
    )
)
def test_hit_log_keeps_exactly_the_hits_inside_the_window(
    steps: list[tuple[str, int, int]],
) -> None:
    """Adds at non-decreasing times, prunes of various spans and clears: the log's entries,
    total, oldest time and length stay those of a plain list of (time, count) kept by hand,
    through the pruning that moves the head and the compaction that cuts it off."""
    log = HitLog()
    model: list[tuple[float, int]] = []
    now = 0.0
    for op, step, n in steps:
        now += step * 0.25
        if op == "add":
            log.add(now, n)
            if n > 0:
                if model and model[-1][0] == now:
                    model[-1] = (now, model[-1][1] + n)
                else:
                    model.append((now, n))
        elif op == "prune":
            span = 0.25 * n
            log.prune(now, span)
            model = [(t, c) for t, c in model if t > now - span]
        else:
            log.clear()
            model = []
        assert list(log.items()) == model
        assert log.total == sum(c for _, c in model)
        assert len(log) == len(model)
        assert log.oldest() == (model[0][0] if model else None)
    assert list(HitLog(log.items()).items()) == model
