"""Nothing in the repository reads a file outside it: paths climbing above the root from a
source file, and references to folders that sit beside a checkout, are found by a scan of
the code (CI proves the same for real by running the suite from a copy in an empty folder)."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "service", "examples", "descriptors", "envoy", "k8s", ".ci")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".lua", ".json", ".cfg", ".ini", ""}
ALSO = ("Dockerfile", "pyproject.toml")

# Path(__file__)[.resolve()] followed by .parent... or .parents[N]: how far it climbs.
FROM_FILE = re.compile(
    r"__file__\s*\)(?:\.resolve\(\))?(?P<chain>(?:\.parent\b)*)(?:\.parents\[(?P<n>\d+)\])?"
)
# ../ sequences not part of a longer run of dots (".../name" is an ellipsis, not a climb).
UP = re.compile(r"(?<![.\w])((?:\.\./)+|\.\.(?=[\"']))")
# A folder that sits beside a checkout on a developer's machine, or an absolute home.
BESIDE = re.compile(r"\bROOT\.parent\b|ROOT\s*/\s*[\"']\.\.[\"']|shared/spec|[\"'](?:/work|/home)/")


def climbs(rel: PurePosixPath, text: str) -> list[str]:
    """Each place in a file's text that names a path above the repository root.

    ``rel`` is the file's path from the root: a file ``depth`` folders down may climb
    ``depth + 1`` parents from ``__file__`` (to the root) and ``depth`` folders with ``../``.
    """
    return [
        f"{rel}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if _climbs(len(rel.parts), line)
    ]


def _climbs(depth: int, line: str) -> bool:
    for match in FROM_FILE.finditer(line):
        levels = match.group("chain").count(".parent")
        if match.group("n") is not None:
            levels += int(match.group("n")) + 1
        if levels > depth:
            return True
    if any(match.group(1).count("..") > depth - 1 for match in UP.finditer(line)):
        return True
    return BESIDE.search(line) is not None


def scanned_files() -> list[Path]:
    """The repository's code and configuration files the scan reads."""
    files = [ROOT / name for name in ALSO]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix in SUFFIXES and path != Path(__file__).resolve():
                files.append(path)
    return files


def test_no_file_names_a_path_outside_the_repository() -> None:
    """No source, script or configuration file climbs above the root or reads beside it."""
    files = scanned_files()
    assert len(files) > 100, "the scan found too few files to mean anything"
    found: list[str] = []
    for path in files:
        rel = PurePosixPath(path.relative_to(ROOT).as_posix())
        found += climbs(rel, path.read_text(encoding="utf-8", errors="replace"))
    assert found == []


@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("tests/test_x.py", 'SPEC = Path(__file__).resolve().parents[2] / "beside"'),
        ("tests/test_x.py", "SPEC = Path(__file__).parent.parent.parent / 'x.proto'"),
        ("tests/e2e/x.py", "ROOT = Path(__file__).resolve().parents[3]"),
        ("tests/test_x.py", 'SPEC = ROOT.parent / "beside" / "x.proto"'),
        ("tests/test_x.py", 'SPEC = ROOT / ".." / "x.proto"'),
        ("tests/test_x.py", 'open("../../outside.txt")'),
        ("tests/test_x.py", 'SPEC = SPECS / "shared/spec/doorman.proto"'),
        ("service/ferryman/x.py", 'DATA = Path("/work/data/table.csv")'),
        ("k8s/overlays/x/kustomization.yaml", "  - ../../../../elsewhere"),
    ],
)
def test_the_scan_finds_each_kind_of_climb(rel: str, line: str) -> None:
    """Each way out of the repository is reported, with the file and line."""
    assert climbs(PurePosixPath(rel), f"# first line\n{line}\n") == [f"{rel}:2: {line.strip()}"]


@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("tests/test_x.py", "ROOT = Path(__file__).resolve().parents[1]"),
        ("tests/e2e/x.py", "ROOT = Path(__file__).resolve().parents[2]"),
        ("tests/test_x.py", "HERE = Path(__file__).parent.parent / 'descriptors'"),
        ("service/ferryman/_version.py", "root = Path(__file__).resolve().parents[2]"),
        ("k8s/overlays/x/kustomization.yaml", "  - ../../base"),
        ("tests/test_x.py", 'refused = ["../x.yaml"]  # refused by the API, never read'),
        ("service/ferryman/x.py", 'raise SettingsError("name the master, e.g. .../mymaster")'),
    ],
)
def test_paths_inside_the_repository_pass(rel: str, line: str) -> None:
    """Climbs that end at or below the root, and ellipses, are not reported."""
    assert climbs(PurePosixPath(rel), line) == []
