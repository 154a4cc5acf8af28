"""What ``ferryman serve`` loads: the parts its configuration uses, and no other.

A sidecar on the repository's ``descriptors/`` (memory backend, every other setting its
default) imports no Redis driver, no OpenTelemetry, no Python client, no config API, no
xDS client and none of the other protocols' servicers and generated messages; yet each API
is registered on the gRPC port at start and answers its first call. A test of which modules
load, not of time (``tests/bench/bench_start.py`` has the figures).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.doorman import doorman_pb2, doorman_pb2_grpc
from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman._proto.quotaservice import quota_service_pb2

from helpers.redis_procs import RedisProcess
from helpers.serve_process import ServeProcess
from helpers.server import descriptor, limiter_stub, quota_stub, rls_stub, wait_for

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve().parent / "helpers" / "serve_modules.py"

# What a sidecar on descriptors only does not load (a name, or a package and all under it).
NOT_LOADED = (
    "redis",
    "opentelemetry",
    "ferryman.client",
    "ferryman.backends.redis",
    "ferryman.connections.redis",
    "ferryman.apis.config_api",
    "ferryman.config.store",
    "ferryman.config.xds",
    "envoy.service.discovery",
    "ferryman.apis.leased",
    # The other protocols' servicers and generated messages: imported by their first call.
    "ferryman.apis.limiter",
    "ferryman.apis.quota",
    "ferryman.apis.quota_events",
    "ferryman.apis.capacity",
    "ferryman.apis.rlqs_grpc",
    "ferryman._proto.ferryman.v1.limiter_pb2",
    "ferryman._proto.quotaservice.quota_service_pb2",
    "ferryman._proto.doorman.doorman_pb2",
    "envoy.service.rate_limit_quota.v3.rlqs_pb2",
)


def _under(loaded: list[str], name: str) -> list[str]:
    return [m for m in loaded if m == name or m.startswith(name + ".")]


def _serve(tmp_path: Path, env: dict[str, str]) -> tuple[ServeProcess, list[str]]:
    out = tmp_path / "modules.json"
    proc = ServeProcess(REPO, env, defaults=False, program=(str(SCRIPT), str(out)))
    try:
        proc.wait_serving()
        wait_for("the loaded modules' list", out.exists)
    except BaseException:
        proc.kill()
        raise
    loaded: list[str] = json.loads(out.read_text(encoding="utf-8"))
    return proc, loaded


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[tuple[ServeProcess, list[str]]]:
    # The service's own defaults, but no StatsD packets sent to whatever listens on 8125.
    proc, loaded = _serve(tmp_path, {"USE_STATSD": "false"})
    try:
        yield proc, loaded
    finally:
        proc.kill()


def test_a_sidecar_on_descriptors_loads_no_optional_part(
    sidecar: tuple[ServeProcess, list[str]],
) -> None:
    """Serving descriptors/ on the memory backend, no optional part nor other protocol's
    messages is imported, while what it serves with is."""
    _, loaded = sidecar
    assert {m: _under(loaded, m) for m in NOT_LOADED if _under(loaded, m)} == {}
    for needed in ("grpc", "envoy.service.ratelimit.v3.rls_pb2", "ferryman.backends.memory"):
        assert needed in loaded


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    """The status a call ended with (OK when it returned)."""
    try:
        call()
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return code
    return grpc.StatusCode.OK


def test_every_api_answers_its_first_call(sidecar: tuple[ServeProcess, list[str]]) -> None:
    """Each protocol's methods are registered at start: its first call is answered by its
    servicer (the Envoy RLS, ferryman.v1, Doorman, the quota service and RLQS), none is
    UNIMPLEMENTED."""
    proc, _ = sidecar
    with grpc.insecure_channel(f"127.0.0.1:{proc.grpc_port}") as channel:
        rls = rls_stub(channel).ShouldRateLimit(
            rls_pb2.RateLimitRequest(
                domain="edge-proxy", descriptors=[descriptor([("remote_address", "10.0.0.1")])]
            ),
            timeout=10,
        )
        assert rls.overall_code == rls_pb2.RateLimitResponse.OK
        rate = limiter_stub(channel).Request(
            limiter_pb2.RateRequest(
                domain="cookbook", descriptor=[limiter_pb2.Entry(key="simple_user", value="a")]
            ),
            timeout=10,
        )
        assert rate.granted == 1
        capacity = doorman_pb2_grpc.CapacityStub(channel)  # type: ignore[no-untyped-call]
        found = capacity.Discovery(doorman_pb2.DiscoveryRequest(), timeout=10)
        assert found.is_master
        allow = quota_stub(channel).Allow(
            quota_service_pb2.AllowRequest(namespace="none", bucket_name="none"), timeout=10
        )
        assert allow.status != quota_service_pb2.AllowResponse.OK  # no such bucket: refused
        rlqs = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)  # type: ignore[no-untyped-call]
        stream = rlqs.StreamRateLimitQuotas(
            iter([rlqs_pb2.RateLimitQuotaUsageReports(domain="edge-proxy")]), timeout=3
        )
        code = _code(lambda: list(stream))
        assert code not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE), code


def test_redis_is_loaded_when_the_backend_is_redis(
    tmp_path: Path, redis_server: RedisProcess
) -> None:
    """With BACKEND_TYPE=redis the Redis driver and ferryman's Redis backend are loaded."""
    env = {
        "USE_STATSD": "false",
        "BACKEND_TYPE": "redis",
        "REDIS_URL": f"127.0.0.1:{redis_server.port}",
        "REDIS_SOCKET_TYPE": "tcp",
    }
    proc, loaded = _serve(tmp_path, env)
    try:
        assert "redis.asyncio" in loaded
        assert "ferryman.backends.redis" in loaded
    finally:
        proc.kill()


def test_an_undecodable_first_call_is_refused_by_the_guard(
    sidecar: tuple[ServeProcess, list[str]],
) -> None:
    """The first call to a protocol loaded on first call goes through the same guard: bytes
    that do not decode are answered INVALID_ARGUMENT, not UNKNOWN."""
    proc, _ = sidecar
    with grpc.insecure_channel(f"127.0.0.1:{proc.grpc_port}") as channel:
        raw: Callable[..., bytes] = channel.unary_unary("/ferryman.v1.Limiter/Request", None, None)
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\x0a\xff\xff\xff", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
