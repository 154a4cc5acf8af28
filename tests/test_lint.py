"""The code base, service and tests alike, passes ruff (lint and format) and mypy --strict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "service", "tests", "examples"],
        ["ruff", "format", "--check", "service", "tests", "examples"],
        ["mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tool_passes(command: list[str]) -> None:
    """The tool exits 0 over the whole tree."""
    result = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
