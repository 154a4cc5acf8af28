"""Burst tiers: one body per behaviour, on every store."""

from __future__ import annotations

import uuid

from helpers.bursts import COOKBOOK, replay_burst
from helpers.stores import Store, on_stores

pytestmark = on_stores()


def test_a_bulk_request_bursts_into_the_next_tier(store: Store) -> None:
    """Eight copies at once over a tier of five are granted by bursting into the next tier;
    on a Cluster every key of a node shares one hash tag, so the multi-key script runs."""
    node = f"n{uuid.uuid4().hex[:10]}"
    outcomes = replay_burst(store, COOKBOOK["penalty"], [("a", 0.0, 8, 8)], node)
    assert outcomes[0].granted == 8
    assert outcomes[0].burst
