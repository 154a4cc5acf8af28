"""Bounded under hostile input: every request limit answers INVALID_ARGUMENT naming the
field and counts nothing; counters near 2^32 and 2^63 do not overflow; the memory
backend's counters stay under MEMORY_MAX_KEYS, evicting only what is safe to forget."""

from __future__ import annotations

import json

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import duration_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.algorithms.fixed_window.model import CounterOp
from ferryman.backends.memory import MemoryBackend
from ferryman.engine.validate import (
    MAX_DESCRIPTORS,
    MAX_ENTRIES,
    MAX_HITS,
    MAX_KEY,
    MAX_MESSAGE_BYTES,
    MAX_NAME,
    MAX_NAMES,
    MAX_TRANSFER_ID,
    MAX_VALUE,
)

from helpers.server import (
    EPOCH,
    ConfigDir,
    Server,
    ServerFactory,
    codes,
    descriptor,
    limiter_stub,
    overall,
)
from helpers.stores import on_stores

CONFIG = """
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 4294967295}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: seats
    copies: {limit: 10, hold_ttl: 30s}
"""

Req = rls_pb2.RateLimitRequest


def hits_counted(server: Server) -> int:
    return sum(v for k, v in server.stats.items() if k.endswith(".total_hits"))


def many(n: int) -> list[tuple[str, str]]:
    return [(f"k{i}", "v") for i in range(n)]


def with_hits(hits: int) -> Req:
    return Req(domain="d", descriptors=[descriptor([("k", "v")], hits=hits)])


TOO_BIG = [
    pytest.param(
        Req(domain="x" * (MAX_KEY + 1), descriptors=[descriptor([("k", "v")])]),
        "domain",
        id="domain",
    ),
    pytest.param(
        Req(domain="d", descriptors=[descriptor([("k", "v")])] * (MAX_DESCRIPTORS + 1)),
        "descriptors",
        id="descriptors",
    ),
    pytest.param(
        Req(domain="d", descriptors=[descriptor(many(MAX_ENTRIES + 1))]),
        "descriptors[0].entries",
        id="entries",
    ),
    pytest.param(
        Req(domain="d", descriptors=[descriptor([("k", "v"), ("x" * (MAX_KEY + 1), "v")])]),
        "descriptors[0].entries[1].key",
        id="key",
    ),
    pytest.param(
        Req(domain="d", descriptors=[descriptor([("k", "v" * (MAX_VALUE + 1))])]),
        "descriptors[0].entries[0].value",
        id="value",
    ),
    pytest.param(with_hits(MAX_HITS + 1), "descriptors[0].hits_addend", id="hits_addend"),
    pytest.param(with_hits(2**64 - 1), "descriptors[0].hits_addend", id="hits_addend-2^64"),
]


@pytest.mark.parametrize(("request_", "field"), TOO_BIG)
def test_past_a_limit_is_invalid_argument_naming_the_field_and_nothing_counted(
    config_dir: ConfigDir, make_server: ServerFactory, request_: Req, field: str
) -> None:
    """Each limit: INVALID_ARGUMENT with the field named, no hit counted, serving goes on."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    with pytest.raises(grpc.RpcError) as info:
        server.stub.ShouldRateLimit(request_, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(f"{field}:")
    assert hits_counted(server) == 0
    assert codes(server.ask("d", [("k", "v")])) == ["OK"]


def test_at_every_limit_the_request_is_served(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """The largest request within every limit is answered."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    entries = [("k", "v" * MAX_VALUE), *[(f"{i:0{MAX_KEY}d}", "v") for i in range(MAX_ENTRIES - 1)]]
    request = Req(domain="d", descriptors=[descriptor(entries)] * MAX_DESCRIPTORS, hits_addend=1)
    assert len(server.stub.ShouldRateLimit(request, timeout=10).statuses) == MAX_DESCRIPTORS
    assert overall(server.ask("d", descriptor([("big", "v")], hits=MAX_HITS))) == "OK"


def test_a_message_over_the_size_cap_is_refused_before_decoding(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """A request over MAX_MESSAGE_BYTES gets RESOURCE_EXHAUSTED and counts nothing."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    request = Req(domain="d", descriptors=[descriptor([("k", "v" * MAX_MESSAGE_BYTES)])])
    with pytest.raises(grpc.RpcError) as info:
        server.stub.ShouldRateLimit(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert hits_counted(server) == 0
    assert codes(server.ask("d", [("k", "v")])) == ["OK"]


def test_a_descriptor_without_entries_is_ok_with_no_limit(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """As the reference: an empty descriptor matches nothing and is answered OK."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    response = server.ask("d", [], [("ip", "1")], [("ip", "1")], [("ip", "1")])
    assert codes(response) == ["OK", "OK", "OK", "OVER_LIMIT"]
    assert not response.statuses[0].HasField("current_limit")
    assert codes(server.ask("unknown", [])) == ["OK"]


def test_the_json_endpoint_applies_the_same_limits(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """POST /json with a value over the limit: 400 naming the field, nothing counted."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    body = {"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v" * 5000}]}]}
    status, text = server.http("POST", "/json", json.dumps(body).encode())
    assert status == 400 and b"descriptors[0].entries[0].value" in text
    assert hits_counted(server) == 0


def test_names_in_ferrymans_own_api_are_bounded(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Request, Reserve, Release, Transfer, Seize and Session bound their names and
    descriptors; each refusal names the field."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    stub = limiter_stub(server.channel)
    E = limiter_pb2.Entry
    long_value = [E(key="seats", value="v" * (MAX_VALUE + 1))]
    seat = [E(key="seats", value="s")]
    R = limiter_pb2
    ttl = duration_pb2.Duration(seconds=5)
    too_long = "g" * (MAX_NAME + 1)
    calls = [
        (stub.Request, R.RateRequest(domain="d", descriptor=long_value), "descriptor[0].value"),
        (stub.Reserve, R.ReserveRequest(domain="d" * 300, descriptor=seat), "domain"),
        (
            stub.Release,
            R.ReleaseRequest(domain="d", descriptor=seat, copies=1, groups=[too_long]),
            "groups[0]",
        ),
        (
            stub.Transfer,
            R.TransferRequest(
                domain="d", descriptor=seat, copies=1, groups=["g"] * (MAX_NAMES + 1), ttl=ttl
            ),
            "groups",
        ),
        (stub.Seize, R.SeizeRequest(transfer_id="t" * (MAX_TRANSFER_ID + 1)), "transfer_id"),
    ]
    for method, request, field in calls:
        with pytest.raises(grpc.RpcError) as info:
            method(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert (info.value.details() or "").startswith(f"{field}:"), info.value.details()
    open_ = limiter_pb2.SessionRequest(
        open=limiter_pb2.SessionRequest.Open(client_name="c" * (MAX_NAME + 1))
    )
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Session(iter([open_]), timeout=5))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "open.client_name" in (info.value.details() or "")


@on_stores("memory", "redis")
@pytest.mark.parametrize("start", [2**32 - 2, 2**63 - 5], ids=["2^32", "2^63"])
def test_counters_near_the_integer_limits_do_not_overflow(
    config_dir: ConfigDir,
    make_server: ServerFactory,
    store_kind: str,
    start: int,
    request: pytest.FixtureRequest,
) -> None:
    """A counter near 2^32 or 2^63 given the largest hits is over the limit, with nothing
    wrapped around and no backend error."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server()
    key = f"{server.settings.cache_key_prefix}d_big_v_{int(EPOCH)}"
    if store_kind == "memory":
        backend = server.service.backend
        assert isinstance(backend, MemoryBackend)
        backend.store("fixed_window").apply_now(
            [CounterOp(key, start, 2**64, int(EPOCH) + 60, 60)], stop_when_over=False
        )
    else:
        request.getfixturevalue("redis_server").client().set(key, start, ex=60)
    for _ in range(2):
        response = server.ask("d", descriptor([("big", "v")], hits=MAX_HITS))
        assert codes(response) == ["OVER_LIMIT"]
        assert response.statuses[0].limit_remaining == 0
    assert server.stat("ratelimit.service.rate_limit.d.big.total_hits") == 2 * MAX_HITS


def test_the_memory_backend_keeps_at_most_max_keys_counters(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Many distinct values on a wildcard rule keep the counters under MEMORY_MAX_KEYS;
    evictions are counted; a counter at its limit is never evicted, so flooding cannot
    reset it; with only such counters left a new one is refused (over the limit)."""
    config_dir.write("d.yaml", CONFIG)
    server = make_server(memory_max_keys=64)
    backend = server.service.backend
    assert isinstance(backend, MemoryBackend)
    assert codes(server.ask("d", [("ip", "attacker")], [("ip", "attacker")])) == ["OK", "OK"]
    for i in range(1000):
        server.ask("d", [("ip", f"10.0.{i // 256}.{i % 256}")])
        assert len(backend.store("fixed_window")) <= 64
    assert server.stat("ratelimit.service.memory.evicted_keys") >= 1000 - 64
    # Hits given back on values never counted leave no counter behind (nothing evicted).
    evicted = server.stat("ratelimit.service.memory.evicted_keys")
    for i in range(200):
        server.ask("d", descriptor([("ip", f"back{i}")], negative=True))
    assert server.stat("ratelimit.service.memory.evicted_keys") == evicted
    assert len(backend.store("fixed_window")) <= 64
    assert codes(server.ask("d", [("ip", "attacker")])) == ["OVER_LIMIT"]
    # Fill the cap with counters at their limit: nothing is safe to evict any more.
    for i in range(64):
        server.ask("d", descriptor([("ip", f"full{i}")], hits=2))
    assert codes(server.ask("d", [("ip", "newcomer")])) == ["OVER_LIMIT"]
    assert server.stat("ratelimit.service.memory.refused_keys") >= 1
    assert len(backend.store("fixed_window")) <= 64
    # Once the window ends, memory is returned and newcomers are counted again.
    server.clock.advance(60)
    assert codes(server.ask("d", [("ip", "newcomer")])) == ["OK"]
    assert len(backend.store("fixed_window")) == 1
