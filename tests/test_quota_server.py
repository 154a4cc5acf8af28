"""quotaservice.QuotaService/Allow through the real gRPC server, on memory, Redis and Cluster."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import grpc
import pytest

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman._proto.quotaservice import quota_service_pb2

from helpers.server import ConfigDir, Server, ServerFactory, quota_events_stub, quota_stub, wait_for
from helpers.stores import on_stores

pytestmark = on_stores("memory", "redis", "cluster")

CONFIG = """
global_default_bucket: {size: 3, fill_rate: 1, max_tokens_per_request: 3}
namespaces:
  pay:
    buckets:
      card: {size: 10, fill_rate: 10, wait_timeout_millis: 1000, max_debt_millis: 2000}
      debt: {size: 10, fill_rate: 10, wait_timeout_millis: 5000, max_debt_millis: 1000}
      bulk: {size: 100, fill_rate: 10, max_tokens_per_request: 20}
  ips:
    dynamic_bucket_template:
      {size: 2, fill_rate: 1, max_idle_millis: 1000, max_tokens_per_request: 2}
    max_dynamic_buckets: 2
  shared:
    default_bucket: {size: 2, fill_rate: 1}
  bare: {}
"""

Answer = tuple[str, int, int]


class Quota:
    """Allow calls over a real channel, answers as (status name, tokens granted, wait)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.stub = quota_stub(server.channel)

    def allow(self, ns: str, bucket: str, tokens: int = 1, override: int | None = None) -> Answer:
        request = quota_service_pb2.AllowRequest(
            namespace=ns, bucket_name=bucket, tokens_requested=tokens
        )
        if override is not None:
            request.max_wait_time_override = True
            request.max_wait_millis_override = override
        r = self.stub.Allow(request, timeout=10)
        status = quota_service_pb2.AllowResponse.Status.Name(r.status)
        return status, r.tokens_granted, r.wait_millis

    def event_count(self, name: str) -> int:
        return self.server.stat(f"ratelimit.service.quota.{name}")


@pytest.fixture
def quota(config_dir: ConfigDir, make_server: ServerFactory) -> Quota:
    config_dir.write("quota.yaml", CONFIG)
    return Quota(make_server())


def test_spec_example_drains_then_borrows_then_times_out(quota: Quota) -> None:
    """From full: 10 now, 5 now (0.5 s of debt), 10 after 500 ms, then 10 refused (wait 1.5 s)."""
    assert quota.allow("pay", "card", 10) == ("OK", 10, 0)
    assert quota.allow("pay", "card", 5) == ("OK", 5, 0)
    assert quota.allow("pay", "card", 10) == ("OK", 10, 500)
    assert quota.allow("pay", "card", 10) == ("REJECTED_TIMEOUT", 0, 0)
    assert quota.event_count("tokens_served") == 2
    assert quota.event_count("tokens_served_with_wait") == 1
    assert quota.event_count("timeout") == 1


def test_bucket_refills_at_fill_rate(quota: Quota) -> None:
    """Half a second after draining, 5 tokens are back; the one after them is 100 ms away."""
    assert quota.allow("pay", "card", 10) == ("OK", 10, 0)
    quota.server.clock.advance(0.5)
    assert quota.allow("pay", "card", 5) == ("OK", 5, 0)
    assert quota.allow("pay", "card", 1) == ("OK", 1, 0)
    assert quota.allow("pay", "card", 1) == ("OK", 1, 100)
    quota.server.clock.advance(10)
    assert quota.allow("pay", "card", 10) == ("OK", 10, 0)


def test_debt_bound_refuses_within_the_wait(quota: Quota) -> None:
    """A take whose wait is allowed is still refused when it would push debt past the bound."""
    assert quota.allow("pay", "debt", 10) == ("OK", 10, 0)
    assert quota.allow("pay", "debt", 10) == ("OK", 10, 0)  # 1 s of debt: the bound
    assert quota.allow("pay", "debt", 1) == ("REJECTED_TIMEOUT", 0, 0)
    quota.server.clock.advance(0.2)
    assert quota.allow("pay", "debt", 1) == ("OK", 1, 800)


def test_wait_override_lowers_but_never_raises(quota: Quota) -> None:
    """The request's max wait applies below the bucket's and is ignored above it."""
    quota.allow("pay", "card", 10)
    quota.allow("pay", "card", 5)
    assert quota.allow("pay", "card", 10, override=100) == ("REJECTED_TIMEOUT", 0, 0)
    assert quota.allow("pay", "card", 10, override=500) == ("OK", 10, 500)
    assert quota.allow("pay", "card", 1, override=60_000) == ("REJECTED_TIMEOUT", 0, 0)


def test_max_tokens_per_request(quota: Quota) -> None:
    """Above max_tokens_per_request (default: fill_rate) is refused; 0 tokens means 1."""
    assert quota.allow("pay", "bulk", 21) == ("REJECTED_TOO_MANY_TOKENS_REQUESTED", 0, 0)
    assert quota.allow("pay", "bulk", 20) == ("OK", 20, 0)
    assert quota.allow("pay", "card", 11) == ("REJECTED_TOO_MANY_TOKENS_REQUESTED", 0, 0)
    assert quota.allow("pay", "card", 0) == ("OK", 1, 0)
    assert quota.event_count("too_many_tokens_requested") == 2


def test_bad_input_is_refused_and_takes_nothing(quota: Quota) -> None:
    """Malformed names, negative tokens and a negative override: INVALID_REQUEST, nothing taken."""
    bad = [
        ("pay", "ca-rd", 1, None),
        ("p ay", "card", 1, None),
        ("", "card", 1, None),
        ("pay", "", 1, None),
        ("pay", "cärd", 1, None),
        ("pay", "card", -3, None),
        ("pay", "card", 5, -1),
    ]
    for ns, bucket, tokens, override in bad:
        assert quota.allow(ns, bucket, tokens, override) == ("REJECTED_INVALID_REQUEST", 0, 0)
    # The bucket is still full: 10 now, and the next token still free now.
    assert quota.allow("pay", "card", 10) == ("OK", 10, 0)
    assert quota.allow("pay", "card", 1) == ("OK", 1, 0)
    assert quota.event_count("tokens_served") == 2


def test_lookup_falls_through_to_the_shared_global_default(quota: Quota) -> None:
    """Unknown bucket of a known namespace, unknown namespace, empty namespace: one global
    default bucket (3 tokens, 1/s) serves them all."""
    assert quota.allow("pay", "unknown", 2) == ("OK", 2, 0)
    assert quota.allow("nowhere", "x", 1) == ("OK", 1, 0)
    assert quota.allow("bare", "y", 1) == ("OK", 1, 0)  # 1 s of debt now
    assert quota.allow("nowhere", "z", 1) == ("OK", 1, 1000)
    assert quota.allow("pay", "unknown", 1) == ("REJECTED_TIMEOUT", 0, 0)
    # The named bucket is not the global one.
    assert quota.allow("pay", "card", 10) == ("OK", 10, 0)


def test_namespace_default_bucket_is_shared_by_its_names(quota: Quota) -> None:
    """Every unknown name of a namespace with a default bucket takes from that one bucket."""
    assert quota.allow("shared", "a", 1) == ("OK", 1, 0)
    assert quota.allow("shared", "b", 1) == ("OK", 1, 0)
    assert quota.allow("shared", "c", 1) == ("OK", 1, 0)
    assert quota.allow("shared", "d", 1) == ("OK", 1, 1000)
    assert quota.event_count("bucket_created") == 0


def test_dynamic_buckets_are_limited_and_idle_ones_removed(quota: Quota) -> None:
    """Two dynamic buckets at most; once idle past max_idle_millis they go, with events."""
    assert quota.allow("ips", "a", 1) == ("OK", 1, 0)
    assert quota.allow("ips", "b", 1) == ("OK", 1, 0)
    assert quota.allow("ips", "c", 1) == ("REJECTED_TOO_MANY_BUCKETS", 0, 0)
    # Buckets are separate: a still has a token.
    assert quota.allow("ips", "a", 1) == ("OK", 1, 0)
    assert quota.event_count("bucket_created") == 2
    assert quota.event_count("too_many_buckets") == 1
    quota.server.clock.advance(1.001)
    assert quota.allow("ips", "b", 1) == ("OK", 1, 0)  # b idle 1001 ms: removed, made again
    assert quota.event_count("bucket_removed") == 2
    assert quota.allow("ips", "c", 2) == ("OK", 2, 0)
    assert quota.event_count("bucket_created") == 4
    assert quota.allow("ips", "d", 1) == ("REJECTED_TOO_MANY_BUCKETS", 0, 0)


def test_bucket_refused_for_too_many_tokens_still_counts(quota: Quota) -> None:
    """A dynamic bucket made by a request refused for too many tokens counts against the limit."""
    assert quota.allow("ips", "a", 5) == ("REJECTED_TOO_MANY_TOKENS_REQUESTED", 0, 0)
    assert quota.allow("ips", "b", 1) == ("OK", 1, 0)
    assert quota.allow("ips", "c", 1) == ("REJECTED_TOO_MANY_BUCKETS", 0, 0)


def test_no_bucket_without_global_default(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With no global default bucket, an unknown bucket is REJECTED_NO_BUCKET (a bucket miss)."""
    config_dir.write("quota.yaml", "namespaces:\n  pay:\n    buckets:\n      card: {}\n")
    quota = Quota(make_server())
    assert quota.allow("pay", "cash") == ("REJECTED_NO_BUCKET", 0, 0)
    assert quota.allow("other", "card") == ("REJECTED_NO_BUCKET", 0, 0)
    assert quota.allow("pay", "card", 50) == ("OK", 50, 0)
    assert quota.event_count("bucket_miss") == 2


def test_reload_keeps_unchanged_buckets_state(config_dir: ConfigDir, quota: Quota) -> None:
    """A reload that adds a bucket leaves the others' tokens and debt as they were."""
    assert quota.allow("pay", "card", 10) == ("OK", 10, 0)
    assert quota.allow("pay", "card", 5) == ("OK", 5, 0)
    config_dir.write("quota.yaml", CONFIG + "  extra:\n    default_bucket: {size: 1}\n")
    holder = quota.server.service.holder
    wait_for("the reload", lambda: holder.version == 2, timeout=10)
    assert quota.allow("pay", "card", 10) == ("OK", 10, 500)


@pytest.fixture
def events(quota: Quota) -> Iterator[list[limiter_pb2.QuotaEvent]]:
    """Every event of namespace ips, streamed by QuotaEvents/Watch into a list."""
    stub = quota_events_stub(quota.server.channel)
    call = stub.Watch(limiter_pb2.WatchQuotaEventsRequest(namespace="ips"))
    received: list[limiter_pb2.QuotaEvent] = []

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):
            received.extend(call)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    hub = quota.server.service.quota_events
    wait_for("the subscription", lambda: hub.subscribers == 1)
    yield received
    call.cancel()
    reader.join(5)


def test_events_are_streamed_to_subscribers(
    quota: Quota, events: list[limiter_pb2.QuotaEvent]
) -> None:
    """Watch streams created, served, refused and removed events of its namespace only."""
    Kind = limiter_pb2.QuotaEvent.Kind
    quota.allow("pay", "card", 1)  # another namespace: not streamed
    quota.allow("ips", "a", 2)
    quota.allow("ips", "a", 1)
    quota.allow("ips", "a", 1)
    quota.allow("ips", "b", 9)
    quota.server.clock.advance(2)
    quota.allow("ips", "c", 1)
    wait_for("ten events", lambda: len(events) >= 10)
    got = [(Kind.Name(e.kind), e.bucket, e.tokens, e.wait_millis) for e in events]
    assert got == [
        ("BUCKET_CREATED", "a", 0, 0),
        ("TOKENS_SERVED", "a", 2, 0),
        ("TOKENS_SERVED", "a", 1, 0),
        ("TOKENS_SERVED_WITH_WAIT", "a", 1, 1000),
        ("BUCKET_CREATED", "b", 0, 0),
        ("TOO_MANY_TOKENS_REQUESTED", "b", 9, 0),
        ("BUCKET_REMOVED", "a", 0, 0),
        ("BUCKET_REMOVED", "b", 0, 0),
        ("BUCKET_CREATED", "c", 0, 0),
        ("TOKENS_SERVED", "c", 1, 0),
    ]
    assert all(e.namespace == "ips" and e.dynamic for e in events)


def test_stopping_the_server_ends_event_streams_cleanly(quota: Quota) -> None:
    """A Watch stream open at shutdown ends with OK instead of holding the grace period."""
    # A channel of its own: Server.stop closes the shared one first.
    channel = grpc.insecure_channel(f"127.0.0.1:{quota.server.service.grpc_port}")
    call = quota_events_stub(channel).Watch(limiter_pb2.WatchQuotaEventsRequest())
    hub = quota.server.service.quota_events
    wait_for("the subscription", lambda: hub.subscribers == 1)
    quota.allow("pay", "card")
    first = next(call)
    assert limiter_pb2.QuotaEvent.Kind.Name(first.kind) == "TOKENS_SERVED"
    stopping = threading.Thread(target=quota.server.stop, kwargs={"grace": 60})
    stopping.start()
    assert list(call) == []
    assert call.code() == grpc.StatusCode.OK
    stopping.join(60)
    assert not stopping.is_alive()
    channel.close()
