"""A hostile neighbour against cost budgets, through the real server on memory and Redis:
the Envoy side asks over gRPC (``anonymous`` at 127.0.0.1), the neighbour over the HTTP
port from another address (``anonymous`` at 127.0.0.2), so the two are different callers
with no certificates and no policy. Each test is one way the neighbour tried to move
another tenant's budget."""

from __future__ import annotations

import http.client
import json
import logging
from typing import Any

import pytest

from ferryman.clock import ManualClock

from helpers.server import EPOCH, ConfigDir, Server, ServerFactory, codes, descriptor
from helpers.stores import on_stores

CONFIG = """
domain: llm
descriptors:
  - key: user
    cost_budget: {budget: 1000, window: 1h, max_debt: 200, reservation_ttl: 30s}
  - key: team
    cost_budget: {budget: 1000, window: 1h, max_debt: 200, max_cost: 300}
"""
ROW = "ratelimit.service.rate_limit.llm"
#: The neighbour's own address: another caller than the gRPC client's 127.0.0.1.
NEIGHBOUR = "127.0.0.2"


def envoy(server: Server, entries: list[tuple[str, str]], cost: int) -> str:
    """What Envoy's call of ``entries`` with ``cost`` as hits_addend was answered."""
    (code,) = codes(server.ask("llm", descriptor(entries, hits=cost)))
    return code


def neighbour(server: Server, entries: list[tuple[str, str]], cost: int) -> int:
    """The HTTP status of the neighbour's POST /json of ``entries`` with ``cost``."""
    request = {
        "domain": "llm",
        "descriptors": [{"entries": [{"key": k, "value": v} for k, v in entries]}],
        "hitsAddend": cost,
    }
    conn = http.client.HTTPConnection(
        "127.0.0.1", server.service.http_port, timeout=10, source_address=(NEIGHBOUR, 0)
    )
    try:
        conn.request("POST", "/json", body=json.dumps(request).encode())
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def budget(server: Server, tenant: str) -> dict[str, Any]:
    """The tenant's budget as explain shows it (nothing counted)."""
    query = f"/explain?domain=llm&descriptor={tenant}"
    explained: dict[str, Any] = json.loads(server.http("GET", query, debug=True)[1])
    found: dict[str, Any] = explained["descriptors"][0]
    return found


def served(config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock) -> Server:
    config_dir.write("b.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 60)
    return server


@on_stores("memory", "redis")
def test_a_neighbour_cannot_settle_another_callers_reservation(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """Bob's reservation of 900 settled at cost 0 by a neighbour changes nothing (answered
    429, counted); Bob's own settlement of 900 is then charged in full."""
    server = served(config_dir, make_server, clock)
    assert envoy(server, [("user", "bob"), ("request_id", "r1")], 900) == "OK"
    assert neighbour(server, [("user", "bob"), ("request_id", "r1"), ("settle", "1")], 0) == 429
    found = budget(server, "user=bob")
    assert (found["charged"], found["reserved"]) == (0, 900)
    assert envoy(server, [("user", "bob"), ("request_id", "r1"), ("settle", "1")], 900) == "OK"
    found = budget(server, "user=bob")
    assert (found["charged"], found["reserved"], found["open_reservations"]) == (900, 0, 0)
    assert server.stat(f"{ROW}.user.foreign_settlements") == 1
    assert server.stat(f"{ROW}.user.duplicate_settlements") == 0


@on_stores("memory", "redis")
def test_a_settlement_sent_first_does_not_make_its_request_free(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """A neighbour settles r2 at cost 7 before Bob reserves it: charged in full; Bob's
    reservation of 5000 is then decided afresh against the budget and refused, one of 500
    is reserved, and its settlement charged."""
    server = served(config_dir, make_server, clock)
    assert neighbour(server, [("user", "bob"), ("request_id", "r2"), ("settle", "1")], 7) == 200
    assert envoy(server, [("user", "bob"), ("request_id", "r2")], 5000) == "OVER_LIMIT"
    assert envoy(server, [("user", "bob"), ("request_id", "r2")], 500) == "OK"
    assert budget(server, "user=bob")["reserved"] == 500
    assert envoy(server, [("user", "bob"), ("request_id", "r2"), ("settle", "1")], 500) == "OK"
    found = budget(server, "user=bob")
    assert (found["charged"], found["reserved"]) == (507, 0)


@on_stores("memory", "redis")
def test_a_neighbour_cannot_take_a_request_id_another_caller_holds(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """Bob holds r3 open: the neighbour's reservation of r3 is refused (not a repeat that
    passes free) and counted, and Bob's reservation stays his."""
    server = served(config_dir, make_server, clock)
    assert envoy(server, [("user", "bob"), ("request_id", "r3")], 100) == "OK"
    assert neighbour(server, [("user", "bob"), ("request_id", "r3")], 1) == 429
    assert server.stat(f"{ROW}.user.foreign_reservations") == 1
    assert envoy(server, [("user", "bob"), ("request_id", "r3"), ("settle", "1")], 40) == "OK"
    assert budget(server, "user=bob")["charged"] == 40


@on_stores("memory", "redis")
def test_one_settlement_charges_at_most_max_cost_and_the_excess_is_counted_and_logged(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock, caplog: Any
) -> None:
    """A settlement of 4,294,967,295 charges the team's max_cost (300), so the team still
    has room for 900; the excess is counted, and two such settlements log one line."""
    server = served(config_dir, make_server, clock)
    huge = 2**32 - 1
    settle = [("team", "ops"), ("request_id", "x1"), ("settle", "1")]
    with caplog.at_level(logging.WARNING, logger="ferryman.cost_budget"):
        assert neighbour(server, settle, huge) == 200
        assert neighbour(server, [*settle[:1], ("request_id", "x2"), settle[2]], huge) == 200
    assert budget(server, "team=ops")["charged"] == 600
    assert envoy(server, [("team", "ops"), ("request_id", "y1")], 600) == "OK"
    assert envoy(server, [("team", "ops"), ("request_id", "y2")], 1) == "OVER_LIMIT"
    assert server.stat(f"{ROW}.team.capped_settlements") == 2
    assert server.stat(f"{ROW}.team.excess_cost") == 2 * (huge - 300)
    lines = [r for r in caplog.records if "passed max_cost" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]


@on_stores("memory", "redis")
@pytest.mark.parametrize("granted", [True, False])
def test_an_identity_the_policy_allows_settles_for_others_never_below_the_estimate(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock, granted: bool
) -> None:
    """Under a policy granting ``settle_for`` on llm, the neighbour's settlement of Bob's
    900 at cost 0 is applied but charges the estimate (no refund but from Bob); without the
    grant it changes nothing."""
    grant = ", settle_for: [llm]" if granted else ""
    allow = f"{{rls: [llm], debug: true{grant}}}"
    config_dir.write("access.yaml", f"access:\n  - identities: [anonymous]\n    allow: {allow}\n")
    server = served(config_dir, make_server, clock)
    assert envoy(server, [("user", "bob"), ("request_id", "r4")], 900) == "OK"
    status = neighbour(server, [("user", "bob"), ("request_id", "r4"), ("settle", "1")], 0)
    found = budget(server, "user=bob")
    if granted:
        assert (status, found["charged"], found["reserved"]) == (200, 900, 0)
    else:
        assert (status, found["charged"], found["reserved"]) == (429, 0, 900)


@on_stores("memory")
def test_a_flood_of_budget_tenants_stays_within_the_memory_cap(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """1,200 settlements on distinct tenants, under MEMORY_MAX_KEYS=300: /status counts
    the budgets' tenants and ids in the cap and shows their share, the total stays within
    it, and Bob, who reserved his whole budget first, is still refused (his reservation was
    charged, not forgotten)."""
    config_dir.write("b.yaml", CONFIG)
    server = make_server(memory_max_keys=300)
    clock.set(EPOCH + 60)
    assert envoy(server, [("user", "bob"), ("request_id", "all")], 1200) == "OK"
    for i in range(1200):
        envoy(server, [("user", f"u{i}"), ("request_id", "r"), ("settle", "1")], 1)
    memory = json.loads(server.http("GET", "/status", debug=True)[1])["memory"]
    assert memory["max_keys"] == 300 and memory["keys"] <= 300, memory
    assert memory["kinds"]["cost_budget"] == memory["keys"] > 0, memory
    assert memory["evicted"] >= 900, memory
    assert envoy(server, [("user", "bob"), ("request_id", "one")], 1) == "OVER_LIMIT"
    assert budget(server, "user=bob")["charged"] == 1200
