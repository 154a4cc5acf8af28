"""Descriptor YAML loading: every error names file, line and path; good configs load right."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from ferryman.config.loader import digest_sources, load_directory, load_sources
from ferryman.config.model import Config
from ferryman.core.rules import Rule, Unit, UnitLimit
from ferryman.errors import ConfigError, ConfigProblem

from helpers import rate_of

REPO_DESCRIPTORS = Path(__file__).resolve().parent.parent / "descriptors"

LIMIT = "rate_limit: {unit: second, requests_per_unit: 1}"


def y(text: str) -> str:
    """YAML from an indented triple-quoted string: line 1 is the first line after the quotes."""
    return textwrap.dedent(text).lstrip("\n")


def problems_of(
    sources: list[tuple[str, str]], *, merge_domains: bool = False, strict: bool = False
) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as info:
        load_sources(sources, merge_domains=merge_domains, strict=strict)
    assert info.value.problems, "a ConfigError must carry at least one problem"
    return info.value.problems


def load(text: str, name: str = "cfg.yaml") -> Config:
    return load_sources([(name, text)])


def rule_at(config: Config, domain: str, *path: tuple[str, str]) -> Rule:
    """The rule reached by matching (key, value) entries level by level."""
    level = config.domains[domain].root
    rule: Rule | None = None
    for key, value in path:
        rule = level.match(key, value)
        assert rule is not None, f"no rule for {key}={value}"
        level = rule.children
    assert rule is not None
    return rule


# (YAML text, [(line, path, part of the message), ...]) for one file named cfg.yaml.
BAD = [
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
           value: v
        """,
        [(4, "", "YAML syntax error")],
        id="yaml-syntax-bad-indent",
    ),
    pytest.param(
        "domain: a\ndescriptors:\n\t- key: k\n",
        [(3, "", "YAML syntax error")],
        id="yaml-syntax-tab",
    ),
    pytest.param(
        """
        domain: a
        descriptors: [
          {key: k},
        """,
        [(4, "", "YAML syntax error")],
        id="yaml-syntax-unclosed-flow",
    ),
    pytest.param(
        """
        domain: a
        1: x
        """,
        [(2, "", "map key '1' is not a string")],
        id="non-string-key-top",
    ),
    pytest.param(
        """
        domain: a
        [x]: y
        """,
        [(2, "", "is not a string")],
        id="non-string-key-list",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              true: 5
        """,
        [(6, "descriptors[0].rate_limit", "map key 'true' is not a string")],
        id="non-string-key-nested",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            ratelimit:
              unit: second
              requests_per_unit: 1
        """,
        [(4, "descriptors[0].ratelimit", "unknown key 'ratelimit'")],
        id="unknown-key-ratelimit-typo",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_second: 1
        """,
        [(6, "descriptors[0].rate_limit.requests_per_second", "unknown key 'requests_per_second'")],
        id="unknown-key-in-rate-limit",
    ),
    pytest.param(
        """
        domain: a
        descriptor:
          - key: k
        """,
        [(2, "descriptor", "unknown key 'descriptor'")],
        id="unknown-key-top-level",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              name: me
              replaces:
                - {name: other, nmae: x}
        """,
        [(8, "descriptors[0].rate_limit.replaces[0].nmae", "unknown key 'nmae'")],
        id="unknown-key-in-replaces",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key
        """,
        [(3, "descriptors[0]", "a descriptor must be a map")],
        id="list-item-not-a-map",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            descriptors:
              - [a, b]
        """,
        [(5, "descriptors[0].descriptors[0]", "must be a map, found a list")],
        id="nested-list-item-not-a-map",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              replaces: [other]
        """,
        [(6, "descriptors[0].rate_limit.replaces[0]", "expected a map")],
        id="replaces-item-not-a-map",
    ),
    pytest.param(
        """
        - domain: a
        """,
        [(1, "", "expected a map, found a list")],
        id="file-not-a-map",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          key: k
        """,
        [(3, "descriptors", "expected a list of descriptors")],
        id="descriptors-not-a-list",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit: 5
        """,
        [(4, "descriptors[0].rate_limit", "expected a map")],
        id="rate-limit-not-a-map",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            metadata: [a, b]
        """,
        [(4, "descriptors[0].metadata", "expected a map")],
        id="metadata-not-a-map",
    ),
    pytest.param(
        """
        domain: ''
        descriptors: []
        """,
        [(1, "domain", "domain must not be empty")],
        id="empty-domain",
    ),
    pytest.param(
        """
        descriptors:
          - key: k
        """,
        [(1, "domain", "domain must not be empty")],
        id="missing-domain",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: ''
        """,
        [(3, "descriptors[0].key", "descriptor key must not be empty")],
        id="empty-descriptor-key",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - value: v
        """,
        [(3, "descriptors[0].key", "descriptor key must not be empty")],
        id="missing-descriptor-key",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            value: v
          - key: k
            value: v
        """,
        [(5, "descriptors[1]", "duplicate descriptor 'k_v' (already defined at descriptors[0])")],
        id="same-key-value-twice",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
          - key: k
        """,
        [(4, "descriptors[1]", "duplicate descriptor 'k'")],
        id="same-bare-key-twice",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            descriptors:
              - key: c
                value: '*'
              - key: c
                value: '*'
        """,
        [
            (
                7,
                "descriptors[0].descriptors[1]",
                "duplicate descriptor 'c_*' (already defined at descriptors[0].descriptors[0])",
            )
        ],
        id="same-key-value-twice-nested",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unlimited: true
              unit: second
        """,
        [(6, "descriptors[0].rate_limit.unit", "'unlimited: true' cannot have a unit")],
        id="unlimited-with-unit",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              requests_per_unit: 5
        """,
        [(5, "descriptors[0].rate_limit", "missing 'unit'")],
        id="missing-unit",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit: {unit: '', requests_per_unit: 5}
        """,
        [(4, "descriptors[0].rate_limit", "missing 'unit'")],
        id="empty-unit",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: fortnight
        """,
        [(5, "descriptors[0].rate_limit.unit", "invalid unit 'fortnight'")],
        id="invalid-unit",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: unknown
        """,
        [(5, "descriptors[0].rate_limit.unit", "invalid unit 'unknown'")],
        id="proto-unknown-is-not-a-unit",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: "5"
        """,
        [(6, "descriptors[0].rate_limit.requests_per_unit", "expected a whole number")],
        id="requests-per-unit-string",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: 5.5
        """,
        [(6, "descriptors[0].rate_limit.requests_per_unit", "a number with a fraction")],
        id="requests-per-unit-float",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: -1
        """,
        [(6, "descriptors[0].rate_limit.requests_per_unit", "-1 is out of range")],
        id="requests-per-unit-negative",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              requests_per_unit: 4294967296
        """,
        [(6, "descriptors[0].rate_limit.requests_per_unit", "out of range")],
        id="requests-per-unit-above-uint32",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            shadow_mode: "true"
        """,
        [(4, "descriptors[0].shadow_mode", "expected true or false")],
        id="bool-given-a-string",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            quota_mode: 1
        """,
        [(4, "descriptors[0].quota_mode", "expected true or false")],
        id="bool-given-a-number",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              unlimited: "false"
        """,
        [(6, "descriptors[0].rate_limit.unlimited", "expected true or false")],
        id="unlimited-given-a-string",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              replaces:
                - name: ''
        """,
        [(7, "descriptors[0].rate_limit.replaces[0]", "needs a non-empty name")],
        id="replaces-empty-name",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              replaces:
                - {}
        """,
        [(7, "descriptors[0].rate_limit.replaces[0]", "needs a non-empty name")],
        id="replaces-missing-name",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              unit: second
              replaces: {name: other}
        """,
        [(6, "descriptors[0].rate_limit.replaces", "expected a list")],
        id="replaces-not-a-list",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              name: mine
              unit: second
              replaces:
                - name: other
                - name: mine
        """,
        [(9, "descriptors[0].rate_limit.replaces[1]", "the rule 'mine' replaces itself")],
        id="rule-replaces-itself",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: path
            value: /api/v1
            share_threshold: true
        """,
        [(5, "descriptors[0].share_threshold", "share_threshold needs a wildcard value")],
        id="share-threshold-without-star",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: path
            share_threshold: true
        """,
        [(4, "descriptors[0].share_threshold", "share_threshold needs a wildcard value")],
        id="share-threshold-on-bare-key",
    ),
    pytest.param(
        """
        domain: a
        descriptors: &loop
          - key: k
            descriptors: *loop
        """,
        [(2, "descriptors[0].descriptors", "contain itself")],
        id="alias-loop-in-descriptors",
    ),
    pytest.param(
        """
        domain: a
        descriptors:
          - key: k
            rate_limit:
              <<: 5
              unit: second
        """,
        [(5, "descriptors[0].rate_limit", "'<<' needs a map")],
        id="merge-key-with-a-scalar",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD)
def test_each_load_error_names_file_line_and_path(
    text: str, expected: list[tuple[int, str, str]]
) -> None:
    """Each kind of bad descriptor YAML is rejected naming the file, line and YAML path."""
    with pytest.raises(ConfigError) as info:
        load_sources([("cfg.yaml", y(text))])
    problems = info.value.problems
    assert [(p.file, p.line, p.path) for p in problems] == [
        ("cfg.yaml", line, path) for line, path, _ in expected
    ]
    for problem, (line, path, fragment) in zip(problems, expected, strict=True):
        assert fragment in problem.message
        assert problem.column is not None and problem.column >= 1
        # The exception's text carries the same location, in file:line:column: path: form.
        prefix = f"cfg.yaml:{line}:{problem.column}: " + (f"{path}: " if path else "")
        assert prefix + problem.message in str(info.value).splitlines()


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_empty_file_is_an_error_naming_the_file(text: str) -> None:
    """A file with no YAML document is rejected: a domain is required."""
    (problem,) = problems_of([("empty.yaml", text)])
    assert (problem.file, problem.path) == ("empty.yaml", "domain")
    assert "empty" in problem.message


def test_nested_error_names_the_nested_path_and_line() -> None:
    """An error deep in nested descriptors names the full nested path and its own line."""
    text = y(
        """
        domain: deep
        descriptors:
          - key: a
            descriptors:
              - key: b
                rate_limit: {unit: second, requests_per_unit: 1}
              - key: c
                rate_limit:
                  requests_per_unit: 3
                  unit: fortnight
        """
    )
    (problem,) = problems_of([("deep.yaml", text)])
    assert (problem.file, problem.line, problem.column) == ("deep.yaml", 10, 17)
    assert problem.path == "descriptors[0].descriptors[1].rate_limit.unit"
    assert str(problem).startswith(
        "deep.yaml:10:17: descriptors[0].descriptors[1].rate_limit.unit: invalid unit"
    )


def test_several_errors_in_one_file_are_all_reported() -> None:
    """Every problem of a file is reported, not only the first one."""
    text = y(
        """
        domain: many
        descriptors:
          - key: a
            ratelimit: {unit: second}
          - key: b
            rate_limit: {unit: fortnight, requests_per_unit: 1}
          - key: c
            rate_limit: {unit: second, requests_per_unit: -3}
          - key: b
          - not a map
          - key: d
            value: plain
            share_threshold: true
        """
    )
    problems = problems_of([("many.yaml", text)])
    assert [(p.line, p.path) for p in problems] == [
        (4, "descriptors[0].ratelimit"),
        (6, "descriptors[1].rate_limit.unit"),
        (8, "descriptors[2].rate_limit.requests_per_unit"),
        (9, "descriptors[3]"),
        (10, "descriptors[4]"),
        (13, "descriptors[5].share_threshold"),
    ]
    assert {p.file for p in problems} == {"many.yaml"}


def test_empty_key_does_not_hide_the_other_errors_of_its_descriptor() -> None:
    """A descriptor with an empty key still has its limit, flags and children checked."""
    text = y(
        """
        domain: a
        descriptors:
          - key: ''
            shadow_mode: "no"
            rate_limit: {unit: fortnight}
            descriptors:
              - ratelimit: {}
        """
    )
    problems = problems_of([("cfg.yaml", text)])
    assert sorted((p.line, p.path) for p in problems) == [
        (3, "descriptors[0].key"),
        (4, "descriptors[0].shadow_mode"),
        (5, "descriptors[0].rate_limit.unit"),
        (7, "descriptors[0].descriptors[0].key"),
        (7, "descriptors[0].descriptors[0].ratelimit"),
    ]


def test_errors_of_every_file_are_reported_and_nothing_loads() -> None:
    """Bad files are all reported, each under its own name; a good file does not load alone."""
    good = ("good.yaml", f"domain: good\ndescriptors:\n  - key: k\n    {LIMIT}\n")
    bad1 = ("bad1.yaml", "domain: one\ndescriptors:\n  - key: k\n    ratelimit: {}\n")
    bad2 = ("bad2.yaml", "domain: two\ndescriptors:\n  - key: ''\n")
    problems = problems_of([bad1, good, bad2])
    assert [(p.file, p.line, p.path) for p in problems] == [
        ("bad1.yaml", 4, "descriptors[0].ratelimit"),
        ("bad2.yaml", 3, "descriptors[0].key"),
    ]


def test_same_domain_in_two_files_is_an_error_naming_both() -> None:
    """A domain defined in two files is rejected at the second file's domain line."""
    a = ("a.yaml", f"domain: shared\ndescriptors:\n  - key: a\n    {LIMIT}\n")
    b = ("b.yaml", f"# second\ndomain: shared\ndescriptors:\n  - key: b\n    {LIMIT}\n")
    (problem,) = problems_of([a, b])
    assert (problem.file, problem.line, problem.path) == ("b.yaml", 2, "domain")
    assert "'shared' is already defined in a.yaml" in problem.message
    assert "MERGE_DOMAIN_CONFIG" in problem.message


def test_merge_domains_merges_files_of_one_domain() -> None:
    """With merging enabled, the descriptors of every file of a domain are loaded together."""
    a = ("a.yaml", "domain: shared\ndescriptors:\n  - key: a\n    value: '1'\n    " + LIMIT)
    b = ("b.yaml", "domain: shared\ndescriptors:\n  - key: a\n    value: '2'\n  - key: b\n")
    config = load_sources([a, b], merge_domains=True)
    domain = config.domains["shared"]
    assert domain.files == ("a.yaml", "b.yaml")
    assert [(r.key, r.value, r.source) for r in domain.root.rules] == [
        ("a", "1", "a.yaml:3"),
        ("a", "2", "b.yaml:3"),
        ("b", "", "b.yaml:5"),
    ]
    assert domain.root.match("a", "1") is domain.root.rules[0]
    assert domain.root.match("b", "x") is domain.root.rules[2]


def test_merge_domains_rejects_a_key_value_repeated_across_files() -> None:
    """A key/value defined in two merged files is an error at its line in the second file."""
    a = ("a.yaml", "domain: shared\ndescriptors:\n  - key: k\n    value: v\n    " + LIMIT)
    b = ("b.yaml", "domain: shared\ndescriptors:\n  - key: other\n  - key: k\n    value: v\n")
    (problem,) = problems_of([a, b], merge_domains=True)
    assert (problem.file, problem.line, problem.path) == ("b.yaml", 4, "descriptors[1]")
    assert "duplicate descriptor 'k_v'" in problem.message
    assert "descriptors[0] in a.yaml" in problem.message


def test_merge_domains_still_rejects_a_repeat_within_one_file() -> None:
    """Merging files does not relax the duplicate check inside a single file."""
    a = ("a.yaml", "domain: shared\ndescriptors:\n  - key: k\n  - key: k\n")
    b = ("b.yaml", "domain: shared\ndescriptors:\n  - key: j\n")
    (problem,) = problems_of([a, b], merge_domains=True)
    assert (problem.file, problem.line, problem.path) == ("a.yaml", 4, "descriptors[1]")
    assert problem.message.startswith(
        "duplicate descriptor 'k' (already defined at descriptors[0]) (the reference refuses"
    )


@pytest.mark.parametrize(
    ("text", "unit", "seconds"),
    [
        ("second", Unit.SECOND, 1),
        ("Second", Unit.SECOND, 1),
        ("MINUTE", Unit.MINUTE, 60),
        ("hour", Unit.HOUR, 3600),
        ("Day", Unit.DAY, 86400),
        ("wEEk", Unit.WEEK, 604800),
        ("month", Unit.MONTH, 2592000),
        ("YEAR", Unit.YEAR, 31536000),
    ],
)
def test_unit_is_case_insensitive(text: str, unit: Unit, seconds: int) -> None:
    """Units load whatever their case, with the reference's length in seconds."""
    config = load(f"domain: u\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {text}}}\n")
    limit = rate_of(rule_at(config, "u", ("k", "x")))
    assert limit is not None
    assert limit.unit is unit
    assert limit.unit.seconds == seconds


def test_rate_limit_and_rule_fields_load() -> None:
    """Every field of a descriptor and of its rate_limit lands in the model."""
    config = load(
        y(
            """
            domain: shop
            descriptors:
              - key: plan
                value: gold
                shadow_mode: true
                quota_mode: true
                detailed_metric: true
                value_to_metric: true
                metadata:
                  tier: gold
                  limits: {burst: 2, tags: [a, b]}
                rate_limit:
                  name: gold_plan
                  unit: hour
                  requests_per_unit: 4294967295
                  replaces:
                    - name: per_ip
                    - name: per_user
                descriptors:
                  - key: path
                    value: /cart/*
                    share_threshold: true
                    rate_limit: {unit: minute, requests_per_unit: 0}
              - key: internal
                rate_limit:
                  unlimited: true
              - key: whitelisted
            """
        ),
        name="shop.yaml",
    )
    gold = rule_at(config, "shop", ("plan", "gold"))
    assert rate_of(gold) == UnitLimit(
        requests_per_unit=4294967295,
        unit=Unit.HOUR,
        unlimited=False,
        name="gold_plan",
        replaces=("per_ip", "per_user"),
    )
    assert (gold.shadow_mode, gold.quota_mode, gold.detailed_metric, gold.value_to_metric) == (
        True,
        True,
        True,
        True,
    )
    assert gold.share_threshold is False
    assert dict(gold.metadata) == {"tier": "gold", "limits": {"burst": 2, "tags": ["a", "b"]}}
    assert (gold.stats_key, gold.source) == ("shop.plan_gold", "shop.yaml:3")

    cart = rule_at(config, "shop", ("plan", "gold"), ("path", "/cart/42"))
    assert rate_of(cart) == UnitLimit(requests_per_unit=0, unit=Unit.MINUTE)
    assert (cart.share_threshold, cart.shadow_mode, cart.quota_mode) == (True, False, False)
    assert dict(cart.metadata) == {}
    assert (cart.stats_key, cart.source) == ("shop.plan_gold.path_/cart/*", "shop.yaml:20")

    internal = rule_at(config, "shop", ("internal", "anything"))
    assert rate_of(internal) == UnitLimit(requests_per_unit=0, unit=None, unlimited=True)

    whitelisted = rule_at(config, "shop", ("whitelisted", "x"))
    assert rate_of(whitelisted) is None
    assert whitelisted.children.rules == ()


MATCHING = y(
    """
    domain: m
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: path
        value: /api/*/admin
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: path
        value: /api/exact
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 4}
      - key: host
        value: '*.example.com'
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: host
        value: 'api.*'
        rate_limit: {unit: minute, requests_per_unit: 6}
      - key: file
        value: '*.css'
        rate_limit: {unit: minute, requests_per_unit: 7}
    """
)


@pytest.mark.parametrize(
    ("key", "value", "limit"),
    [
        ("path", "/api/exact", 3),  # exact before the wildcards listed above it
        ("path", "/api/v1/admin", 1),  # both wildcards match: the first in config order wins
        ("path", "/api/v1", 1),
        ("path", "/api", 4),  # '/api/*' needs the '/': falls back to the bare key
        ("path", "x/api/y", 4),  # a wildcard matches the whole value, not a part of it
        ("path", "/other", 4),
        ("host", "api.example.com", 5),  # config order, not the more specific pattern
        ("host", "api.internal", 6),
        ("file", "site.css", 7),
        ("file", "site_css", None),  # '.' is literal; no bare 'file' rule
        ("host", "", None),
        ("nothing", "/api/exact", None),
    ],
)
def test_level_match_order(key: str, value: str, limit: int | None) -> None:
    """Level.match tries the exact value, then wildcards in config order, then the bare key."""
    rule = load(MATCHING).domains["m"].root.match(key, value)
    if limit is None:
        assert rule is None
    else:
        assert rule is not None and rate_of(rule) is not None
        assert rate_of(rule).requests_per_unit == limit


def test_yaml_merge_keys_load_like_the_reference() -> None:
    """YAML '<<' merge keys work (own keys override; the first merged map wins)."""
    config = load(
        y(
            """
            domain: anchors
            descriptors:
              - key: a
                rate_limit: &std {unit: minute, requests_per_unit: 10}
              - key: b
                rate_limit:
                  <<: *std
                  requests_per_unit: 20
              - key: c
                rate_limit:
                  <<: [{unit: hour, name: first}, {unit: day, name: second, requests_per_unit: 3}]
            """
        )
    )
    limits = [rate_of(r) for r in config.domains["anchors"].root.rules]
    assert limits == [
        UnitLimit(10, Unit.MINUTE),
        UnitLimit(20, Unit.MINUTE),
        UnitLimit(3, Unit.HOUR, name="first"),
    ]


def test_yaml_merge_key_does_not_hide_an_own_duplicate_key() -> None:
    """A key written twice in one map is still refused under STRICT_CONFIG when the map also
    merges another."""
    text = y(
        """
        domain: anchors
        descriptors:
          - key: a
            rate_limit: &std {unit: minute, requests_per_unit: 10}
          - key: b
            rate_limit:
              <<: *std
              unit: hour
              unit: day
        """
    )
    (problem,) = problems_of([("cfg.yaml", text)], strict=True)
    assert (problem.line, problem.path) == (9, "descriptors[1].rate_limit.unit")
    assert "'unit' appears twice" in problem.message


@pytest.mark.parametrize("descriptors", ["", "descriptors:\n", "descriptors: []\n"])
def test_domain_without_descriptors_loads_empty(descriptors: str) -> None:
    """A domain with no descriptors loads, and matches nothing."""
    config = load("domain: open\n" + descriptors)
    assert list(config.domains) == ["open"]
    assert config.domains["open"].root.rules == ()
    assert config.domains["open"].root.match("k", "v") is None


def test_config_lists_files_limits_and_digest() -> None:
    """Config keeps its files, lists limits by domain then config order, and digests its text."""
    b = ("b.yaml", f"domain: zeta\ndescriptors:\n  - key: z\n    {LIMIT}\n")
    a_text = y(
        f"""
        domain: alpha
        descriptors:
          - key: p
            descriptors:
              - key: q
                {LIMIT}
          - key: r
            {LIMIT}
        """
    )
    sources = [b, ("a.yaml", a_text)]
    config = load_sources(sources)
    assert config.files == ("b.yaml", "a.yaml")
    assert [(d, r.stats_key) for d, r in config.iter_limits()] == [
        ("alpha", "alpha.p.q"),
        ("alpha", "alpha.r"),
        ("zeta", "zeta.z"),
    ]
    assert config.digest == digest_sources(sources)
    changed = load_sources([b, ("a.yaml", a_text.replace("key: r", "key: s"))])
    assert changed.digest != config.digest


# --- load_directory ---------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def good(name: str) -> str:
    return f"domain: {name}\ndescriptors:\n  - key: k\n    {LIMIT}\n"


BROKEN = "domain: broken\ndescriptors: [\n"


def configmap_layout(root: Path) -> None:
    """What Kubernetes makes of a ConfigMap volume with one key, x.yaml."""
    write(root / "..2026_01_01" / "x.yaml", good("cm"))
    os.symlink("..2026_01_01", root / "..data")
    os.symlink("..data/x.yaml", root / "x.yaml")


def test_configmap_layout_loads_each_domain_once(tmp_path: Path) -> None:
    """In a ConfigMap volume, dot-directories are skipped and the domain loads exactly once."""
    configmap_layout(tmp_path)
    config = load_directory(tmp_path, ignore_dotfiles=True)
    assert list(config.domains) == ["cm"]
    assert config.files == (str(tmp_path / "x.yaml"),)
    assert config.domains["cm"].files == (str(tmp_path / "x.yaml"),)


def test_configmap_layout_double_loads_without_ignore_dotfiles(tmp_path: Path) -> None:
    """With ignore_dotfiles off, the ConfigMap's hidden copy is read too: a duplicate domain."""
    configmap_layout(tmp_path)
    (problem,) = problems_of_directory(tmp_path, ignore_dotfiles=False)
    assert problem.path == "domain"
    assert "'cm' is already defined" in problem.message
    assert {problem.file, problem.message.split(" in ")[1].split(" ")[0]} == {
        str(tmp_path / "..2026_01_01" / "x.yaml"),
        str(tmp_path / "x.yaml"),
    }


def problems_of_directory(directory: Path, **options: bool) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as info:
        load_directory(directory, **options)
    return info.value.problems


def test_dotfiles_and_dot_directories_are_ignored(tmp_path: Path) -> None:
    """Hidden files and directories, at any depth, are not read when ignore_dotfiles is set."""
    write(tmp_path / "a.yaml", good("a"))
    write(tmp_path / ".a.yaml.swp.yaml", BROKEN)
    write(tmp_path / ".git" / "x.yaml", BROKEN)
    write(tmp_path / "sub" / ".cache" / "y.yaml", BROKEN)
    write(tmp_path / "sub" / ".hidden.yml", BROKEN)
    config = load_directory(tmp_path)
    assert config.files == (str(tmp_path / "a.yaml"),)
    assert problems_of_directory(tmp_path, ignore_dotfiles=False)[0].file.endswith(".yaml")


def test_yaml_and_yml_files_are_read_and_other_extensions_are_not(tmp_path: Path) -> None:
    """*.yaml and *.yml are loaded, in subdirectories too; other file names are skipped."""
    write(tmp_path / "b.yaml", good("b"))
    write(tmp_path / "a.yml", good("a"))
    write(tmp_path / "sub" / "c.yaml", good("c"))
    for name in ("d.json", "e.txt", "f.yaml.bak", "README", "yaml", "g.yaml~"):
        write(tmp_path / name, BROKEN)
    config = load_directory(tmp_path)
    assert sorted(config.domains) == ["a", "b", "c"]
    assert config.files == tuple(
        str(tmp_path / n) for n in ("a.yml", "b.yaml", os.path.join("sub", "c.yaml"))
    )


def test_directory_errors_name_the_full_file_path(tmp_path: Path) -> None:
    """A problem in a directory's file names that file's path, with line and YAML path."""
    write(tmp_path / "ok.yaml", good("ok"))
    bad = write(tmp_path / "team" / "bad.yml", "domain: bad\ndescriptors:\n  - key: k\n    x: 1\n")
    (problem,) = problems_of_directory(tmp_path)
    assert (problem.file, problem.line, problem.path) == (str(bad), 4, "descriptors[0].x")


def test_root_reached_through_a_symlink_loads(tmp_path: Path) -> None:
    """The configuration root may itself be a symlink (the runtime 'current' swap)."""
    write(tmp_path / "v1" / "config" / "x.yaml", good("v1"))
    os.symlink("v1", tmp_path / "current")
    config = load_directory(tmp_path / "current" / "config")
    assert list(config.domains) == ["v1"]


def test_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    """Loading a directory that does not exist is a ConfigError naming the directory."""
    (problem,) = problems_of_directory(tmp_path / "nope")
    assert problem.file == str(tmp_path / "nope")
    assert "not a directory" in problem.message


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    """A file that is not UTF-8 is reported by name instead of crashing the load."""
    (tmp_path / "latin1.yaml").write_bytes(b"domain: caf\xe9\n")
    (problem,) = problems_of_directory(tmp_path)
    assert problem.file == str(tmp_path / "latin1.yaml")
    assert "cannot read file" in problem.message


def test_repo_descriptors_directory_loads() -> None:
    """The repository's own example descriptors load, one domain per file."""
    config = load_directory(REPO_DESCRIPTORS)
    assert {"edge-proxy", "messaging"} <= set(config.domains)
    files = sorted(str(p) for p in REPO_DESCRIPTORS.rglob("*.y*ml"))
    assert sorted(f for d in config.domains.values() for f in d.files) == files
    assert config.iter_limits()
