"""Releases: the version is written once and the changelog agrees with it, `ferryman --version`
names the commit of a checkout, and `python -m build` gives an sdist and a wheel that
`twine check` accepts and that install and run in a fresh virtual environment."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from ferryman import __version__
from ferryman._version import commit, describe

ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = ROOT / "CHANGELOG.md"
SECTION = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$")
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
# The package's data files, which a wheel that runs must carry besides the modules.
DATA = ("*.lua", "*.proto", "*.html", "*.js", "*.css", "py.typed")


def _sections() -> list[tuple[str, str | None, list[str]]]:
    """The changelog's `## [name] - date` sections, each with its lines."""
    sections: list[tuple[str, str | None, list[str]]] = []
    for line in CHANGELOG.read_text().splitlines():
        if line.startswith("## "):
            match = SECTION.match(line)
            assert match, f"not a Keep a Changelog heading: {line!r}"
            sections.append((match["name"], match["date"], []))
        elif sections:
            sections[-1][2].append(line)
    return sections


def test_the_version_is_written_once_and_read_by_the_build() -> None:
    """pyproject.toml holds no version of its own: it reads ferryman/_version.py."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "ferryman._version.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_changelog_has_a_section_for_this_version() -> None:
    """CHANGELOG.md keeps Keep a Changelog's form: Unreleased first, then a dated section per
    version, newest first, the first of them this version, each with entries under its kinds."""
    sections = _sections()
    assert CHANGELOG.read_text().startswith("# Changelog\n")
    assert sections[0][0] == "Unreleased"
    released = sections[1:]
    assert released and released[0][0] == __version__
    versions = [tuple(int(part) for part in name.split(".")) for name, _, _ in released]
    assert versions == sorted(versions, reverse=True)
    for name, date, lines in released:
        assert date is not None, f"[{name}] has no date"
        kinds = {line[4:] for line in lines if line.startswith("### ")}
        assert kinds and kinds <= KINDS, f"[{name}]: {kinds}"
        assert any(line.startswith("- ") for line in lines), f"[{name}] lists no change"


def _git(root: Path, *args: str) -> str:
    identity = ["-c", "user.name=ferryman", "-c", "user.email=ferryman@example.invalid"]
    result = subprocess.run(
        ["git", "-C", str(root), *identity, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_version_names_the_commit_of_a_checkout(tmp_path: Path) -> None:
    """From a git checkout of the project the version line names its commit; from a folder
    without one, or from another project's work tree, it names none."""
    if shutil.which("git") is None:
        pytest.fail("git is not installed")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text('[project]\nname = "ferryman"\n')
    _git(checkout, "init", "-q")
    _git(checkout, "add", "pyproject.toml")
    _git(checkout, "commit", "-q", "-m", "first")
    head = _git(checkout, "rev-parse", "--short", "HEAD")
    assert commit(checkout) == head
    assert describe(checkout) == f"ferryman {__version__} (commit {head})"
    (checkout / "pyproject.toml").unlink()
    assert commit(checkout) is None
    assert commit(tmp_path) is None
    assert describe(tmp_path) == f"ferryman {__version__}"


def _build(tmp_path: Path) -> Path:
    """`python -m build` on a copy of what the build reads (the checkout stays untouched)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "service", source / "service", ignore=ignore)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return dist


def _clean_env() -> dict[str, str]:
    """The environment less PYTHONPATH and friends, so that only the venv's packages count."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


@pytest.mark.slow
def test_built_wheel_installs_and_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    """The sdist and wheel pass twine check; the wheel, carrying the package's data files,
    installs in a fresh venv, where `ferryman --version` and `ferryman check` work."""
    dist = _build(tmp_path)
    [sdist] = dist.glob(f"ferryman-{__version__}.tar.gz")
    [wheel] = dist.glob(f"ferryman-{__version__}-py3-none-any.whl")
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert twine.returncode == 0, twine.stdout + twine.stderr
    package = ROOT / "service" / "ferryman"
    wanted = {
        "ferryman/" + path.relative_to(package).as_posix()
        for pattern in DATA
        for path in package.rglob(pattern)
        if "__pycache__" not in path.parts
    }
    assert wanted <= set(zipfile.ZipFile(wheel).namelist())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, env = str(venv / "bin" / "python"), _clean_env()
    _lend_dependencies(python, env)
    pip = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall"]
    subprocess.run([*pip, str(wheel)], env=env, check=True, timeout=300)
    where = subprocess.run(
        [python, "-c", "import ferryman; print(ferryman.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    _runs_from_the_venv(venv, env)


def _lend_dependencies(python: str, env: dict[str, str]) -> None:
    """The dependencies come from the environment running the suite (where the README's
    command installed them), listed after the venv's own site-packages: ferryman itself
    comes from the wheel. A venv made with --system-site-packages would see the base
    interpreter's packages instead, which a virtual environment's install never reaches.
    Listed as plain paths, the lent directories' own .pth files (an editable install of
    ferryman among them) are not read."""
    lent = [p for p in site.getsitepackages() if Path(p).is_dir()]
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(own) / "lent-dependencies.pth").write_text("\n".join(lent) + "\n")


def _runs_from_the_venv(venv: Path, env: dict[str, str]) -> None:
    """The venv's `ferryman` prints its version (no commit: not a checkout) and checks the
    repository's descriptors."""
    ferryman = str(venv / "bin" / "ferryman")
    version = subprocess.run(
        [ferryman, "--version"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (version.returncode, version.stdout) == (0, f"ferryman {__version__}\n")
    check = subprocess.run(
        [ferryman, "check", "descriptors/"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.splitlines()[-1].startswith("OK:"), check.stdout
