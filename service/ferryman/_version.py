"""The package version, importable without the rest of the package.

``__version__`` is the one place the version is written: pyproject.toml reads it when the
package is built; CHANGELOG.md's latest section (tests/test_release.py) and the Dockerfile's
VERSION (tests/test_dockerfile.py) are checked against it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__version__ = "0.1.0"

# service/ferryman/_version.py: two folders below a checkout's root.
_CHECKOUT = Path(__file__).resolve().parents[2]


def commit(root: Path = _CHECKOUT) -> str | None:
    """The short hash of the commit checked out at ``root``, or None when ``root`` is not a
    git checkout of this project (an installed wheel) or git cannot tell."""
    # Both marks, so that a wheel installed under some other git work tree names no commit.
    if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
        return None
    try:
        result = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    head = result.stdout.strip()
    return head if result.returncode == 0 and head else None


def describe(root: Path = _CHECKOUT) -> str:
    """What ``ferryman --version`` prints: the version, and the commit from a checkout."""
    head = commit(root)
    return f"ferryman {__version__}" + ("" if head is None else f" (commit {head})")
