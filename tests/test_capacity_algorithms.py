"""The capacity algorithms and lease rules, in-process: the spec's examples and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferryman.algorithms.leases import (
    AlgorithmSpec,
    Band,
    Demand,
    Kind,
    Lease,
    LeaseState,
    ResourceTemplate,
    TemplateSource,
    allocate,
    find_template,
)

T0 = 1_700_006_400.0


def wants(*values: float) -> list[Demand]:
    return [Demand(v) for v in values]


def test_fair_share_example_from_the_design() -> None:
    """FAIR_SHARE of 120 among wants 1000, 50, 10 gives 60, 50, 10."""
    assert allocate(Kind.FAIR_SHARE, 120, wants(1000, 50, 10)) == pytest.approx([60, 50, 10])


def test_proportional_share_example_from_the_design() -> None:
    """PROPORTIONAL_SHARE of 120 among wants 1000, 50, 10 gives 69.69, 40.31, 10."""
    got = allocate(Kind.PROPORTIONAL_SHARE, 120, wants(1000, 50, 10))
    assert got == pytest.approx([69.6907, 40.3093, 10], abs=1e-4)


def test_fair_share_is_max_min_fair_past_two_rounds() -> None:
    """With six tiers of demand the largest client gets its max-min share, 34 (not 32)."""
    got = allocate(Kind.FAIR_SHARE, 100, wants(1, 5, 10, 20, 30, 100))
    assert got == pytest.approx([1, 5, 10, 20, 30, 34])


def test_static_caps_each_client_and_no_algorithm_grants_wants() -> None:
    """STATIC gives min(wants, capacity) to each; NO_ALGORITHM gives what is wanted."""
    assert allocate(Kind.STATIC, 10, wants(5, 50, 10)) == [5, 10, 10]
    assert allocate(Kind.NO_ALGORITHM, 10, wants(5, 50)) == [5, 50]


def test_a_server_weighs_as_its_clients() -> None:
    """A demand for 3 clients gets three times the equal share of a demand for one."""
    got = allocate(Kind.FAIR_SHARE, 100, [Demand(1000, 3), Demand(1000, 1)])
    assert got == pytest.approx([75, 25])


demand_lists = st.lists(
    st.builds(
        Demand,
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
        st.integers(min_value=1, max_value=5),
    ),
    max_size=40,
)
capacities = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(capacities, demand_lists, st.sampled_from([Kind.FAIR_SHARE, Kind.PROPORTIONAL_SHARE]))
def test_shares_never_exceed_capacity_nor_wants(
    capacity: float, demands: list[Demand], kind: Kind
) -> None:
    """Shared kinds hand out at most the capacity, nobody more than it wants, all when they can."""
    got = allocate(kind, capacity, demands)
    assert sum(got) <= capacity * (1 + 1e-9) + 1e-9
    for share, demand in zip(got, demands, strict=True):
        assert 0 <= share <= demand.wants
    total = sum(d.wants for d in demands)
    assert sum(got) == pytest.approx(min(capacity, total), rel=1e-6, abs=1e-6)


@given(capacities, demand_lists)
def test_fair_share_is_max_min_fair(capacity: float, demands: list[Demand]) -> None:
    """Whoever gets less than it wants gets, per client, at least what anyone else gets."""
    got = allocate(Kind.FAIR_SHARE, capacity, demands)
    per_client = [g / d.weight for g, d in zip(got, demands, strict=True)]
    for share, demand, mine in zip(got, demands, per_client, strict=True):
        if share < demand.wants * (1 - 1e-9):
            assert all(mine >= other * (1 - 1e-9) - 1e-9 for other in per_client)


class Templates(TemplateSource):
    def __init__(self, *templates: ResourceTemplate) -> None:
        self.templates = templates

    def template(self, resource_id: str) -> ResourceTemplate | None:
        return find_template(self.templates, resource_id)


def fair(capacity: float, glob: str = "*", **algorithm: int) -> ResourceTemplate:
    timing: dict[str, int] = {
        "lease_length": 10,
        "refresh_interval": 2,
        "learning_mode_duration": 0,
        **algorithm,
    }
    spec = AlgorithmSpec(
        Kind.FAIR_SHARE,
        lease_length=timing["lease_length"],
        refresh_interval=timing["refresh_interval"],
        learning_mode_duration=timing["learning_mode_duration"],
    )
    return ResourceTemplate(glob, capacity, spec)


def leases(*templates: ResourceTemplate, min_interval: float = 0.0) -> LeaseState:
    state = LeaseState(Templates(*templates), min_refresh_interval=min_interval)
    state.reset(T0)
    return state


def test_three_clients_converge_in_two_rounds_without_over_commit() -> None:
    """The first comer takes all; after one more round each has its fair share."""
    state = leases(fair(120))
    demand = {"a": 1000.0, "b": 50.0, "c": 10.0}
    got: dict[str, float] = {}
    for round_ in range(2):
        for client, w in demand.items():
            got[client] = state.ask(client, "r", wants=w, now=T0 + round_)[0].capacity
            assert sum(got.values()) <= 120 + 1e-9
    assert got == pytest.approx({"a": 60, "b": 50, "c": 10})


def test_expired_client_is_forgotten_and_its_share_freed() -> None:
    """A client that stops refreshing is gone after its lease; the other then gets it all."""
    state = leases(fair(100))
    state.ask("a", "r", wants=100, now=T0)
    state.ask("b", "r", wants=100, now=T0)
    state.ask("a", "r", wants=100, now=T0 + 1)
    assert state.ask("b", "r", wants=100, now=T0 + 1)[0].capacity == 50
    assert state.ask("b", "r", wants=100, now=T0 + 11)[0].capacity == 100
    assert set(state.resources["r"].clients) == {"b"}
    state.sweep(T0 + 30)
    assert state.resources == {}


def test_release_frees_at_once() -> None:
    """ReleaseCapacity removes the lease; the next asker gets the freed capacity."""
    state = leases(fair(100))
    state.ask("a", "r", wants=100, now=T0)
    state.release("a", ["r"])
    assert state.ask("b", "r", wants=100, now=T0)[0].capacity == 100


def test_minimum_refresh_interval_returns_the_current_lease() -> None:
    """Asking again before the minimum interval returns the same lease, unchanged."""
    state = leases(fair(100), min_interval=5)
    first = state.ask("a", "r", wants=10, now=T0)[0]
    assert state.ask("a", "r", wants=90, now=T0 + 4)[0] == first
    assert state.ask("a", "r", wants=90, now=T0 + 5)[0].capacity == 90


def test_learning_mode_grants_what_is_held_capped_by_wants() -> None:
    """While learning, a client gets min(has, wants), and nothing without a lease."""
    state = LeaseState(Templates(fair(100, learning_mode_duration=10)), min_refresh_interval=0)
    state.reset(T0)
    has = Lease(T0 + 5, 2, 80)
    assert state.ask("a", "r", wants=50, has=has, now=T0)[0].capacity == 50
    assert state.ask("b", "r", wants=50, now=T0)[0].capacity == 0
    assert state.ask("b", "r", wants=50, now=T0 + 10)[0].capacity == 50


def test_safe_capacity_is_static_or_an_equal_share() -> None:
    """Safe capacity is the template's when set, else capacity over clients known."""
    state = leases(fair(90), ResourceTemplate("s", 90, safe_capacity=7))
    state.ask("a", "r", wants=1, now=T0)
    assert state.ask("b", "r", wants=1, now=T0)[1] == 45
    assert state.ask("a", "s", wants=1, now=T0)[1] == 7


def test_unconfigured_resource_is_granted_and_counted() -> None:
    """No template: the request gets what it wants and is counted as unconfigured."""
    state = leases(fair(10, glob="known"))
    lease, _, template = state.ask("a", "other", wants=99, now=T0)
    assert (lease.capacity, template, state.unconfigured_requests) == (99, None, 1)
    assert "other" not in state.resources


def test_lease_expiry_is_capped_by_the_source() -> None:
    """A server's own lease from its parent bounds the leases it hands out."""

    class Capped(Templates):
        def expiry_cap(self, resource_id: str) -> float | None:
            return T0 + 3

    state = LeaseState(Capped(fair(10)), min_refresh_interval=0)
    state.reset(T0)
    assert state.ask("a", "r", wants=1, now=T0)[0].expiry_time == T0 + 3


steps = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.floats(min_value=0, max_value=500, allow_nan=False),
        st.floats(min_value=0, max_value=4),
        st.booleans(),
    ),
    max_size=60,
)


@settings(max_examples=200)
@given(steps, st.sampled_from([Kind.FAIR_SHARE, Kind.PROPORTIONAL_SHARE]))
def test_live_leases_never_sum_above_capacity(
    trace: list[tuple[str, float, float, bool]], kind: Kind
) -> None:
    """Under any sequence of asks, releases and elapsed time, live leases fit the capacity."""
    spec = AlgorithmSpec(kind, lease_length=6, refresh_interval=2, learning_mode_duration=0)
    state = leases(ResourceTemplate("*", 100, spec))
    now = T0
    for client, w, elapsed, release in trace:
        now += elapsed
        if release:
            state.release(client, ["r"])
        else:
            lease = state.ask(client, "r", wants=w, now=now)[0]
            assert lease.capacity <= w
        resource = state.resources.get("r")
        if resource is not None:
            live = [
                c.lease.capacity for c in resource.clients.values() if c.lease.expiry_time > now
            ]
            assert math.fsum(live) <= 100 + 1e-6


def test_bands_are_stored_with_the_server() -> None:
    """A server's demand keeps its priority bands (for the debug page)."""
    state = leases(fair(100))
    bands = (Band(1, 2, 30.0), Band(0, 1, 10.0))
    state.ask("srv", "r", wants=40, bands=bands, now=T0)
    entry = state.resources["r"].clients["srv"]
    assert (entry.weight, entry.bands) == (3, bands)


def test_a_crowd_converges_without_over_commit_while_divisions_are_amortized() -> None:
    """500 clients arriving at once never hold more than the capacity, and within three
    rounds each holds its max-min share though the division is not re-sorted per request."""
    state = leases(fair(1000))
    wants = [float(1 + i % 7) for i in range(500)]  # 4,000 wanted in all
    expected = allocate(Kind.FAIR_SHARE, 1000, [Demand(w) for w in wants])
    got: list[float] = []
    for round_ in range(3):
        got = [
            state.ask(f"c{i}", "r", wants=w, now=T0 + round_)[0].capacity
            for i, w in enumerate(wants)
        ]
        assert state.resources["r"].sum_leases <= 1000 + 1e-6
    assert got == pytest.approx(expected)
