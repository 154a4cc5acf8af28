"""What only the memory store does: sweeping what expired, thread safety, bounded burst state,
one cap on every kind's state.

What every store does is in the conformance suite, tests/test_store_*.py."""

from __future__ import annotations

import asyncio
import json
import threading

from ferryman.algorithms.burst.model import BurstPolicy, BurstRequest, Tier
from ferryman.algorithms.copies.model import CopyPolicy, Holder
from ferryman.algorithms.cost_budget import CostBudget
from ferryman.algorithms.cost_budget.limiter import budget_op
from ferryman.algorithms.cost_budget.model import RESERVE, SETTLE_OP, BudgetOp
from ferryman.algorithms.fixed_window.model import CounterOp
from ferryman.algorithms.gcra.model import GcraParams
from ferryman.algorithms.leases import (
    AlgorithmSpec,
    LeaseState,
    ResourceTemplate,
    TemplateSource,
    find_template,
)
from ferryman.algorithms.token_bucket.memory import MemoryTokenBucketStore
from ferryman.algorithms.token_bucket.model import BucketRef, BucketSpec, TakeStatus
from ferryman.backends.memory import MemoryBackend
from ferryman.clock import ManualClock
from ferryman.core.periods import Span

from helpers.server import ConfigDir, ServerFactory


def op(key: str, hits: int = 1, limit: int = 10, expires_at: int = 60) -> CounterOp:
    return CounterOp(key, hits, limit, expires_at, 60)


def test_expired_windows_are_dropped_so_memory_tracks_live_windows() -> None:
    """After 100 windows of 100 keys each, only the current window's keys remain."""
    clock = ManualClock(0.0)
    backend = MemoryBackend(clock)
    for window in range(100):
        clock.set(window * 60.0)
        end = (window + 1) * 60
        backend.store("fixed_window").apply_now(
            [op(f"k{i}_{window * 60}", expires_at=end) for i in range(100)], stop_when_over=False
        )
        assert len(backend.store("fixed_window")) <= 100
    assert len(backend.store("fixed_window")) == 100


def test_a_window_that_ended_reads_as_zero_even_before_it_is_swept() -> None:
    """A counter past its expiry counts from zero again."""
    clock = ManualClock(0.0)
    backend = MemoryBackend(clock)
    backend.store("fixed_window").apply_now([op("a", 5, expires_at=60)], stop_when_over=False)
    clock.set(60.0)
    assert (
        backend.store("fixed_window")
        .apply_now([op("a", 1, expires_at=120)], stop_when_over=False)[0]
        .after
        == 1
    )


def test_concurrent_threads_lose_no_hits() -> None:
    """8 threads x 2000 increments of one counter add up exactly."""
    backend = MemoryBackend(ManualClock(0.0))

    def work() -> None:
        for _ in range(2000):
            backend.store("fixed_window").apply_now(
                [op("shared", 1, limit=10**9)], stop_when_over=False
            )

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (
        backend.store("fixed_window").apply_now([op("shared", 0)], stop_when_over=False)[0].after
        == 16000
    )


def test_memory_forgets_idle_tenants() -> None:
    """Burst state of a tenant is dropped once its tiers can no longer matter."""
    backend = MemoryBackend(ManualClock(0.0))
    policy = BurstPolicy((Tier(5, 1.0, 10.0, 5.0),))
    for i in range(100):
        backend.store("burst_tiers").decide_now(BurstRequest("node", f"t{i}", policy, 1, 1), 0.0)
    assert backend.store("burst_tiers").tenants == 100
    backend.store("burst_tiers").decide_now(BurstRequest("node", "late", policy, 1, 1), 16.0)
    assert backend.store("burst_tiers").tenants == 1


def test_memory_keeps_one_expiry_entry_per_tenant_not_per_grant() -> None:
    """Thousands of grants to a few tenants leave a handful of expiry entries, not thousands."""
    backend = MemoryBackend(ManualClock(0.0))
    policy = BurstPolicy((Tier(10**6, 1.0, 3600.0),))
    for i in range(5000):
        backend.store("burst_tiers").decide_now(
            BurstRequest("node", f"t{i % 3}", policy, 1, 1), i * 0.01
        )
    assert backend.store("burst_tiers").tenants == 3
    assert len(backend.store("burst_tiers")._heap) == 3
    # Past the horizon they all go, heap entries included.
    backend.store("burst_tiers").decide_now(BurstRequest("node", "late", policy, 1, 1), 50 + 3601.0)
    assert backend.store("burst_tiers").tenants == 1
    assert len(backend.store("burst_tiers")._heap) == 1


T0 = 1_700_000_000.0


def _budget_op(key: str, mode: str, rid: str, amount: int) -> BudgetOp:
    budget = CostBudget(100, Span(3600.0), 0, reservation_ttl=300.0)
    return budget_op(key, budget, mode, rid, amount, T0)


def test_every_kinds_state_counts_against_one_cap() -> None:
    """GCRA tenants, fixed-window counters and cost budgets' tenants and remembered ids
    share MEMORY_MAX_KEYS: each kind's shares add up to the total, which never passes the
    cap; a kind makes room in its own state first, then in the others'."""
    backend = MemoryBackend(ManualClock(T0), max_keys=64)
    gcra, budgets = backend.store("gcra"), backend.store("cost_budget")
    limit = GcraParams.of(10, 1_000_000, 10)
    for i in range(40):
        assert gcra.take_at(f"g{i}", limit, 1, 0, round(T0 * 1e6)).allowed
    backend.store("fixed_window").apply_now([op(f"c{i}") for i in range(10)], stop_when_over=False)
    for i in range(30):  # spent tenants: their ids may go, they may not
        (r,) = budgets.apply_at([_budget_op(f"b{i}", SETTLE_OP, "s", 100)], round(T0 * 1000))
        assert r.applied
        assert backend.cap.held() <= 64
    shares = backend.cap.shares()
    assert sum(shares.values()) == backend.cap.held() <= 64
    assert shares["cost_budget"] >= 30 and shares["gcra"] < 40
    assert backend.cap.evicted >= 30 and backend.cap.refused == 0


def test_an_open_reservation_made_room_for_is_charged_then_dropped() -> None:
    """Over the cap, the least recently used budget goes first: its open reservation is
    charged its estimate (never forgotten for free), so a tenant that reserved its whole
    budget stays spent, while idle tenants are forgotten."""
    backend = MemoryBackend(ManualClock(T0), max_keys=8)
    budgets = backend.store("cost_budget")
    now = round(T0 * 1000)
    budgets.apply_at([_budget_op("bob", RESERVE, "r1", 100)], now)
    for i in range(20):
        budgets.apply_at([_budget_op(f"t{i}", SETTLE_OP, "s", 1)], now)
        assert backend.cap.held() <= 8
    view = backend.cap.shares()["cost_budget"]
    assert view <= 8
    (r,) = budgets.apply_at([_budget_op("bob", RESERVE, "r2", 1)], now)
    assert not r.admitted and (r.charged, r.reserved, r.open) == (100, 0, 0)


def test_a_full_cap_with_nothing_safe_to_forget_refuses_new_budget_state() -> None:
    """Once every entry held is a spent tenant, a new tenant's settlement changes nothing
    and is refused (full, counted), rather than passing the cap."""
    backend = MemoryBackend(ManualClock(T0), max_keys=4)
    budgets = backend.store("cost_budget")
    now = round(T0 * 1000)
    results = [
        budgets.apply_at([_budget_op(f"t{i}", SETTLE_OP, "s", 100)], now)[0] for i in range(6)
    ]
    assert backend.cap.held() <= 4 and results[0].applied
    assert results[-1].full and not results[-1].applied and backend.cap.refused >= 1
    assert budgets.tenants <= 4


def test_burst_tenants_count_against_the_cap_and_only_idle_ones_go() -> None:
    """Burst tenants are the cap's ``burst`` share; a new tenant past it forgets tenants
    whose tiers are all over, least recently granted first, never one in a tier or in
    cooldown; with only those left, the new tenant is granted nothing and not kept."""
    backend = MemoryBackend(ManualClock(0.0), max_keys=3)
    bursts = backend.store("burst_tiers")
    policy = BurstPolicy((Tier(2, 1.0, 10.0, 5.0),))

    def ask(tenant: str, now: float) -> int:
        return int(bursts.decide_now(BurstRequest("n", tenant, policy, 1, 1), now).granted)

    assert [ask("a", 0.0), ask("b", 0.0), ask("c", 5.0), ask("a", 9.0), ask("b", 9.0)] == [1] * 5
    # At 16 a and b entered their tier at 0: over (kept until 24 by their grant at 9); c is
    # cooling down until 20.
    assert [ask("d", 16.0), ask("e", 16.0), ask("f", 16.0)] == [1, 1, 0]
    assert backend.cap.shares()["burst"] == backend.cap.held() == bursts.tenants == 3
    assert (backend.cap.evicted, backend.cap.refused) == (2, 1)
    views = {t: asyncio.run(bursts.peek("n", t, policy, 16.0)) for t in "acdf"}
    assert [views[t].tiers[0].phase for t in "acdf"] == [
        "inactive",
        "cooldown",
        "active",
        "inactive",
    ]
    assert ask("c", 17.0) == 0  # still cooling down: not let in again


def test_quota_buckets_count_against_the_cap_and_only_full_ones_go() -> None:
    """The quota service's buckets are the cap's ``quota`` share; a new dynamic bucket past
    it forgets a bucket full again (reported removed), never one short of tokens; with
    none, the new bucket is refused REJECTED_TOO_MANY_BUCKETS."""
    clock = ManualClock(T0)
    backend = MemoryBackend(clock, max_keys=3)
    store = backend.quota_store("", clock)
    assert isinstance(store, MemoryTokenBucketStore)
    spec = BucketSpec(size=2, fill_rate=1.0, wait_timeout_millis=0)
    us = round(T0 * 1_000_000)

    def take(name: str, after: float) -> tuple[TakeStatus, tuple[str, ...]]:
        ref = BucketRef("ns", name, True)
        result = store.take_at(ref, spec, 1, 0, us + round(after * 1_000_000))
        return result.status, result.removed

    ok = TakeStatus.OK
    assert [take("a", 0), take("b", 1.9), take("c", 2.0)] == [(ok, ())] * 3
    assert take("d", 2.0) == (ok, ("a",))  # full again since 1.0: as good as new
    assert take("e", 2.0) == (TakeStatus.REJECTED_TOO_MANY_BUCKETS, ())
    assert backend.cap.shares()["quota"] == backend.cap.held() == len(store) == 3
    assert (backend.cap.evicted, backend.cap.refused) == (1, 1)
    clock.set(T0 + 2.0)
    for name in "bcd":  # still short of tokens: kept
        standing = asyncio.run(store.peek(BucketRef("ns", name, True), spec))
        assert standing is not None and standing.stored < spec.size, name


class _Templates(TemplateSource):
    def template(self, resource_id: str) -> ResourceTemplate | None:
        spec = AlgorithmSpec(lease_length=10, refresh_interval=2, learning_mode_duration=0)
        return find_template((ResourceTemplate("*", 100.0, spec),), resource_id)


def test_capacity_leases_count_against_the_cap_and_only_expired_ones_go() -> None:
    """Clients' leases are the cap's ``leases`` share; a new client past it forgets an
    expired lease, never a live one; with none, the new client gets a lease of 0 that is
    not kept, and the live leases are unchanged."""
    backend = MemoryBackend(ManualClock(T0), max_keys=2)
    state = LeaseState(_Templates(), min_refresh_interval=0, cap=backend.cap)
    state.reset(T0)
    assert state.ask("a", "r1", wants=10, now=T0)[0].capacity == 10
    assert state.ask("b", "r2", wants=10, now=T0 + 5)[0].capacity == 10
    refused = state.ask("c", "r2", wants=10, now=T0 + 6)[0]
    assert refused.capacity == 0 and "c" not in state.resources["r2"].clients
    assert backend.cap.refused == 1
    # At +11 a's lease (until +10) is over: it goes, not b's (until +15).
    assert state.ask("c", "r2", wants=10, now=T0 + 11)[0].capacity == 10
    assert backend.cap.shares()["leases"] == backend.cap.held() == len(state) == 2
    assert "r1" not in state.resources and set(state.resources["r2"].clients) == {"b", "c"}
    assert backend.cap.evicted == 1


def test_held_copies_count_against_the_cap_and_live_holds_are_never_dropped() -> None:
    """Held copies' counts, holds and tenants are the cap's ``copies`` share; past it a
    tenant whose holds all lapsed is forgotten, a live hold never; with nothing safe to
    forget a new tenant's hold is refused (no copies), the others' holds unchanged."""
    backend = MemoryBackend(ManualClock(0.0), max_keys=7)
    copies = backend.store("copies")
    policy = CopyPolicy(limit=5, hold_ttl=10.0)

    def hold(tenant: str, now: float) -> int:
        holder = Holder("n", "envoy", 0, now)
        outcome = asyncio.run(copies.envoy_reserve(holder, tenant, policy, (), 1, tenant))
        return int(outcome.granted)

    assert [hold("a", 0.0), hold("b", 0.0), hold("c", 5.0)] == [1, 1, 0]  # 3 entries each
    assert backend.cap.refused == 1 and copies.counts("n") == {"d:a": 1, "d:b": 1, "all": 2}
    # At 11 a's and b's holds lapsed: only their tenants' hold lists are left, then go.
    assert [hold("c", 11.0), hold("d", 11.0), hold("e", 11.0)] == [1, 1, 0]
    assert copies.counts("n") == {"d:c": 1, "d:d": 1, "all": 2}
    assert backend.cap.shares()["copies"] == backend.cap.held() == len(copies) == 7
    assert backend.cap.evicted == 2 and backend.cap.refused == 2


DYNAMIC = """
namespaces:
  per_user:
    dynamic_bucket_template:
      {size: 2, fill_rate: 0.001, wait_timeout_millis: 0, max_tokens_per_request: 1}
"""


def test_status_shows_the_quota_buckets_share_and_new_buckets_past_the_cap_are_refused(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A caller naming 80 new dynamic buckets over POST /quota/allow under
    MEMORY_MAX_KEYS=50: none is full again, so the first 50 are kept and the rest refused
    REJECTED_TOO_MANY_BUCKETS; /status counts them as the ``quota`` share of the cap."""
    config_dir.write("quota.yaml", DYNAMIC)
    server = make_server(memory_max_keys=50)
    answers = []
    for i in range(80):
        body = {"namespace": "per_user", "bucket_name": f"u{i}", "tokens_requested": 1}
        answers.append(
            json.loads(server.http("POST", "/quota/allow", json.dumps(body).encode())[1])
        )
    assert [a["status"] for a in answers] == ["OK"] * 50 + ["REJECTED_TOO_MANY_BUCKETS"] * 30
    memory = json.loads(server.http("GET", "/status", debug=True)[1])["memory"]
    assert memory["kinds"]["quota"] == memory["keys"] == 50, memory
    assert memory["refused"] == 30 and memory["evicted"] == 0, memory
