"""`ferryman check` and `ferryman serve` as real processes against descriptor directories."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ferryman.config.loader import load_directory

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
REPO_DESCRIPTORS = TESTS.parent / "descriptors"

# error: <file>:<line>:<column>: [<path>: ]<message>
ERROR_LINE = re.compile(
    r"^error: (?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): "
    r"(?:(?P<path>[A-Za-z_][\w\[\].]*): )?(?P<message>.+)$"
)


def ferryman(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ferryman ARGS`` with none of the service's environment variables set."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    if "PYTHONPATH" in os.environ:  # import the same ferryman as this test process
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        [sys.executable, "-m", "ferryman", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# Directory under tests/data -> every error `check` must print: (file, line, path, message part).
BAD_DIRS: dict[str, list[tuple[str, int, str | None, str]]] = {
    "bad_unknown_key": [
        ("x.yaml", 3, "descriptor", "unknown key 'descriptor'"),
        ("x.yaml", 7, "descriptors[0].ratelimit", "unknown key 'ratelimit'"),
        (
            "x.yaml",
            13,
            "descriptors[1].rate_limit.request_per_unit",
            "unknown key 'request_per_unit'",
        ),
    ],
    "bad_duplicate_domain": [
        ("b.yaml", 2, "domain", "domain 'shared' is already defined in {dir}/a.yaml"),
    ],
    "bad_syntax": [
        ("x.yaml", 6, None, "YAML syntax error"),
    ],
    "bad_nested": [
        (
            "x.yaml",
            14,
            "descriptors[0].descriptors[1].descriptors[0].rate_limit.unit",
            "invalid unit 'fortnight'",
        ),
        (
            "x.yaml",
            16,
            "descriptors[0].descriptors[2]",
            "duplicate descriptor 'plan_free' (already defined at descriptors[0].descriptors[0])",
        ),
        ("x.yaml", 21, "descriptors[1].rate_limit.unit", "'unlimited: true' cannot have a unit"),
        ("x.yaml", 24, "descriptors[2].share_threshold", "needs a wildcard value"),
        ("x.yaml", 29, "descriptors[3].rate_limit.requests_per_unit", "expected a whole number"),
        ("x.yaml", 31, "descriptors[3].rate_limit.replaces[0]", "'per_user' replaces itself"),
        ("x.yaml", 32, "descriptors[4].key", "descriptor key must not be empty"),
        ("x.yaml", 33, "descriptors[4].shadow_mode", "expected true or false"),
    ],
    "bad_one_file_of_many": [
        ("wrong.yaml", 5, "descriptors[0].rate_limit.requests_per_unit", "-5 is out of range"),
    ],
}


@pytest.mark.parametrize("name", sorted(BAD_DIRS))
def test_check_prints_every_error_with_file_line_and_path(name: str, tmp_path: Path) -> None:
    """`ferryman check BAD_DIR` exits 1 and prints each error as file:line:column: path: message."""
    directory = DATA / name
    result = ferryman("check", str(directory), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    errors = [m for m in map(ERROR_LINE.match, lines) if m]
    assert len(errors) == len([ln for ln in lines if ln.startswith("error:")])
    got = sorted(
        (Path(m["file"]).relative_to(directory).as_posix(), int(m["line"]), m["path"])
        for m in errors
    )
    expected = BAD_DIRS[name]
    assert got == sorted((f, line, path) for f, line, path, _ in expected)
    messages = {(Path(m["file"]).name, int(m["line"])): m["message"] for m in errors}
    for file, line, _, fragment in expected:
        assert fragment.format(dir=directory) in messages[(file, line)]
    assert lines[-1] == f"{len(expected)} error(s) in {directory}"
    assert "OK:" not in result.stdout


def test_check_accepts_a_good_directory_and_lists_its_limits(tmp_path: Path) -> None:
    """`ferryman check GOOD_DIR` exits 0 listing its limits; dotfiles and *.txt are skipped."""
    directory = DATA / "good"
    result = ferryman("check", str(directory), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"domain edge ({directory / 'edge.yaml'})",
        "  edge.remote_address: 100/minute name=per_ip",
        "  edge.header_match_partner: 1000/minute name=partners",
        "  edge.path_/api/*: 10/second [shadow_mode]",
        "  edge.sender_internal-*: unlimited",
        f"domain messaging ({directory / 'sub' / 'messaging.yml'})",
        "  messaging.message_type_marketing.to_number: 5/day [quota_mode]",
        "OK: 2 domain(s), 5 limit(s)",
    ]
    assert result.stderr == ""


def test_check_accepts_the_repo_descriptors(tmp_path: Path) -> None:
    """`ferryman check descriptors/` exits 0 listing every domain and limit of the repo."""
    config = load_directory(REPO_DESCRIPTORS)
    result = ferryman("check", str(REPO_DESCRIPTORS), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    domains = sorted(ln.split()[1] for ln in out if ln.startswith("domain "))
    assert domains == sorted(config.domains)
    limits = [ln.split(":")[0].strip() for ln in out if ln.startswith("  ")]
    assert limits == [rule.stats_key for _, rule in config.iter_limits()]
    assert out[-1] == f"OK: {len(config.domains)} domain(s), {len(limits)} limit(s)"


def test_check_rejects_a_missing_directory(tmp_path: Path) -> None:
    """`ferryman check` on a path that does not exist is a usage error: exit 2 naming it."""
    missing = tmp_path / "no-such-dir"
    result = ferryman("check", str(missing), cwd=tmp_path)
    assert result.returncode == 2
    assert f"config directory {missing} does not exist" in result.stderr
