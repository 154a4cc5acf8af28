"""CONFIG_TYPE=GRPC_XDS_SOTW with resources as Envoy Gateway serves them: one RateLimitConfig
per listener in each response (named, route nodes without a limit above each rule, units up
to MONTH and YEAR), then a policy removed and one changed; a real `ferryman serve` answers
as the reference would before and after each change."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2

from helpers.serve_process import ServeProcess
from helpers.server import descriptor, overall, rls_stub, wait_for
from helpers.xds_management import ManagementServer

Pb = rls_conf_pb2
ROUTE = "httproute/default/backend/rule/0/match/0/www_example_com"
API = "httproute/default/api/rule/0/match/0/api_example_com"
GRPC = "grpcroute/tenants/billing/rule/0/match/-1/billing"


def _rule(
    key: str, value: str, per: int, unit: int, *, shadow_mode: bool = False
) -> Pb.RateLimitDescriptor:
    policy = Pb.RateLimitPolicy(unit=unit, requests_per_unit=per)  # type: ignore[arg-type]
    return Pb.RateLimitDescriptor(key=key, value=value, rate_limit=policy, shadow_mode=shadow_mode)


def _listener(name: str, route: str, *rules: Pb.RateLimitDescriptor) -> Pb.RateLimitConfig:
    """One listener's config: the route node (no limit of its own) above its rules."""
    node = Pb.RateLimitDescriptor(key=route, value=route, descriptors=list(rules))
    return Pb.RateLimitConfig(name=name, domain=name, descriptors=[node])


HTTP_V1 = _listener(
    "default/eg/http", ROUTE, _rule("rule-0-match-0", "rule-0-match-0", 2, Pb.MONTH)
)
HTTPS = _listener(
    "default/eg/https",
    API,
    Pb.RateLimitDescriptor(
        key="masked_remote_address",
        value="10.0.0.0/8",
        descriptors=[_rule("remote_address", "", 1, Pb.YEAR)],
    ),
)
GRPC_V1 = _listener(
    "tenants/gw/grpc", GRPC, _rule("rule-0-match-0", "rule-0-match-0", 1, Pb.HOUR, shadow_mode=True)
)
# The changed policy: the HTTP route's rule now allows 4 a day under a new match.
HTTP_V2 = _listener("default/eg/http", ROUTE, _rule("rule-0-match-1", "rule-0-match-1", 4, Pb.DAY))


@pytest.fixture
def management() -> Iterator[ManagementServer]:
    server = ManagementServer().start()
    yield server
    server.close()


def _asks(
    process: ServeProcess, domain: str, entries: list[tuple[str, str]], count: int
) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
        stub = rls_stub(channel)
        request = rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor(entries)])
        return [overall(stub.ShouldRateLimit(request, timeout=5)) for _ in range(count)]


def test_generated_resources_are_served_then_one_removed_and_one_changed(
    tmp_path: Path, management: ManagementServer
) -> None:
    """Several Envoy Gateway-shaped resources per response apply; a removed one stops
    limiting, a changed one limits as it now says."""
    env = {
        "CONFIG_TYPE": "GRPC_XDS_SOTW",
        "CONFIG_GRPC_XDS_SERVER_URL": f"127.0.0.1:{management.port}",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "200ms",
    }
    process = ServeProcess(tmp_path, env)
    try:
        management.set("v1", [HTTP_V1, HTTPS, GRPC_V1])
        process.wait_serving()
        assert management.acks() == [("v1", "1")]
        http = [(ROUTE, ROUTE), ("rule-0-match-0", "rule-0-match-0")]
        https = [(API, API), ("masked_remote_address", "10.0.0.0/8"), ("remote_address", "a")]
        grpc_rule = [(GRPC, GRPC), ("rule-0-match-0", "rule-0-match-0")]
        assert _asks(process, "default/eg/http", [(ROUTE, ROUTE)], 3) == ["OK"] * 3
        assert _asks(process, "default/eg/http", http, 3) == ["OK", "OK", "OVER_LIMIT"]
        assert _asks(process, "default/eg/https", https, 2) == ["OK", "OVER_LIMIT"]
        assert _asks(process, "tenants/gw/grpc", grpc_rule, 2) == ["OK", "OK"]  # shadow mode

        # The HTTPS policy is removed, the HTTP one changed, the gRPC one left as it was.
        management.set("v2", [HTTP_V2, GRPC_V1])
        wait_for("ACK of v2", lambda: ("v2", "2") in management.acks())
        assert management.nacks() == []
        assert _asks(process, "default/eg/https", https, 2) == ["OK", "OK"]
        assert _asks(process, "default/eg/http", http, 2) == ["OK", "OK"]
        changed = [(ROUTE, ROUTE), ("rule-0-match-1", "rule-0-match-1")]
        assert _asks(process, "default/eg/http", changed, 5) == ["OK"] * 4 + ["OVER_LIMIT"]
        assert "config warning" not in process.text

        # A policy the reference would refuse too (an unlimited rule with a unit) is NACKed
        # naming the resource, the path and what the reference does; v2 stays in force.
        unlimited = Pb.RateLimitPolicy(unit=Pb.SECOND, unlimited=True)
        bad = _listener(
            "default/eg/admin",
            ROUTE,
            Pb.RateLimitDescriptor(key="rule-0-match-0", value="x", rate_limit=unlimited),
        )
        management.set("v3", [HTTP_V2, GRPC_V1, bad])
        wait_for("NACK of v3", management.nacks)
        (nack,) = management.nacks()
        assert nack.version_info == "v2"
        assert nack.error_detail.message == (
            "xds:default/eg/admin: descriptors[0].descriptors[0].rate_limit.unit: "
            "'unlimited: true' cannot have a unit (the reference refuses it too)"
        )
        assert _asks(process, "default/eg/http", changed, 1) == ["OVER_LIMIT"]
        assert process.stop() == 0
    finally:
        process.kill()
