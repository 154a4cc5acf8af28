"""Descriptor files as control planes generate them load as the reference service loads them:
the corpus under tests/data/generated through `ferryman check` and a running server, and the
reference's reading rules one by one (what it accepts, what ferryman warns of, what both
refuse, and what each refusal says the reference would have done)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ferryman.config.loader import load_sources
from ferryman.config.model import Config
from ferryman.core.rules import Rule, Unit
from ferryman.errors import ConfigError, ConfigProblem

from helpers import rate_of
from helpers.serve_process import ServeProcess
from helpers.server import ServerFactory, codes, wait_for

GENERATED = Path(__file__).resolve().parent / "data" / "generated"


def ferryman(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m ferryman ARGS`` with none of the service's settings but ``env``."""
    full = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    if "PYTHONPATH" in os.environ:
        full["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [sys.executable, "-m", "ferryman", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# Each corpus directory: its domains and the limits `check` lists.
CORPUS = {
    "envoy_gateway": (3, 7),
    "istio": (1, 4),
    "reference": (2, 8),
}

EG_ROUTE = "httproute/default/backend/rule/0/match/0/www_example_com"
EG_HEADERS = "httproute/default/backend/rule/1/match/-1/www_example_com"
EG_API = "httproute/default/api/rule/0/match/0/api_example_com"
EG_GRPC = "grpcroute/tenants/billing/rule/0/match/-1/billing"

# (directory, domain, descriptor entries, how many requests, the codes they get in turn).
DECISIONS = [
    # An intermediate route node with rate_limit: null limits nothing itself.
    ("envoy_gateway", "default/eg/http", [(EG_ROUTE, EG_ROUTE)], 4, ["OK"] * 4),
    (
        "envoy_gateway",
        "default/eg/http",
        [(EG_ROUTE, EG_ROUTE), ("rule-0-match-0", "rule-0-match-0")],
        4,
        ["OK", "OK", "OK", "OVER_LIMIT"],
    ),
    (
        "envoy_gateway",
        "default/eg/http",
        [(EG_HEADERS, EG_HEADERS), ("rule-0-match-0", "x-user-id"), ("rule-0-match-1", "ann")],
        3,
        ["OK", "OK", "OVER_LIMIT"],
    ),
    (
        "envoy_gateway",
        "default/eg/https",
        [(EG_API, EG_API), ("masked_remote_address", "192.168.0.0/16"), ("remote_address", "a")],
        3,
        ["OK", "OK", "OVER_LIMIT"],
    ),
    (
        "envoy_gateway",
        "default/eg/https",
        [(EG_API, EG_API), ("masked_remote_address", "10.0.0.0/8")],
        5,
        ["OK"] * 4 + ["OVER_LIMIT"],
    ),
    # Shadow mode: over its limit, and still let through.
    (
        "envoy_gateway",
        "tenants/gw/grpc",
        [(EG_GRPC, EG_GRPC), ("rule-0-match--1", "rule-0-match--1")],
        2,
        ["OK", "OK"],
    ),
    (
        "envoy_gateway",
        "tenants/gw/grpc",
        [(EG_GRPC, EG_GRPC), ("rule-1-match-0", "rule-1-match-0")],
        1,
        ["OVER_LIMIT"],
    ),
    ("istio", "ratelimit", [("PATH", "/productpage")], 2, ["OK", "OVER_LIMIT"]),
    ("istio", "ratelimit", [("PATH", "/reviews")], 4, ["OK", "OK", "OK", "OVER_LIMIT"]),
    ("istio", "ratelimit", [("PATH", "/other")], 3, ["OK"] * 3),
    ("istio", "ratelimit", [("header_match", "no_user")], 3, ["OK", "OK", "OVER_LIMIT"]),
    ("reference", "sms", [("to_number", "2055551212")], 200, ["OK"] * 200),
    (
        "reference",
        "sms",
        [("message_type", "marketing"), ("to_number", "2061111111")],
        6,
        ["OK"] * 5 + ["OVER_LIMIT"],
    ),
    ("reference", "edge_proxy_per_ip", [("remote_address", "50.0.0.5")], 2, ["OK", "OVER_LIMIT"]),
    ("reference", "edge_proxy_per_ip", [("bay", "test")], 2, ["OK", "OK"]),
]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_check_loads_each_generated_directory_without_a_warning(name: str, tmp_path: Path) -> None:
    """`ferryman check` loads every corpus directory, with no warning and every limit listed."""
    directory = GENERATED / name
    result = ferryman("check", str(directory), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning:" not in result.stdout
    domains, limits = CORPUS[name]
    assert result.stdout.splitlines()[-1] == f"OK: {domains} domain(s), {limits} limit(s)"


@pytest.mark.parametrize(("name", "domain", "entries", "count", "expected"), DECISIONS)
def test_a_server_on_each_generated_directory_decides_as_the_reference(
    make_server: ServerFactory,
    name: str,
    domain: str,
    entries: list[tuple[str, str]],
    count: int,
    expected: list[str],
) -> None:
    """A server on a corpus directory answers each request as the reference would."""
    server = make_server(config_dir=GENERATED / name)
    got = [codes(server.ask(domain, entries))[0] for _ in range(count)]
    assert got == expected


def y(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def load(text: str, *, strict: bool = False) -> Config:
    return load_sources([("cfg.yaml", y(text))], strict=strict)


def problems(text: str, *, strict: bool = False) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as info:
        load(text, strict=strict)
    return info.value.problems


def rule(config: Config, domain: str, *path: tuple[str, str]) -> Rule:
    level = config.domains[domain].root
    found: Rule | None = None
    for key, value in path:
        found = level.match(key, value)
        assert found is not None, f"no rule for {key}={value}"
        level = found.children
    assert found is not None
    return found


def test_a_generated_file_with_every_default_spelled_out_loads_without_a_warning() -> None:
    """A top-level name, null limits, empty lists and strings and explicit false all load."""
    config = load(
        """
        name: default/eg/http
        domain: default/eg/http
        descriptors:
          - key: route
            value: route
            rate_limit: null
            descriptors:
              - key: rule
                value: ""
                rate_limit:
                  requests_per_unit: 7
                  unit: YEAR
                  unlimited: false
                  name: ""
                  replaces: []
                descriptors: []
                shadow_mode: false
                quota_mode: false
                detailed_metric: false
                value_to_metric: false
                share_threshold: false
            shadow_mode: ~
            metadata: null
        """
    )
    assert config.warnings == ()
    assert rule(config, "default/eg/http", ("route", "route")).limit is None
    limit = rate_of(rule(config, "default/eg/http", ("route", "route"), ("rule", "x")))
    assert (limit.requests_per_unit, limit.unit) == (7, Unit.YEAR)


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("requests_per_unit: null", 0),
        ("requests_per_unit: 0x10", 16),
        ("requests_per_unit: 0o17", 15),
        ("requests_per_unit: 1_000", 1000),
        ("requests_per_unit: 017", 15),
    ],
)
def test_counts_read_as_the_reference_reads_whole_numbers(field: str, expected: int) -> None:
    """A null count is 0, and Go's base prefixes and underscores are read as the reference does."""
    config = load(
        f"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, {field}}}\n"
    )
    assert rate_of(rule(config, "d", ("k", "v"))).requests_per_unit == expected


def test_y_and_n_are_booleans_as_the_reference_reads_them() -> None:
    """`shadow_mode: y` turns shadow mode on, as YAML 1.1 booleans do for the reference."""
    config = load(
        "domain: d\ndescriptors:\n  - {key: a, shadow_mode: y}\n  - {key: b, shadow_mode: N}\n"
    )
    assert rule(config, "d", ("a", "")).shadow_mode
    assert not rule(config, "d", ("b", "")).shadow_mode


# (YAML, (line, path, part of the warning)): files the reference loads, with what ferryman
# warns of (and refuses under STRICT_CONFIG).
WARNED = [
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            unit: second
            rate_limit: {unit: minute, requests_per_unit: 1}
        """,
        (4, "descriptors[0].unit", "'unit' is not read here: ignored"),
        id="reference-key-in-a-descriptor",
    ),
    pytest.param(
        """
        domain: d
        key: k
        """,
        (2, "key", "'key' is not read here: ignored"),
        id="reference-key-beside-the-domain",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: minute, requests_per_unit: 1, shadow_mode: true}
        """,
        (4, "descriptors[0].rate_limit.shadow_mode", "'shadow_mode' is not read here"),
        id="reference-key-in-a-rate-limit",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            name: lonely
        """,
        (4, "descriptors[0].name", "goes with burst_tiers"),
        id="node-level-name-without-tiers",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            value: a
            value: b
        """,
        (5, "descriptors[0].value", "'value' appears twice (first on line 4)"),
        id="repeated-key",
    ),
    pytest.param(
        """
        domain: d
        ---
        domain: e
        """,
        (3, "", "YAML document 2 is not read"),
        id="second-document",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            rate_limit: {unlimited: true, unit: fortnight}
        """,
        (4, "descriptors[0].rate_limit.unit", "'fortnight' is not a unit: ignored"),
        id="unlimited-with-a-non-unit",
    ),
]


@pytest.mark.parametrize(("text", "expected"), WARNED)
def test_what_the_reference_accepts_loads_with_a_warning_and_strict_refuses_it(
    text: str, expected: tuple[int, str, str]
) -> None:
    """A file the reference loads loads with one warning naming its line and path; under
    STRICT_CONFIG that warning refuses the file."""
    line, path, part = expected
    (warning,) = load(text).warnings
    assert (warning.file, warning.line, warning.path) == ("cfg.yaml", line, path)
    assert part in warning.message
    (problem,) = problems(text, strict=True)
    assert (problem.line, problem.path) == (line, path)
    assert part in problem.message and "STRICT_CONFIG" in problem.message


def test_the_last_of_a_repeated_key_is_read_and_a_repeated_rate_limit_merges() -> None:
    """A repeated key is read from its last place; a repeated rate_limit map keeps what the
    later one does not set, as the reference decodes both into one."""
    config = load(
        """
        domain: d
        descriptors:
          - key: k
            value: a
            value: b
            rate_limit: {unit: second, requests_per_unit: 5}
            rate_limit: {requests_per_unit: 9}
        """
    )
    limit = rate_of(rule(config, "d", ("k", "b")))
    assert (limit.requests_per_unit, limit.unit) == (9, Unit.SECOND)
    assert config.domains["d"].root.match("k", "a") is None


def test_only_the_first_document_of_a_file_is_read() -> None:
    """A file of several YAML documents is its first one, as the reference reads it."""
    config = load("domain: d\n---\ndomain: e\n")
    assert set(config.domains) == {"d"}


# (YAML, (line, path, part of the problem), part of what the reference does).
REFUSED = [
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: "5"}
        """,
        (4, "descriptors[0].rate_limit.requests_per_unit", "expected a whole number"),
        "refuses this file too: at descriptors[0].rate_limit.requests_per_unit: "
        "cannot unmarshal !!str `5` into uint32",
        id="count-as-a-string",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 5.0}
        """,
        (4, "descriptors[0].rate_limit.requests_per_unit", "a number with a fraction"),
        "",
        id="count-as-a-float",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            value: 1.5
        """,
        (4, "descriptors[0].value", "a number with a fraction"),
        "",
        id="value-as-a-float",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            rate_limit: {unit: second, requests_per_unit: 1:30}
        """,
        (4, "descriptors[0].rate_limit.requests_per_unit", "expected a whole number"),
        "cannot unmarshal !!int `1:30` into uint32",
        id="base-60-count",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            unit: {bogus: 1}
        """,
        (4, "descriptors[0].unit", "unknown key 'bogus': the reference refuses the file"),
        "",
        id="unknown-key-under-an-ignored-key",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            rate_limit: {unlimited: true, unit: second}
        """,
        (4, "descriptors[0].rate_limit.unit", "cannot have a unit (the reference refuses it"),
        "",
        id="unlimited-with-a-unit",
    ),
    pytest.param(
        """
        domain: d
        descriptors:
          - key: k
            token_bucket: {capacity: -1, refill: 1/s}
        """,
        (4, "descriptors[0].token_bucket.capacity", ""),
        "refuses this file too: at descriptors[0]: unknown key 'token_bucket'",
        id="ferryman-key",
    ),
]


@pytest.mark.parametrize(("text", "expected", "reference"), REFUSED)
def test_each_refusal_names_its_place_and_what_the_reference_does(
    text: str, expected: tuple[int, str, str], reference: str
) -> None:
    """A refused file names the line and path of each problem, and what the reference does
    with the file."""
    line, path, part = expected
    found = problems(text)
    assert [(p.line, p.path) for p in found][:1] == [(line, path)]
    assert part in found[0].message
    assert "the reference" in found[0].message
    assert reference in found[0].message


def test_check_prints_warnings_with_their_line_and_strict_config_refuses(tmp_path: Path) -> None:
    """`ferryman check` prints each warning with file and line; STRICT_CONFIG=true exits 1."""
    directory = tmp_path / "descriptors"
    directory.mkdir()
    file = directory / "d.yaml"
    file.write_text("domain: d\ndescriptors:\n  - key: k\n    unit: second\n")
    result = ferryman("check", str(directory), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"warning: {file}:4:5: descriptors[0].unit: 'unit' is not read here" in result.stdout
    strict = ferryman("check", str(directory), cwd=tmp_path, env={"STRICT_CONFIG": "true"})
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert f"error: {file}:4:5: descriptors[0].unit:" in strict.stdout


def test_the_server_logs_each_warning_of_the_config_it_loads(tmp_path: Path) -> None:
    """`ferryman serve` logs each warning of the files it loads, with file and line."""
    directory = tmp_path / "descriptors"
    directory.mkdir()
    (directory / "d.yaml").write_text("name: d\ndomain: d\ndescriptors:\n  - {key: k, unit: day}\n")
    process = ServeProcess(tmp_path, {}, "--config", str(directory))
    try:
        process.wait_serving()
        wait_for("the warning", lambda: "config warning:" in process.text)
        assert "d.yaml:4:14: descriptors[0].unit: 'unit' is not read here" in process.text
        assert process.stop() == 0
    finally:
        process.kill()
