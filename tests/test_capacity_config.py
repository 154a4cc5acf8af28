"""Resources files: Doorman's YAML shape read into templates, errors with file, line and path,
and resources shown by ``ferryman check`` and in the reload summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ferryman.algorithms.leases import AlgorithmSpec, Kind, find_template
from ferryman.config.loader import load_sources
from ferryman.config.reloader import describe_change
from ferryman.errors import ConfigError

GOOD = """\
resources:
  - identifier_glob: api_exact
    capacity: 500
    safe_capacity: 10
    description: one API's QPS
    algorithm:
      kind: PROPORTIONAL_SHARE
      lease_length: 60
      refresh_interval: 15
      learning_mode_duration: 0
      parameters:
        - {name: note, value: kept}
  - identifier_glob: api_*
    capacity: 1000.5
    algorithm: {kind: FAIR_SHARE, lease_length: 30, refresh_interval: 5}
  - identifier_glob: "*"
    capacity: 0
    safe_capacity: -1
    algorithm: {kind: NO_ALGORITHM, lease_length: 300, refresh_interval: 60}
"""

DOMAIN = (
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
)


def test_a_resources_file_reads_into_templates_beside_domains() -> None:
    """A file with top-level resources: is read as templates; other files stay domains."""
    config = load_sources([("res.yaml", GOOD), ("d.yaml", DOMAIN)])
    assert list(config.domains) == ["d"]
    exact, glob, star = config.resources
    assert exact.identifier_glob == "api_exact"
    assert (exact.capacity, exact.safe_capacity, exact.description) == (500, 10, "one API's QPS")
    assert exact.algorithm == AlgorithmSpec(Kind.PROPORTIONAL_SHARE, 60, 15, 0, (("note", "kept"),))
    assert glob.algorithm.learning_mode_duration is None
    assert glob.algorithm.learning_seconds == 30
    assert (star.safe_capacity, star.algorithm.kind) == (-1, Kind.NO_ALGORITHM)
    assert exact.source == "res.yaml:2"


def test_lookup_prefers_an_exact_id_then_the_first_matching_glob() -> None:
    """An exact identifier_glob wins over an earlier glob; else the first glob in file order."""
    templates = load_sources([("res.yaml", GOOD)]).resources
    assert find_template(templates, "api_exact") is templates[0]
    assert find_template(templates, "api_other") is templates[1]
    assert find_template(templates, "else") is templates[2]
    first = load_sources([("r.yaml", GOOD.replace("api_exact", "api_*x", 1))]).resources
    assert find_template(first, "api_x") is first[0]


BAD = [
    ("resources: 3\n", 1, "resources", "expected a list of resource templates"),
    ("resources:\n  - capacity: 1\n", 2, "resources[0].identifier_glob", "must not be empty"),
    (
        "resources:\n  - identifier_glob: a\n    capacity: -1\n",
        3,
        "resources[0].capacity",
        "out of range",
    ),
    (
        "resources:\n  - identifier_glob: a\n    capacity: 1\n    algorithm:\n"
        "      kind: BEST\n      lease_length: 5\n      refresh_interval: 1\n",
        5,
        "resources[0].algorithm.kind",
        "'BEST' is not one of",
    ),
    (
        "resources:\n  - identifier_glob: a\n    capacity: 1\n    algorithm:\n"
        "      kind: STATIC\n      lease_length: 5\n      refresh_interval: 10\n",
        7,
        "resources[0].algorithm.refresh_interval",
        "longer than lease_length",
    ),
    (
        "resources:\n  - identifier_glob: a\n    capacity: 1\n    algorithm:\n"
        "      kind: STATIC\n      lease_length: 1.5\n      refresh_interval: 1\n",
        6,
        "resources[0].algorithm.lease_length",
        "expected a whole number",
    ),
    (
        "resources:\n  - identifier_glob: a\n    capacity: 1\n    colour: red\n"
        "    algorithm: {kind: STATIC, lease_length: 5, refresh_interval: 1}\n",
        4,
        "resources[0].colour",
        "unknown key 'colour'",
    ),
    (
        "resources:\n  - identifier_glob: a\n    capacity: 1\n    safe_capacity: -0.5\n"
        "    algorithm: {kind: STATIC, lease_length: 5, refresh_interval: 1}\n",
        4,
        "resources[0].safe_capacity",
        "-1 (unlimited) or at least 0",
    ),
    (
        "resources:\n  - identifier_glob: a\n    capacity: 1\n",
        2,
        "resources[0].algorithm",
        "missing",
    ),
]


@pytest.mark.parametrize(("text", "line", "path", "message"), BAD)
def test_each_problem_names_file_line_and_path(
    text: str, line: int, path: str, message: str
) -> None:
    """A bad template is refused with its file, line and YAML path."""
    with pytest.raises(ConfigError) as info:
        load_sources([("res.yaml", text)])
    problems = [p for p in info.value.problems if p.path == path]
    assert problems, [str(p) for p in info.value.problems]
    assert problems[0].file == "res.yaml"
    assert problems[0].line == line
    assert message in problems[0].message


def test_a_glob_defined_twice_across_files_is_an_error_naming_the_first() -> None:
    """The same identifier_glob in two files is refused, naming where it was first."""
    with pytest.raises(ConfigError) as info:
        load_sources([("a.yaml", GOOD), ("b.yaml", GOOD)])
    first = info.value.problems[0]
    assert (first.file, first.line, first.path) == ("b.yaml", 2, "resources[0]")
    assert "already defined at a.yaml:2" in first.message


def test_reload_summary_counts_and_notices_resources() -> None:
    """The reload line counts capacity resources and says when they changed."""
    old = load_sources([("res.yaml", GOOD), ("d.yaml", DOMAIN)])
    new = load_sources([("res.yaml", GOOD.replace("1000.5", "7")), ("d.yaml", DOMAIN)])
    assert "3 capacity resources" in describe_change(None, old)
    assert "capacity resources changed" in describe_change(old, new)
    assert "capacity resources changed" not in describe_change(old, old)


def test_check_lists_resources(tmp_path: Path) -> None:
    """`ferryman check` prints every template and counts them."""
    (tmp_path / "res.yaml").write_text(GOOD)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [sys.executable, "-m", "ferryman", "check", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "resource api_*: capacity 1000.5, FAIR_SHARE lease 30s refresh 5s" in result.stdout
    assert "OK: 0 domain(s), 0 limit(s), 3 resource(s)" in result.stdout
