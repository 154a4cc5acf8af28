"""Running ``ferryman envoy ...`` in this process, with its exit status and output."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ferryman.cli import main


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def envoy_cli(capsys: pytest.CaptureFixture[str], *args: str) -> Run:
    """``ferryman envoy ARGS``: the exit status and what it printed."""
    capsys.readouterr()
    code = main(["envoy", *args])
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)
