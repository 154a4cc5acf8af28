"""burst_tiers, hard_limit and global_limit in descriptor YAML: parsing, errors, normalization."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ferryman.algorithms.burst.model import BurstPolicy, Tier
from ferryman.config import load_sources
from ferryman.errors import ConfigError


def policy_of(text: str) -> BurstPolicy:
    config = load_sources([("b.yaml", text)])
    burst = config.domains["d"].root.rules[0].limit
    assert isinstance(burst, BurstPolicy)
    return burst


def test_durations_limits_and_flags_are_read() -> None:
    """Durations accept ms, s, m, h, d and plain seconds; limits and skippable are kept."""
    policy = policy_of(
        """
domain: d
descriptors:
  - key: user
    hard_limit: 20
    global_limit: 1000
    burst_tiers:
      - {limit: 5, window: 500ms, active: 1h, cooldown: 0}
      - {limit: 50, window: 1s, active: 5m, cooldown: 1d, skippable: true}
      - {limit: 9, window: 2, active: 10}
"""
    )
    assert policy == BurstPolicy(
        (
            Tier(5, 0.5, 3600.0, 0.0),
            Tier(50, 1.0, 300.0, 86400.0, True),
            Tier(9, 2.0, 10.0, 0.0),
        ),
        hard_limit=20,
        global_limit=1000,
    )


def test_empty_tier_list_makes_an_inaccessible_node() -> None:
    """burst_tiers: [] is legal: the node has n = 0 tiers."""
    assert policy_of("domain: d\ndescriptors:\n  - key: k\n    burst_tiers: []\n").tiers == ()


@pytest.mark.parametrize(
    ("body", "line", "path", "message"),
    [
        (
            "    rate_limit: {unit: second, requests_per_unit: 1}\n"
            "    burst_tiers: [{limit: 1, window: 1s, active: 1h}]\n",
            5,
            "descriptors[0].burst_tiers",
            "not both rate_limit and burst_tiers",
        ),
        (
            "    burst_tiers: [{limit: -1, window: 1s, active: 1h}]\n",
            4,
            "descriptors[0].burst_tiers[0].limit",
            "out of range",
        ),
        (
            "    burst_tiers: [{limit: 1, active: 1h}]\n",
            4,
            "descriptors[0].burst_tiers[0]",
            "needs 'window'",
        ),
        (
            "    burst_tiers: [{limit: 1, window: soon, active: 1h}]\n",
            4,
            "descriptors[0].burst_tiers[0].window",
            "duration",
        ),
        (
            "    burst_tiers: [{limit: 1, window: 0s, active: 1h}]\n",
            4,
            "descriptors[0].burst_tiers[0].window",
            "positive",
        ),
        (
            "    burst_tiers: [{limit: 1, window: 1s, active: 1h, speed: 3}]\n",
            4,
            "descriptors[0].burst_tiers[0].speed",
            "unknown key",
        ),
        (
            "    name: me\n    replaces: [{name: me}]\n"
            "    burst_tiers: [{limit: 1, window: 1s, active: 1h}]\n",
            5,
            "descriptors[0].replaces[0]",
            "replaces itself",
        ),
        (
            "    hard_limit: 5\n",
            4,
            "descriptors[0].hard_limit",
            "needs burst_tiers",
        ),
        (
            "    global_limit: 5\n    burst_tiers: {limit: 1}\n",
            5,
            "descriptors[0].burst_tiers",
            "list of tiers",
        ),
    ],
)
def test_invalid_burst_config_is_rejected_with_location(
    body: str, line: int, path: str, message: str
) -> None:
    """Each mistake is reported with the file, line and YAML path."""
    text = "domain: d\ndescriptors:\n  - key: user\n" + body
    with pytest.raises(ConfigError) as info:
        load_sources([("b.yaml", text)])
    problems = [p for p in info.value.problems if p.path == path]
    assert problems, info.value.problems
    assert problems[0].file == "b.yaml"
    assert problems[0].line == line
    assert message in problems[0].message


NORMALIZE = """
domain: d
descriptors:
  - key: user
    burst_tiers:
      - {limit: 5, window: 1s, active: 0}
      - {limit: 9, window: 10m, active: 5m}
      - {limit: 7, window: 2s, active: 5s, cooldown: 1s}
"""


def test_normalization_drops_cuts_and_trims_tiers_and_says_so() -> None:
    """Active 0 drops a tier, a window longer than active is cut, active is trimmed."""
    config = load_sources([("b.yaml", NORMALIZE)])
    burst = config.domains["d"].root.rules[0].limit
    assert isinstance(burst, BurstPolicy)
    assert burst.tiers == (Tier(9, 300.0, 300.0), Tier(7, 2.0, 4.0, 1.0))
    notes = "\n".join(config.notes)
    assert "burst_tiers[0]: dropped (active period 0)" in notes
    assert "window 600s cut to the active period 300s" in notes
    assert "active period 5s trimmed to 4s" in notes


def test_check_prints_normalization_and_the_tiers(tmp_path: Path) -> None:
    """`ferryman check` prints each normalization note and the normalized tiers."""
    (tmp_path / "b.yaml").write_text(NORMALIZE)
    result = subprocess.run(
        [sys.executable, "-m", "ferryman", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "note: " in result.stdout
    assert "trimmed to 4s" in result.stdout
    assert "burst_tiers [9/300s active 300s cooldown 0s; 7/2s active 4s cooldown 1s]" in (
        result.stdout
    )
