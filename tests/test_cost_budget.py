"""Cost budgets: the model's bookkeeping, any trace of reservations, settlements, duplicates
and expiries on memory, Redis and a Redis Cluster (usage is the settled costs plus the
estimates of expired reservations, and the stores agree), and ``cost_budget`` nodes
through the real gRPC server."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman.algorithms.cost_budget import CostBudget
from ferryman.algorithms.cost_budget.limiter import budget_op
from ferryman.algorithms.cost_budget.model import (
    RESERVE,
    SETTLE_OP,
    BudgetOp,
    BudgetResult,
    BudgetState,
    apply,
)
from ferryman.clock import ManualClock
from ferryman.config import load_sources
from ferryman.core.periods import Span
from ferryman.engine.reset import reset_counters
from ferryman.errors import ConfigError

from helpers.envoy_cli import envoy_cli
from helpers.server import EPOCH, ConfigDir, Server, ServerFactory, codes, descriptor
from helpers.stores import Store, memory_store, on_stores

EXAMPLES = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TTL = 5.0
T0 = round(EPOCH * 1000)  # the model counts in milliseconds


def _op(
    key: str,
    mode: str,
    rid: str,
    amount: int,
    now: float,
    most: int = 10_000,
    owner: str = "",
    delegate: bool = False,
) -> BudgetOp:
    budget = CostBudget(200, Span(86400.0), 50, reservation_ttl=TTL, max_open=most)
    return budget_op(key, budget, mode, rid, amount, now, owner, delegate)


def test_a_settlement_charges_the_actual_cost_once_and_releases_the_estimate() -> None:
    """Reserve 100, settle at 30: 30 charged, nothing reserved, a refund of 70; the same
    settlement again changes nothing; a settlement with no reservation charges in full."""
    states: dict[str, BudgetState] = {}
    now = EPOCH + 10
    (r,) = apply(states, [_op("a", RESERVE, "r1", 100, now)], T0 + 10)
    assert (r.admitted, r.applied, r.charged, r.reserved, r.open) == (True, True, 0, 100, 1)
    (r,) = apply(states, [_op("a", SETTLE_OP, "r1", 30, now)], T0 + 20)
    assert (r.applied, r.charged, r.reserved, r.open, r.refund) == (True, 30, 0, 0, 70)
    (r,) = apply(states, [_op("a", SETTLE_OP, "r1", 30, now)], T0 + 30)
    assert (r.applied, r.charged) == (False, 30)
    (r,) = apply(states, [_op("a", SETTLE_OP, "r9", 500, now)], T0 + 40)
    assert (r.applied, r.charged, r.refund) == (True, 530, 0)


def test_reservations_are_refused_past_the_debt_and_expire_into_a_charge() -> None:
    """The cap is budget + max_debt (250): 200 + 50 fits, one more unit does not; an
    estimate never settled is charged when its time has passed, and the oldest is charged
    first when a tenant holds too many."""
    states: dict[str, BudgetState] = {}
    now = EPOCH
    ok, over = apply(states, [_op("a", RESERVE, "r1", 250, now)], T0 + 0), None
    assert ok[0].admitted
    (over,) = apply(states, [_op("a", RESERVE, "r2", 1, now)], T0 + 1)
    assert not over.admitted and not over.applied and over.reserved == 250
    (r,) = apply(states, [_op("a", RESERVE, "", 0, now)], T0 + 5000)
    assert (r.charged, r.reserved, r.expired) == (250, 0, 1)
    apply(states, [_op("b", RESERVE, "x1", 5, now, most=2)], T0 + 0)
    apply(states, [_op("b", RESERVE, "x2", 7, now, most=2)], T0 + 1)
    (c,) = apply(states, [_op("b", RESERVE, "x3", 9, now, most=2)], T0 + 2)
    assert (c.charged, c.reserved, c.open, c.expired) == (5, 16, 2, 1)


def test_several_budgets_of_one_request_are_reserved_all_or_none() -> None:
    """Alice has room, her organisation has not: neither reservation is taken."""
    states: dict[str, BudgetState] = {}
    now = EPOCH
    apply(states, [_op("org", RESERVE, "r0", 240, now)], T0 + 0)
    alice, org = apply(
        states, [_op("alice", RESERVE, "r1", 20, now), _op("org", RESERVE, "r1", 20, now)], 1
    )
    assert alice.admitted and not alice.applied and alice.reserved == 0
    assert not org.admitted and org.reserved == 240


# A trace: reserve (estimate, tenants, an earlier id to reuse or -1 for a new one), settle
# (which request id, cost, who settles: "e" the reserving identity, "n" a neighbour), wait.
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("reserve"),
            st.integers(0, 60),
            st.sampled_from(["a", "b", "ab"]),
            st.one_of(st.just(-1), st.integers(0, 90)),
        ),
        st.tuples(st.just("settle"), st.integers(0, 40), st.integers(0, 90), st.sampled_from("en")),
        st.tuples(st.just("wait"), st.integers(0, 4000), st.just(""), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)
Step = tuple[str, int, object, object]


@dataclass
class _Books:
    """What the trace did, kept apart from the stores: each reservation taken (tenant,
    id -> estimate, expiry, maker), each applied settlement's time, and the usage they add
    up to."""

    open: dict[tuple[str, str], tuple[int, float, str]] = field(default_factory=dict)
    settled: dict[tuple[str, str], float] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"a": 0, "b": 0})
    ids: list[tuple[str, str]] = field(default_factory=list)

    def expire(self, now: float) -> None:
        for found, (estimate, at, _) in list(self.open.items()):
            if at <= now:
                self.usage[found[0]] += estimate
                del self.open[found]

    def settled_lately(self, found: tuple[str, str], now: float) -> bool:
        last = self.settled.get(found)
        return last is not None and last + TTL > now


async def _trace_reserve(
    budgets: Any, books: _Books, step: Step, n: int, prefix: str, now: float
) -> list[BudgetResult]:
    _, estimate, tenants, reuse = step
    rid = books.ids[int(str(reuse)) % len(books.ids)][1] if books.ids and reuse != -1 else f"r{n}"
    ops = [_op(prefix + f"{{{t}}}", RESERVE, rid, estimate, now, owner="e") for t in str(tenants)]
    results: list[BudgetResult] = await budgets.apply(ops, now)
    held = [(t, rid) in books.open for t in str(tenants)]
    assert not any(r.applied for r, h in zip(results, held, strict=True) if h), "a repeat"
    assert len({r.applied for r, h in zip(results, held, strict=True) if not h}) <= 1
    for t, r in zip(str(tenants), results, strict=True):
        if r.applied:  # new, or an id settled lately reserved afresh
            books.open[(t, rid)] = (estimate, now + TTL, "e")
            books.ids.append((t, rid))
    return results


async def _trace_settle(
    budgets: Any, books: _Books, step: Step, n: int, prefix: str, now: float
) -> list[BudgetResult]:
    _, pick, cost, asker = step
    t, rid = books.ids[pick % len(books.ids)] if books.ids else ("a", f"new{n}")
    op = _op(prefix + f"{{{t}}}", SETTLE_OP, rid, int(str(cost)), now, owner=str(asker))
    results: list[BudgetResult] = await budgets.apply([op], now)
    found = books.open.get((t, rid))  # an open reservation first, then the settled ids
    foreign = found is not None and found[2] != asker
    fresh = found is not None or not books.settled_lately((t, rid), now)
    assert results[0].foreign == foreign, "another identity's reservation is not settled"
    assert results[0].applied == (fresh and not foreign), "a settlement applies once per id"
    if results[0].applied:
        books.settled[(t, rid)] = now
        books.usage[t] += int(str(cost))
        books.open.pop((t, rid), None)
        books.ids.append((t, rid))
    return results


async def _replay(
    store: Store, trace: list[Step], prefix: str
) -> tuple[list[BudgetResult], _Books]:
    budgets = store.backend.store("cost_budget")
    books = _Books()
    out: list[BudgetResult] = []
    now = EPOCH + 0.25
    for n, step in enumerate(trace):
        if step[0] == "wait":
            now += step[1] / 1000
            continue
        books.expire(now)
        ask = _trace_reserve if step[0] == "reserve" else _trace_settle
        out.extend(await ask(budgets, books, step, n, prefix, now))
    return out, books


@on_stores()
@settings(EXAMPLES, max_examples=200)
@given(trace=steps)
def test_any_trace_leaves_usage_equal_to_settled_costs_plus_expired_estimates(
    store: Store, trace: list[Step]
) -> None:
    """Reservations (new ids and reused ones), settlements by the reserving identity and by
    a neighbour, duplicates and expiries in any order: a neighbour never settles another's
    reservation, an id settled lately is reserved afresh, and once every reservation has
    expired each tenant's usage is the sum of its applied settlements' costs plus the
    estimates of its reservations never settled in time; a Redis store answers every call
    as the memory store does."""
    prefix = f"{store.prefix}{uuid.uuid4().hex[:8]}"
    results, books = store.run(_replay(store, trace, prefix))
    end = EPOCH + 10_000
    books.expire(end)
    budgets = store.backend.store("cost_budget")
    for tenant in "ab":
        view = store.run(budgets.peek(_op(prefix + f"{{{tenant}}}", RESERVE, "", 0, end), end))
        assert (view.charged, view.reserved, view.open) == (books.usage[tenant], 0, 0)
    if store.kind != "memory":
        with memory_store(ManualClock(EPOCH)) as reference:
            assert reference.run(_replay(reference, trace, prefix))[0] == results


CONFIG = """
domain: llm
descriptors:
  - key: user
    cost_budget: {budget: 1000, window: 1h, max_debt: 200, reservation_ttl: 30s}
  - key: org
    cost_budget: {budget: 5000, calendar: {unit: month, time_zone: UTC}}
"""


def _ask(server: Server, *descriptors: tuple[list[tuple[str, str]], int]) -> list[str]:
    return codes(server.ask("llm", *(descriptor(e, hits=h) for e, h in descriptors)))


def _settle(server: Server, user: str, rid: str, cost: int) -> list[str]:
    return _ask(server, ([("user", user), ("request_id", rid), ("settle", "1")], cost))


@on_stores()
def test_estimates_are_admitted_until_the_cap_and_settlements_charge_the_exact_total(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """Estimates of 300 pass while charged + reserved stays within 1200 (budget 1000, debt
    200); settlements above and below them charge exactly their costs; once usage is past
    the cap the next request is refused, and the settle entries never reach a stats key."""
    config_dir.write("b.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 60)
    estimate = [("user", "alice"), ("request_id", "r{}")]
    got = [_ask(server, ([(k, v.format(i)) for k, v in estimate], 300))[0] for i in range(5)]
    assert got == ["OK"] * 4 + ["OVER_LIMIT"]
    costs = {"r0": 120, "r1": 480, "r2": 300, "r3": 250}
    for rid, cost in costs.items():
        assert _settle(server, "alice", rid, cost) == ["OK"]
    assert _settle(server, "alice", "r1", 480) == ["OK"]  # a duplicate changes nothing
    query = "/explain?domain=llm&descriptor=user=alice,request_id=r7,settle=1"
    explained = json.loads(server.http("GET", query, debug=True)[1])["descriptors"][0]
    assert explained["stats_key"] == "llm.user"
    assert explained["read_by_rule"] == [["request_id", "r7"], ["settle", "1"]]
    assert (explained["charged"], explained["reserved"]) == (sum(costs.values()), 0)
    assert _ask(server, ([("user", "alice"), ("request_id", "r5")], 1)) == ["OK"]
    assert _settle(server, "alice", "r9", 100) == ["OK"]  # never refused, even into debt
    assert _ask(server, ([("user", "alice"), ("request_id", "r6")], 0)) == ["OVER_LIMIT"]
    stats = server.stats
    assert not [name for name in stats if "request_id" in name or "settle_" in name]
    row = "ratelimit.service.rate_limit.llm.user"
    assert stats[f"{row}.settlements"] == 5 and stats[f"{row}.duplicate_settlements"] == 1
    assert stats[f"{row}.settled_cost"] == 1250 and stats[f"{row}.refunds"] == 2


@on_stores()
def test_a_requests_budgets_are_reserved_all_or_none_and_unsettled_ones_expire(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """A user with room and an organisation without: the request is refused and the user's
    estimate is not held; an estimate never settled is charged when its 30 s are up; an
    operator's reset forgets the budget."""
    config_dir.write("b.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 60)
    assert _ask(server, ([("org", "acme"), ("request_id", "big")], 4990)) == ["OK"]
    both = (
        ([("user", "bob"), ("request_id", "r1")], 50),
        ([("org", "acme"), ("request_id", "r1")], 50),
    )
    assert _ask(server, *both) == ["OK", "OVER_LIMIT"]
    assert _ask(server, ([("user", "bob"), ("request_id", "r2")], 1200)) == ["OK"]
    clock.set(EPOCH + 95)
    assert _ask(server, ([("user", "bob"), ("request_id", "r3")], 1)) == ["OVER_LIMIT"]
    assert server.stats["ratelimit.service.rate_limit.llm.user.expired_reservations"] == 1
    service = server.service
    cleared = server.run(
        reset_counters(
            service.backend.store,
            service.holder.config,
            "llm",
            [("user", "bob")],
            service.engine.options,
            clock.now(),
        )
    )
    assert (cleared.kind, cleared.held) == ("cost_budget", True)
    assert _ask(server, ([("user", "bob"), ("request_id", "r4")], 1200)) == ["OK"]


@on_stores("redis")
def test_a_settlement_reaches_the_reservation_made_before_a_restart(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """ferryman restarted between a request and its settlement, on Redis: the new process
    releases the reservation and charges the actual cost, nothing lost or charged twice."""
    config_dir.write("b.yaml", CONFIG)
    first = make_server()
    clock.set(EPOCH + 60)
    assert _ask(first, ([("user", "carol"), ("request_id", "r1")], 900)) == ["OK"]
    first.stop()
    second = make_server(store_of=first)
    assert _settle(second, "carol", "r1", 100) == ["OK"]
    assert _ask(second, ([("user", "carol"), ("request_id", "r2")], 1100)) == ["OK"]
    assert _ask(second, ([("user", "carol"), ("request_id", "r3")], 1)) == ["OVER_LIMIT"]


def test_cost_budget_yaml_and_its_errors() -> None:
    """A budget reads its window in the three forms of every window kind, and its max_cost
    is the budget unless given; a missing budget, a settle key named ``settle``, a max_cost
    of 0 and an unknown key are refused with file, line and path."""
    config = load_sources([("b.yaml", CONFIG)])
    limit = config.domains["llm"].root.rules[0].limit
    assert isinstance(limit, CostBudget) and (limit.cap, limit.settle_key) == (1200, "request_id")
    assert limit.most_cost == 1000
    for body, path, message in [
        ("    cost_budget: {unit: hour}\n", "", "needs 'budget'"),
        (
            "    cost_budget: {budget: 1, unit: hour, settle_key: settle}\n",
            ".settle_key",
            "other than",
        ),
        ("    cost_budget: {budget: 1, unit: hour, x: 1}\n", ".x", "unknown key"),
        ("    cost_budget: {budget: 1, unit: hour, max_cost: 0}\n", ".max_cost", "out of range"),
        ("    cost_budget: {budget: 1}\n", "", "missing 'unit'"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_sources([("b.yaml", "domain: d\ndescriptors:\n  - key: k\n" + body)])
        text = str(err.value)
        assert "b.yaml:4" in text, text
        assert f"descriptors[0].cost_budget{path}" in text, text
        assert message in text


def test_envoy_generate_emits_the_estimate_and_the_settlement_and_check_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ferryman envoy generate` gives a budget's route its two RateLimitPerRoute entries
    (the estimate at request time, the settlement at stream end, paired by x-request-id);
    `envoy check` walks both to the budget and warns that the estimate header may be absent,
    and that a route's own rate_limits would drop hits_addend."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "b.yaml").write_text(CONFIG)
    run = envoy_cli(capsys, "generate", "--config", str(config), "--domain", "llm")
    assert run.code == 0, run.err
    tree = yaml.safe_load(run.out)
    routes = tree["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    route = routes["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]
    estimate, settle = route["typed_per_filter_config"]["envoy.filters.http.ratelimit"][
        "rate_limits"
    ]
    pair = {"request_headers": {"header_name": "x-request-id", "descriptor_key": "request_id"}}
    assert estimate["actions"][1:] == [pair]
    assert estimate["hits_addend"] == {"format": "%REQ(x-estimate-cost)%"}
    mark = {"generic_key": {"descriptor_key": "settle", "descriptor_value": "1"}}
    assert settle["actions"][1:] == [pair, mark] and settle["apply_on_stream_done"] is True
    assert settle["hits_addend"] == {"format": "%RESP(x-cost)%"}
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(run.out)
    checked = envoy_cli(capsys, "check", str(envoy), "--config", str(config))
    assert checked.code == 0, checked.out
    assert checked.out.count("-> llm.user: cost budget 1000 per 1h") == 2, checked.out
    assert "no x-estimate-cost header" in checked.out
    route.pop("typed_per_filter_config")
    route["route"]["rate_limits"] = [estimate]
    envoy.write_text(yaml.safe_dump(tree))
    checked = envoy_cli(capsys, "check", str(envoy), "--config", str(config))
    assert "Envoy drops hits_addend (%REQ(x-estimate-cost)%)" in checked.out, checked.out
