"""The RLS edge writes its responses without a message object (``encode_decision``): the bytes
must be exactly those the protobuf encoder writes for the same decision, for every shape of
answer (codes, limits with and without names, remaining counts and resets of every size,
headers and metadata), and a server's answers must decode to what the decision says."""

from __future__ import annotations

import pytest
from envoy.service.ratelimit.v3 import rls_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ferryman.apis.convert import decision_to_proto, encode_decision
from ferryman.apis.rls import METHODS
from ferryman.core.rules import Unit, UnitLimit
from ferryman.engine import Code, Decision, Status

UINT32 = 2**32 - 1

# Varints of every length, and their edges.
numbers = st.one_of(
    st.sampled_from([0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28, UINT32]),
    st.integers(0, UINT32),
)
limits = st.one_of(
    st.none(),
    st.builds(
        UnitLimit,
        numbers,
        st.one_of(st.none(), st.sampled_from(list(Unit))),
        name=st.sampled_from(["", "per_user", "é" * 70]),
    ),
)
statuses = st.builds(
    Status,
    st.sampled_from(list(Code)),
    limits,
    numbers,
    st.one_of(st.none(), st.integers(-(2**40), 2**40), st.sampled_from([0, 1, 60, 3600])),
    st.booleans(),
)
decisions = st.builds(
    Decision,
    st.sampled_from(list(Code)),
    st.lists(statuses, max_size=5).map(tuple),
    st.one_of(st.just(()), st.just((("RateLimit-Limit", "5"), ("RateLimit-Remaining", "4")))),
    st.one_of(st.none(), st.just({"domain": "d", "descriptors": []})),
)


@settings(max_examples=400, deadline=None)
@given(decisions)
def test_encoded_answers_are_the_protobuf_encoders_bytes(decision: Decision) -> None:
    assert encode_decision(decision) == decision_to_proto(decision).SerializeToString()


def test_one_limit_object_is_encoded_once_and_a_new_one_anew() -> None:
    """Encoded limits are kept by object: a new limit (a reloaded rule) is never answered
    with the encoding of one that went before it."""
    for n in range(1, 200):
        limit = UnitLimit(n, Unit.MINUTE, name=f"r{n}")
        answer = encode_decision(Decision(Code.OK, (Status(Code.OK, limit, n - 1, 5),)))
        status = rls_pb2.RateLimitResponse.FromString(answer).statuses[0]
        assert status.current_limit.requests_per_unit == n
        assert status.current_limit.name == f"r{n}"


def test_span_attributes_read_the_code_from_the_encoded_answer() -> None:
    read = METHODS["ShouldRateLimit"].response_attributes
    assert read is not None
    for code in Code:
        answer = encode_decision(Decision(code, (Status(Code.OK),)))
        assert read(answer) == {"ratelimit.code": code.name}


@pytest.mark.parametrize("remaining", [-1, -200, UINT32 + 1, 2**40])
def test_a_count_out_of_range_is_refused_as_the_message_refuses_it(remaining: int) -> None:
    decision = Decision(Code.OK, (Status(Code.OK, UnitLimit(5, Unit.SECOND), remaining, 1),))
    with pytest.raises(ValueError, match="out of range"):
        decision_to_proto(decision).SerializeToString()
    with pytest.raises(ValueError, match="out of range"):
        encode_decision(decision)
