"""Burst-tier traces and policies, replayed on any store to compare what they decide."""

from __future__ import annotations

from hypothesis import strategies as st

from ferryman.algorithms.burst.model import BurstOutcome, BurstPolicy, BurstRequest, Tier

from helpers.stores import Store

# (tenant, seconds since the previous request, copies, min_copies)
Trace = list[tuple[str, float, int, int]]

trace_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 5.0]),
        st.integers(0, 6),
        st.integers(0, 6),
    ),
    max_size=40,
)


def tier_lists(windows: list[float]) -> st.SearchStrategy[list[Tier]]:
    """Up to three tiers, each window one of ``windows``."""
    return st.lists(
        st.builds(
            Tier,
            limit=st.integers(0, 4),
            window=st.sampled_from(windows),
            active=st.sampled_from([1.0, 3.0, 10.0, 30.0]),
            cooldown=st.sampled_from([0.0, 2.0, 7.0]),
            skippable=st.booleans(),
        ),
        max_size=3,
    )


COOKBOOK = {
    "simple": BurstPolicy((Tier(5, 1.0, 3600.0),)),
    "penalty": BurstPolicy((Tier(5, 1.0, 3600.0), Tier(50, 1.0, 5.0, 15.0))),
    "prison": BurstPolicy((Tier(5, 1.0, 3600.0), Tier(1, 15.0, 15.0))),
    "batch": BurstPolicy((Tier(5000, 300.0, 300.0, 86100.0),)),
    "hard_global": BurstPolicy((Tier(100, 1.0, 100.0),), hard_limit=3, global_limit=4),
}


def replay_burst(store: Store, policy: BurstPolicy, trace: Trace, node: str) -> list[BurstOutcome]:
    """Every request of ``trace`` on ``node`` of ``store``, at the trace's times; the outcomes."""

    async def main() -> list[BurstOutcome]:
        out = []
        now = 1_700_000_000.0
        for tenant, step, copies, min_copies in trace:
            now += step
            request = BurstRequest(node, tenant, policy, copies, min(min_copies, copies))
            out.append(await store.backend.store("burst_tiers").decide(request, now))
        return out

    return store.run(main())
