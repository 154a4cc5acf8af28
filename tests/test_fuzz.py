"""Every method of every gRPC API, sent random and mutated messages: no call fails inside the
server (UNKNOWN, INTERNAL), and no traceback is logged. The long run is
``tests/bench/bench_fuzz.py``."""

from __future__ import annotations

import logging

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.fuzz import FAILURES, Target, mutated, send, targets
from helpers.holds import JOBS_CONFIG
from helpers.server import MIXED, ConfigDir, Server, ServerFactory

TARGETS = targets()
QUOTA = """
namespaces:
  users:
    dynamic_bucket_template: {size: 10, fill_rate: 1}
    max_dynamic_buckets: 5
"""


@pytest.fixture
def served(make_server: ServerFactory, config_dir: ConfigDir) -> Server:
    config_dir.write("mixed.yaml", MIXED)
    config_dir.write("jobs.yaml", JOBS_CONFIG)
    config_dir.write("quota.yaml", QUOTA)
    return make_server(doorman_minimum_refresh_interval=0)


def test_every_method_of_every_api_is_fuzzed() -> None:
    """The targets cover each registered method, streams included."""
    paths = {t.path for t in TARGETS}
    assert "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" in paths
    assert "/ferryman.v1.Limiter/Session" in paths and "/doorman.Capacity/GetCapacity" in paths
    assert any(t.client_streams for t in TARGETS) and any(t.server_streams for t in TARGETS)


# Hypothesis reports a falsifying example through code that touches a deprecated
# mypy_extensions name: without this, a failure would surface as an INTERNALERROR.
@pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.sampled_from(TARGETS),
    st.one_of(st.binary(max_size=64), st.randoms(use_true_random=False)),
)
def test_random_and_mutated_messages_never_fail_inside_the_server(
    served: Server, caplog: pytest.LogCaptureFixture, target: Target, payload: object
) -> None:
    """No random or mutated request is answered UNKNOWN or INTERNAL, or logs a traceback."""
    data = payload if isinstance(payload, bytes) else mutated(target.seed, payload)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR):
        code = send(served.channel, target, data)
    assert code not in FAILURES, (target.path, data, code)
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, tracebacks[0].getMessage()
    assert isinstance(code, grpc.StatusCode)


def test_a_proto2_string_that_is_not_utf8_is_invalid_argument(served: Server) -> None:
    """doorman's proto2 strings hand invalid UTF-8 over as bytes: a ReleaseCapacity and a
    GetCapacity naming such an id are INVALID_ARGUMENT, not a traceback."""
    release = Target("/doorman.Capacity/ReleaseCapacity", False, False, b"")
    get = Target("/doorman.Capacity/GetCapacity", False, False, b"")
    assert send(served.channel, release, b"\n\x01x\x12\x01\xc5") == grpc.StatusCode.INVALID_ARGUMENT
    bad_client = b"\n\x01\xc5\x12\x0b\n\x01x\x10\x01!\x00\x00\x00\x00\x00\x00\xf0?"
    assert send(served.channel, get, bad_client) == grpc.StatusCode.INVALID_ARGUMENT
