"""Per-rule cardinality: the series that request values make (detailed_metric,
value_to_metric, per-tenant stats of burst and bucket nodes, unknown domains) are capped per
rule by MAX_METRIC_SERIES; past it a rule's values fold into its one ``_other_`` series,
the folds are counted, totals stay exact and /status names the rules that reached the cap."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ferryman.errors import SettingsError
from ferryman.settings import Settings
from ferryman.stats import (
    MAX_METRIC_SERIES,
    RATE_LIMIT,
    VALUES_FOLDED,
    CappedRule,
    Stats,
    ValuePath,
)

from helpers.metrics import PROMETHEUS, samples, scrape
from helpers.server import ConfigDir, Server, ServerFactory, codes

RULE = ("shop", "user")

CONFIG = """
domain: shop
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: plan
    value_to_metric: true
    descriptors:
      - key: seat
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    detailed_metric: true
    token_bucket: {size: 10, fill_rate: 1}
  - key: job
    detailed_metric: true
    burst_tiers:
      - {limit: 10, window: 1s, active: 1h}
"""


def value_path(value: str, rule: tuple[str, ...] = RULE) -> tuple[str, ValuePath]:
    """The series key and path a detailed_metric rule gives the request value ``value``."""
    parts = (*rule[:-1], f"{rule[-1]}_{value}")
    return ".".join(parts), ValuePath(parts, rule)


def test_a_rules_values_past_the_cap_fold_into_its_other_series() -> None:
    """The first max_values values keep series of their own, later ones share the rule's
    _other_ series; every increment is still counted, and each fold is counted too."""
    stats = Stats(max_values=3)
    for i in range(10):
        key, path = value_path(f"u{i}")
        stats.rule(key, "total_hits", 2, path)
    values = stats.snapshot()
    own = [f"{RATE_LIMIT}.shop.user_u{i}.total_hits" for i in range(3)]
    assert [values.get(name) for name in own] == [2, 2, 2]
    assert f"{RATE_LIMIT}.shop.user_u3.total_hits" not in values
    assert values[f"{RATE_LIMIT}.shop.user._other_.total_hits"] == 7 * 2
    assert values[VALUES_FOLDED] == 7
    assert stats.capped() == [CappedRule("shop.user", 3, 7)]
    other = [s for s in stats.rule_series() if s[1] == ("shop", "user", "_other_")]
    assert other == [("total_hits", ("shop", "user", "_other_"), (), 14)]


def test_a_value_with_its_own_series_keeps_them_for_every_stat() -> None:
    """A value admitted before the cap filled gets its later stats (over_limit) under its
    own name too: a value is never split between its series and _other_."""
    stats = Stats(max_values=2)
    for i in range(5):
        key, path = value_path(f"u{i}")
        stats.rule_counts([(key, path, (1, 1, 0, 0))])
    key, path = value_path("u1")
    stats.rule_counts([(key, path, (1, 0, 0, 1))])
    values = stats.snapshot()
    assert values[f"{RATE_LIMIT}.shop.user_u1.over_limit"] == 1
    assert values[f"{RATE_LIMIT}.shop.user_u1.total_hits"] == 2
    assert values[f"{RATE_LIMIT}.shop.user._other_.total_hits"] == 3
    assert f"{RATE_LIMIT}.shop.user._other_.over_limit" not in values


def test_each_rule_has_a_cap_of_its_own() -> None:
    """One rule flooded with values folds its own, not another rule's; configured series
    (plain paths) are never folded."""
    stats = Stats(max_values=2)
    for i in range(50):
        key, path = value_path(f"u{i}")
        stats.rule(key, "total_hits", 1, path)
    for i in range(2):
        key, path = value_path(f"t{i}", ("shop", "tenant"))
        stats.rule(key, "total_hits", 1, path)
    stats.rule("shop.plain", "total_hits", 1, ("shop", "plain"))
    values = stats.snapshot()
    assert values[f"{RATE_LIMIT}.shop.tenant_t1.total_hits"] == 1
    assert values[f"{RATE_LIMIT}.shop.plain.total_hits"] == 1
    assert [c.rule for c in stats.capped()] == ["shop.user"]


def test_a_burst_tiers_label_is_kept_on_the_fold() -> None:
    """The tier label (from configuration) stays on the _other_ series of a burst node."""
    stats = Stats(max_values=1)
    for i in range(3):
        key, path = value_path(f"j{i}", ("jobs", "job"))
        stats.rule(key, "tier_hits", 1, path, (("tier", "0"),))
    values = stats.snapshot()
    assert values[f"{RATE_LIMIT}.jobs.job._other_.tier_0.tier_hits"] == 2
    assert values[f"{RATE_LIMIT}.jobs.job_j0.tier_0.tier_hits"] == 1


def test_unknown_domains_are_one_rule() -> None:
    """domain_not_found names the request's domain: past the cap, others share _other_."""
    stats = Stats(max_values=2)
    for i in range(6):
        stats.rule(f"nope{i}", "domain_not_found", 1, (f"nope{i}",))
    values = stats.snapshot()
    assert values[f"{RATE_LIMIT}.nope1.domain_not_found"] == 1
    assert values[f"{RATE_LIMIT}._other_.domain_not_found"] == 4
    assert stats.capped() == [CappedRule("domain_not_found", 2, 4)]


def test_the_service_wide_cap_still_bounds_the_folds() -> None:
    """METRICS_MAX_SERIES (max_series) applies after the per-rule cap, to folds as well."""
    stats = Stats(max_series=2, max_values=1)
    for rule in (("a", "x"), ("b", "y"), ("c", "z")):
        for i in range(2):
            key, path = value_path(f"v{i}", rule)
            stats.rule(key, "total_hits", 1, path)
    assert stats.series <= 2 + 1  # the cap, plus the overflow series of total_hits
    assert sum(value for _, _, _, value in stats.rule_series()) == 6


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, MAX_METRIC_SERIES), ("", MAX_METRIC_SERIES), (" 250 ", 250)]
)
def test_max_metric_series_is_read_from_the_environment(raw: str | None, expected: int) -> None:
    """MAX_METRIC_SERIES is an integer, 10,000 when unset or empty."""
    env = {} if raw is None else {"MAX_METRIC_SERIES": raw}
    assert Settings.from_env(env).max_metric_series == expected
    assert MAX_METRIC_SERIES == 10_000


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("many", "MAX_METRIC_SERIES='many' is not an integer"),
        ("0", "MAX_METRIC_SERIES='0' must be at least 1"),
        ("-5", "MAX_METRIC_SERIES='-5' must be at least 1"),
    ],
)
def test_a_bad_max_metric_series_is_refused(raw: str, says: str) -> None:
    """A value that is not an integer of at least 1 is a SettingsError naming it."""
    with pytest.raises(SettingsError, match=says):
        Settings.from_env({"MAX_METRIC_SERIES": raw})


def status(server: Server) -> dict[str, Any]:
    code, body = server.http("GET", "/status", debug=True)
    assert code == 200
    page: dict[str, Any] = json.loads(body)
    return page


def flood(server: Server, domain: str, key: str, first: int, count: int) -> None:
    """``count`` distinct values of ``key``, 125 descriptors to a request."""
    for start in range(first, first + count, 125):
        stop = min(start + 125, first + count)
        answer = server.ask(domain, *[[(key, f"v{i}")] for i in range(start, stop)])
        assert set(codes(answer)) == {"OK"}


def test_a_hundred_thousand_values_leave_the_scrape_bounded(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """100,000 distinct values of a detailed_metric rule: the scrape has as many lines after
    them as after the first thousand, the fold holds the rest, hits add up, /status names
    the rule."""
    config_dir.write("shop.yaml", CONFIG)
    # The service-wide cap far above: here only the per-rule cap can bound the series.
    server = make_server(
        max_metric_series=500, metrics_max_series=1_000_000, memory_max_keys=300_000, **PROMETHEUS
    )
    flood(server, "shop", "user", 0, 1_000)
    before = scrape(server)
    flood(server, "shop", "user", 1_000, 99_000)
    after = scrape(server)
    assert len(after) == len(before)
    assert abs(len("\n".join(after)) - len("\n".join(before))) < 1_000  # only counts grew
    got = samples(after)
    hits = {s: int(v) for s, v in got.items() if s.startswith("ratelimit_service_rate_limit_total")}
    assert len(hits) == 500 + 1
    other = 'ratelimit_service_rate_limit_total_hits{domain="shop",key1="user",key2="_other_"}'
    assert hits[other] == 99_500
    assert sum(hits.values()) == 100_000
    # Two stats per folded value and request: total_hits and within_limit.
    assert int(got["ratelimit_service_stats_values_folded"]) == 2 * 99_500
    page = status(server)["stats"]
    assert page["max_metric_series"] == 500
    assert page["capped_rules"] == [{"rule": "shop.user", "values": 500, "folded": 2 * 99_500}]


def test_value_to_metric_bucket_and_burst_nodes_are_capped_per_rule(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """value_to_metric levels, and tenants of token-bucket and burst-tier nodes, fold past
    the cap, each rule into its own _other_ series; rules under the cap are not listed."""
    config_dir.write("shop.yaml", CONFIG)
    server = make_server(max_metric_series=10, **PROMETHEUS)
    for i in range(30):
        server.ask("shop", [("plan", f"p{i}"), ("seat", "s")], [("tenant", f"t{i}")])
        server.ask("shop", [("job", f"j{i}")])
    server.ask("shop", [("user", "only-one")])
    got = samples(scrape(server))
    for labels in (
        'domain="shop",key1="plan",key2="seat",key3="_other_"',
        'domain="shop",key1="tenant",key2="_other_"',
        'domain="shop",key1="job",key2="_other_"',
    ):
        assert got[f"ratelimit_service_rate_limit_total_hits{{{labels}}}"] == "20", labels
    rules = [c["rule"] for c in status(server)["stats"]["capped_rules"]]
    assert rules == ["shop.job", "shop.plan.seat", "shop.tenant"]
