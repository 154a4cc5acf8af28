"""A short soak of two replicas on real Redis (tests/helpers/soak.py): ShouldRateLimit on
every kind, held copies, leases, config reloads and API writes, a rolling restart and a
Redis restart; only what is not timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.soak import Plan, Soak, leaked

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PLAN = Plan(
    seconds=120,
    rate=30,
    holders=3,
    quota=False,
    rlqs=False,
    rolling_at=25,
    redis_restarts=(75,),
    warmup=10,
)


@pytest.mark.timeout(360)
def test_a_short_soak_loses_no_hit_and_leaks_nothing(tmp_path: Path) -> None:
    """Through restarts of both replicas and of Redis, Redis counts each OK answer's hit
    once (per 10 s period away from the Redis restart), no copy, session or lease is left
    once every client let go, and each replica's descriptors and tasks end within 8 of
    their values after its warm-up."""
    soak = Soak(tmp_path, PLAN, log=lambda _: None)
    try:
        outcome = soak.run()
    finally:
        soak.close()
    assert sum(f.name == "redis restart" for f in outcome.faults) == 1
    assert sum(f.name.startswith("replica") for f in outcome.faults) == 2
    lost, doubled, skipped = outcome.accounting()
    assert sum(outcome.ok.values()) > 500
    assert 0 < len(skipped) < len(outcome.stored) // 2
    periods = {p: (outcome.ok[p], outcome.unknown[p], outcome.stored.get(p)) for p in outcome.ok}
    assert (lost, doubled) == ([], []), periods
    assert outcome.holds > 100
    assert outcome.leases_before > 0
    assert (outcome.copies_held, outcome.sessions, outcome.leases_out) == (0, 0, 0.0)
    assert len(outcome.finals) == 2
    assert leaked(outcome) == []
