"""The documentation: the MkDocs site builds with --strict (no broken link or anchor, no page
left out of the nav), and the README stays a short front door that keeps its two commands."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.needs import missing

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300
# CI and newcomers copy these two lines verbatim: they must stay exactly as written.
SET_UP_COMMANDS = (
    "pip install . && ferryman serve",
    "bash tests/bootstrap.sh && python -m pytest",
)


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project`` into ``site``, as a contributor runs it."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        missing("mkdocs-material is not installed (pip install -e '.[test]')")
    # The theme's banner about its future is not a problem with these pages.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy_project(tmp_path: Path) -> Path:
    """The site's sources (mkdocs.yml and docs/) copied where a test may break them."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(DOCS, project / "docs")
    return project


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds and writes one HTML page per Markdown page."""
    site = tmp_path / "site"
    result = _build(ROOT, site)
    assert result.returncode == 0, result.stdout + result.stderr
    for page in _pages():
        rel = page.relative_to(DOCS).with_suffix("")
        html = site / "index.html" if rel == Path("index") else site / rel / "index.html"
        assert html.is_file(), f"{page.relative_to(ROOT)} was not built"


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """A link to a page that does not exist, or to a heading a page lacks, fails the build."""
    project = _copy_project(tmp_path)
    index = project / "docs" / "index.md"
    index.write_text(
        index.read_text() + "\n[gone](operators/gone.md) [nowhere](operators/deploy.md#nowhere)\n"
    )
    result = _build(project, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "operators/gone.md" in output
    assert "nowhere" in output


def test_a_page_missing_from_the_nav_fails_the_build(tmp_path: Path) -> None:
    """A page under docs/ that the nav does not list fails the build."""
    project = _copy_project(tmp_path)
    (project / "docs" / "operators" / "orphan.md").write_text("# Orphan\n")
    result = _build(project, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "orphan.md" in output


def test_the_readme_is_short() -> None:
    """The README is a front door: at most 300 lines, the rest lives in the site."""
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_keeps_the_two_set_up_commands() -> None:
    """Both set-up commands appear in the README as a line of their own, exactly."""
    lines = [line.strip() for line in README.read_text().splitlines()]
    for command in SET_UP_COMMANDS:
        assert command in lines, f"README.md lost the command {command!r}"


def test_the_readmes_links_into_the_site_resolve() -> None:
    """Every link from the README into docs/ names a page that exists, and it links to every
    section of the site."""
    targets = re.findall(r"\]\((docs/[^)#\s]+)", README.read_text())
    assert targets, "README.md links to no page of the site"
    assert [t for t in targets if not (ROOT / t).is_file()] == []
    sections = {p.parent.name for p in _pages() if p.parent != DOCS}
    linked = {Path(t).parent.name for t in targets}
    assert sections <= linked, f"README.md links to no page of {sorted(sections - linked)}"


def _config_examples() -> list[tuple[str, str]]:
    """Each complete configuration file shown in docs/config/ (a YAML block that starts as a
    descriptor, resources or quota file does, with nothing elided), named by page and place."""
    found = []
    for page in sorted((DOCS / "config").glob("*.md")):
        blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
        for n, block in enumerate(blocks):
            complete = "[...]" not in block
            if complete and block.startswith(("domain:", "resources:", "global_default_bucket")):
                found.append((f"{page.stem}-{n}", block))
    return found


@pytest.mark.parametrize(
    ("name", "text"), [pytest.param(name, text, id=name) for name, text in _config_examples()]
)
def test_each_config_example_is_valid(name: str, text: str, tmp_path: Path) -> None:
    """`ferryman check` accepts every complete example a config author may copy."""
    (tmp_path / f"{name}.yaml").write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "ferryman", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_config_pages_show_examples() -> None:
    """Every kind of rule and file has a complete example that the test above checks."""
    shown = {name.rsplit("-", 1)[0] for name, _ in _config_examples()}
    kinds = {"fixed-window", "sliding-window", "token-bucket", "burst-tiers", "copies"}
    files = {"leased-limit", "resources", "quota-buckets"}
    assert kinds | files <= shown, sorted(kinds | files - shown)
