"""Metrics for ferryman's own features on /metrics: bursts and the tier hits ended in,
sessions, held copies per node and group, and transfers that lapse."""

from __future__ import annotations

from typing import Any

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.clock import ManualClock

from helpers.holds import JOBS_CONFIG, Holder
from helpers.metrics import FEATURES_CONFIG, PROMETHEUS, samples, scrape
from helpers.server import ConfigDir, Server, ServerFactory, codes, limiter_stub, wait_for
from helpers.stores import on_stores

pytestmark = on_stores("memory", "redis")


def four_hits_of_one_user(
    config_dir: ConfigDir, make_server: ServerFactory
) -> tuple[Server, Any, list[Any]]:
    """A server of FEATURES_CONFIG exporting to Prometheus, a Limiter client of it, and the
    replies to four one-copy Requests of user ``u`` (tier 1 holds two, tier 2 ten)."""
    config_dir.write("d.yaml", FEATURES_CONFIG)
    server = make_server(**PROMETHEUS)
    stub = limiter_stub(server.channel)
    request = limiter_pb2.RateRequest(
        domain="jobs", descriptor=[limiter_pb2.Entry(key="user", value="u")], copies=1
    )
    return server, stub, [stub.Request(request, timeout=5) for _ in range(4)]


def test_bursts_sessions_and_held_copies_are_exported(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A burst counts once per rule; open sessions and held copies show as gauges."""
    server, _, replies = four_hits_of_one_user(config_dir, make_server)
    assert [r.burst for r in replies] == [True, False, True, False]  # tier 0->1, then 1->2
    holder = Holder(server)
    reply = holder.stub.Reserve(
        limiter_pb2.ReserveRequest(
            domain="jobs", descriptor=[limiter_pb2.Entry(key="tenant", value="t")], copies=3
        ),
        metadata=holder.md,
        timeout=5,
    )
    assert reply.granted == 3
    values = samples(scrape(server))
    assert values['ratelimit_service_rate_limit_burst{domain="jobs",key1="user"}'] == "2"
    assert values["ratelimit_service_holds_sessions_open"] == "1"
    assert values["ratelimit_service_holds_copies_held"] == "3"
    assert values["ratelimit_service_holds_sessions_opened"] == "1"
    holder.close()


def _node(server: Server) -> str:
    return f"{server.settings.cache_key_prefix}ferryman_copies_jobs.tenant"


def test_granted_hits_are_counted_by_the_tier_they_ended_in(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Limiter/Request and ShouldRateLimit both count granted hits under the tenant's tier."""
    server, stub, replies = four_hits_of_one_user(config_dir, make_server)
    assert [r.active_tier_index for r in replies] == [1, 1, 2, 2]
    # Three hits at once from another tenant: two in tier 1, then a burst into tier 2.
    bulk = limiter_pb2.RateRequest(
        domain="jobs", descriptor=[limiter_pb2.Entry(key="user", value="v")], copies=3
    )
    assert stub.Request(bulk, timeout=5).granted == 3
    # ShouldRateLimit: a fresh tenant's first hit is in tier 1.
    assert codes(server.ask("jobs", [("user", "w")])) == ["OK"]
    # Asking for more than tier 2 allows with min_copies grants nothing: no tier hit.
    greedy = limiter_pb2.RateRequest(
        domain="jobs",
        descriptor=[limiter_pb2.Entry(key="user", value="u")],
        copies=50,
        min_copies=50,
    )
    assert stub.Request(greedy, timeout=5).granted == 0

    values = samples(scrape(server))
    prefix = 'ratelimit_service_rate_limit_tier_hits{domain="jobs",key1="user"'
    assert {k: v for k, v in values.items() if k.startswith(prefix)} == {
        f'{prefix},tier="1"}}': "3",  # u: 2, w: 1
        f'{prefix},tier="2"}}': "5",  # u: 2, v: 3 (all under the tier they ended in)
    }
    assert values['ratelimit_service_rate_limit_total_hits{domain="jobs",key1="user"}'] == "58"


def test_copies_held_per_node_and_group(config_dir: ConfigDir, make_server: ServerFactory) -> None:
    """Gauges sum what this server's sessions hold, per node and per (node, group)."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    server = make_server(**PROMETHEUS)
    first, second = Holder(server, "first"), Holder(server, "second")
    assert first.reserve("acme", 4).granted == 4  # vip, everyone
    assert second.reserve("trial-3", 2).granted == 2  # probation, everyone
    assert second.reserve("acme", 1).granted == 1
    node = _node(server)
    values = samples(scrape(server))
    assert values["ratelimit_service_holds_copies_held"] == "7"
    assert values[f'ratelimit_service_holds_copies_held_by_node{{node="{node}"}}'] == "7"
    by_group = {
        k: v for k, v in values.items() if k.startswith("ratelimit_service_holds_copies_held_by_g")
    }
    assert by_group == {
        f'ratelimit_service_holds_copies_held_by_group{{node="{node}",group="everyone"}}': "7",
        f'ratelimit_service_holds_copies_held_by_group{{node="{node}",group="probation"}}': "2",
        f'ratelimit_service_holds_copies_held_by_group{{node="{node}",group="vip"}}': "5",
    }
    first.release("acme", 4, ["vip", "everyone"])
    second.close()
    wait_for(
        "no copies held",
        lambda: samples(scrape(server))["ratelimit_service_holds_copies_held"] == "0",
    )
    values = samples(scrape(server))
    assert not [k for k in values if k.startswith("ratelimit_service_holds_copies_held_by_")]
    first.close()


def test_transfers_that_lapse_unclaimed_are_counted(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """A transfer past its ttl is expired by the next operation on the node, and counted once;
    a seized one is not."""
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    server = make_server(**PROMETHEUS)
    sender, receiver = Holder(server, "sender"), Holder(server, "receiver")
    sender.reserve("acme", 6)
    sender.transfer("acme", 2, ["vip", "everyone"], ttl=2)
    sender.transfer("acme", 1, ["vip", "everyone"], ttl=2)
    kept = sender.transfer("acme", 1, ["vip", "everyone"], ttl=60)
    values = samples(scrape(server))
    assert values["ratelimit_service_holds_transfers_staged"] == "3"
    assert values["ratelimit_service_holds_transfers_expired"] == "0"
    clock.advance(2.5)
    assert receiver.reserve("acme", 1).tenant_held == 4  # 6 - 3 expired + 1
    assert receiver.seize(kept).copies == 1
    values = samples(scrape(server))
    assert values["ratelimit_service_holds_transfers_expired"] == "2"
    assert values["ratelimit_service_holds_transfers_seized"] == "1"
    clock.advance(3)  # past the first ttls again, within the lease: nothing more to expire
    receiver.reserve("acme", 1)
    assert samples(scrape(server))["ratelimit_service_holds_transfers_expired"] == "2"
    sender.close()
    receiver.close()
