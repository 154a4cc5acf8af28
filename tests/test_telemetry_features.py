"""Metrics for ferryman's own features: bursts, sessions and held copies, on /metrics."""

from __future__ import annotations

from ferryman._proto.ferryman.v1 import limiter_pb2

from helpers.holds import Holder
from helpers.metrics import FEATURES_CONFIG, PROMETHEUS, samples, scrape
from helpers.server import ConfigDir, ServerFactory, limiter_stub


def test_bursts_sessions_and_held_copies_are_exported(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A burst counts once per rule; open sessions and held copies show as gauges."""
    config_dir.write("d.yaml", FEATURES_CONFIG)
    server = make_server(**PROMETHEUS)
    stub = limiter_stub(server.channel)
    request = limiter_pb2.RateRequest(
        domain="jobs", descriptor=[limiter_pb2.Entry(key="user", value="u")], copies=1
    )
    replies = [stub.Request(request, timeout=5) for _ in range(4)]
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
