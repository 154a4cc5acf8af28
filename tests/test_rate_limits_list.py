"""Several limits on one node (``rate_limits``): a request passes only if it fits every
limit and is counted in all or none; the status is the limit closest to refusing; each
limit has its own name, stats and ``replaces`` target; memory, Redis and a Redis Cluster
decide alike; the YAML and its errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferryman.algorithms.limit_list import LimitList
from ferryman.algorithms.limit_list.limiter import parts
from ferryman.clock import ManualClock
from ferryman.config import load_sources
from ferryman.engine.explain import render
from ferryman.errors import ConfigError

from helpers.server import EPOCH, ConfigDir, ServerFactory, codes
from helpers.stores import Store, memory_store, on_stores, unique_prefix

CONFIG = """
domain: l
descriptors:
  - key: user
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 3}
      - {name: per_minute, unit: minute, requests_per_unit: 5}
  - key: mixed
    rate_limits:
      - {window: 10s, requests_per_unit: 4}
      - sliding_window: {window: 30s, requests_per_unit: 6}
        name: smooth
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [{name: per_minute}]
"""


def _limits(text: str) -> LimitList:
    config = load_sources([("l.yaml", text)])
    limit = config.domains["l"].root.rules[0].limit
    assert isinstance(limit, LimitList)
    return limit


def test_a_list_reads_each_item_as_its_kind() -> None:
    """Plain items are fixed windows, named ones their kind; unnamed ones get kind_index."""
    config = load_sources([("l.yaml", CONFIG)])
    mixed = config.domains["l"].root.rules[1].limit
    assert isinstance(mixed, LimitList)
    assert [i.limit.kind for i in mixed.items] == ["fixed_window", "sliding_window"]
    assert [i.name for i in mixed.items] == ["fixed_window_0", "smooth"]


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ("rate_limits: []", "rate_limits", "expected a list of limits"),
        ("rate_limits: [{unit: second}, 3]", "rate_limits[1]", "expected a map"),
        ("rate_limits: [{requests_per_unit: 3}]", "rate_limits[0]", "missing 'unit'"),
        (
            "rate_limits: [{copies: {limit: 3}}]",
            "rate_limits[0]",
            "cannot be one of a list",
        ),
        (
            "rate_limits: [{name: a, unit: second, requests_per_unit: 1},"
            " {name: a, unit: minute, requests_per_unit: 2}]",
            "rate_limits",
            "two limits are named 'a'",
        ),
        (
            "rate_limits: [{unit: second, requests_per_unit: 1}]\n    rate_limit: {unit: second}",
            "",
            "",
        ),
    ],
)
def test_list_errors_name_file_line_and_path(body: str, path: str, message: str) -> None:
    """Each wrong list is refused with the file, its line and the path to the item."""
    with pytest.raises(ConfigError) as info:
        load_sources([("l.yaml", f"domain: l\ndescriptors:\n  - key: k\n    {body}\n")])
    problem = info.value.problems[0]
    assert problem.file == "l.yaml" and problem.line is not None
    if path:
        assert problem.path == f"descriptors[0].{path}"
    assert message in problem.message


@on_stores()
def test_two_limits_refuse_by_the_tighter_and_count_in_all_or_none(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """3 per second and 5 per minute: the 4th request in a second is refused by the
    per-second limit and counted in neither; the minute then allows only two more."""
    config_dir.write("l.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 0.1)
    answers = [server.ask("l", [("user", "u")]) for _ in range(4)]
    assert [codes(r)[0] for r in answers] == ["OK", "OK", "OK", "OVER_LIMIT"]
    refused = answers[3].statuses[0]
    assert refused.current_limit.requests_per_unit == 3 and refused.current_limit.unit == 1
    # Closest to refusing while passing: per_second had 0 left after the 3rd.
    assert answers[2].statuses[0].current_limit.name == "per_second"
    assert answers[2].statuses[0].limit_remaining == 0
    clock.set(EPOCH + 1.1)  # refused hit not counted in the minute: 3 of 5 used
    answers = [server.ask("l", [("user", "u")]) for _ in range(3)]
    assert [codes(r)[0] for r in answers] == ["OK", "OK", "OVER_LIMIT"]
    assert answers[2].statuses[0].current_limit.unit == 2  # the minute refused it
    stats = server.stats
    assert stats["ratelimit.service.rate_limit.l.user.total_hits"] == 7
    assert stats["ratelimit.service.rate_limit.l.user.over_limit"] == 2
    assert stats["ratelimit.service.rate_limit.l.user.per_second.over_limit"] == 1
    assert stats["ratelimit.service.rate_limit.l.user.per_minute.over_limit"] == 1


@on_stores("memory")
def test_a_replacing_rule_drops_only_the_named_limit(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """A vip rule that replaces per_minute: the user's per-second limit still applies, the
    per-minute one is left out (and not counted)."""
    config_dir.write("l.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 0.1)
    answers = [server.ask("l", [("user", "u")], [("vip", "v")]) for _ in range(4)]
    assert [codes(r) for r in answers] == [["OK", "OK"]] * 3 + [["OVER_LIMIT", "OK"]]
    for second in range(2, 5):
        clock.set(EPOCH + second + 0.1)
        assert codes(server.ask("l", [("user", "u")], [("vip", "v")])) == ["OK", "OK"]
    assert "ratelimit.service.rate_limit.l.user.per_minute.total_hits" not in server.stats


# (seconds to advance in tenths, key, hits)
trace = st.lists(
    st.tuples(st.integers(0, 80), st.sampled_from(["a", "b"]), st.integers(0, 3)),
    min_size=1,
    max_size=30,
)


@on_stores("redis", "cluster")
@settings(
    deadline=None, max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=trace)
def test_random_traces_on_redis_agree_with_memory(
    store: Store, steps: list[tuple[int, str, int]]
) -> None:
    """Every decision and every limit's remaining and reset equal the memory store's, on a
    list of a 10 s window, a 30 s sliding window, a calendar day, a GCRA limit and a token
    bucket."""
    text = (
        "domain: l\ndescriptors:\n  - key: k\n    rate_limits:\n"
        "      - {window: 10s, requests_per_unit: 4}\n"
        "      - sliding_window: {window: 30s, requests_per_unit: 6}\n"
        "      - calendar: {unit: day, time_zone: Europe/Berlin}\n"
        "        requests_per_unit: 9\n"
        "      - gcra: {rate: 5, per: 3s, burst: 3}\n"
        "      - token_bucket: {size: 5, fill_rate: 0.7, max_debt_millis: 900}\n"
    )
    limit = _limits(text)
    reference = memory_store(ManualClock(EPOCH))
    prefix = unique_prefix("l")
    now = EPOCH + 0.37
    try:
        for advance, key, hits in steps:
            now += advance / 10
            got = store.run(
                store.backend.store("limit_list").check(
                    prefix + key, parts(limit.items, now), hits, now
                )
            )
            want = reference.run(
                reference.backend.store("limit_list").check(key, parts(limit.items, now), hits, now)
            )
            assert got.fits == want.fits
            assert [(s.fits, s.remaining, s.reset_us) for s in got.steps] == [
                (s.fits, s.remaining, s.reset_us) for s in want.steps
            ]
    finally:
        reference.close()


@on_stores("memory", "redis")
def test_explain_reads_every_limit_without_counting(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """/explain gives each limit's name, what it leaves and its reset; asking changes
    nothing, and the text names both limits."""
    config_dir.write("l.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH + 0.1)
    server.ask("l", [("user", "u")], hits=2)
    for _ in range(2):
        status, body = server.http("GET", "/explain?domain=l&descriptor=user=u", debug=True)
        assert status == 200, body
        (shown,) = json.loads(body)["descriptors"]
        assert [(f["name"], f["remaining"]) for f in shown["limits"]] == [
            ("per_second", 1),
            ("per_minute", 3),
        ]
    assert shown["counter_key"].endswith("ferryman_limits_{l.user|u}")
    text = render(json.loads(body))
    assert "fixed window 3 per second (per_second) and fixed window 5 per minute" in text
    assert "per_second: 1 left, resets in 1s; per_minute: 3 left" in text


@on_stores("memory")
def test_ietf_headers_give_one_policy_per_limit(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """With the IETF format, each limit of the request is a policy with its quota and
    window, and its remaining hits and reset."""
    config_dir.write("l.yaml", CONFIG)
    server = make_server(limit_response_headers_enabled=True, limit_response_headers_format="ietf")
    clock.set(EPOCH + 0.25)
    answer = server.ask("l", [("user", "u")], [("mixed", "m")])
    headers = {h.key: h.value for h in answer.response_headers_to_add}
    assert headers["RateLimit-Policy"] == (
        '"per_second";q=3;w=1, "per_minute";q=5;w=60, "d1.0";q=4;w=10, "smooth";q=6;w=30'
    )
    assert headers["RateLimit"] == (
        '"per_second";r=2;t=1, "per_minute";r=4;t=60, "d1.0";r=3;t=10, "smooth";r=5;t=30'
    )
    assert "RateLimit-Limit" not in headers
