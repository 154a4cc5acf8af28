"""``ferryman simulate``: a traffic shape against burst tiers (and any other node) through
the real engine on a virtual clock, and Doorman's lease scenarios through the lease state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferryman.cli import main

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "examples" / "scenarios"

PENALTY = (
    "{burst_tiers: [{limit: 5, window: 1s, active: 1d, cooldown: 0},"
    " {limit: 50, window: 1s, active: 5s, cooldown: 15s}]}"
)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(list(argv)) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_a_steady_rate_bursts_into_the_second_tier_then_its_cooldown_holds_it_down(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """20 a second against 5/s with a 5 s burst tier and a 15 s cooldown: 5 seconds all
    granted in the upper tier, then 5 a second in the first tier until the cooldown ends,
    then the upper tier again."""
    found = run_json(
        capsys,
        "simulate",
        "tiers",
        "--node",
        PENALTY,
        "--rate",
        "20",
        "--seconds",
        "30",
        "--format",
        "json",
    )
    rows = found["per_second"]
    assert isinstance(rows, list)
    assert [r["granted"] for r in rows[:5]] == [20] * 5
    assert [r["active_tier_index"] for r in rows[:5]] == [2] * 5
    assert [r["granted"] for r in rows[6:20]] == [5] * 14
    assert {r["active_tier_index"] for r in rows[6:20]} == {1}
    assert rows[21]["granted"] == 20 and rows[21]["active_tier_index"] == 2
    assert sum(r["asked"] for r in rows) == 600


def test_bursts_and_pauses_against_a_plain_window_are_asked_as_envoy_asks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A node of a kind that does not answer ferryman.v1's Request is asked through
    ShouldRateLimit: on 2 s, off 2 s at 4 a second plus a burst of 6, against 3 a second;
    the text output prints each second and --plot writes the SVG."""
    node = "{rate_limit: {unit: second, requests_per_unit: 3}}"
    base = ["simulate", "tiers", "--node", node, "--rate", "4", "--seconds", "6"]
    found = run_json(capsys, *base, "--on-off", "2:2", "--burst", "5:6", "--format", "json")
    rows = found["per_second"]
    assert isinstance(rows, list)
    assert [(r["asked"], r["granted"], r["refused"]) for r in rows] == [
        (4, 3, 1),
        (4, 3, 1),
        (0, 0, 0),
        (0, 0, 0),
        (4, 3, 1),
        (10, 3, 7),
    ]
    plot = tmp_path / "tiers.svg"
    assert main([*base, "--plot", str(plot)]) == 0
    text = capsys.readouterr().out
    assert "    0s asked    4 granted    3 refused    1  limit=3 remaining=0" in text
    assert plot.read_text().count("<polyline") == 3


def test_the_doorman_scenarios_report_capacity_used_and_peak(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The seed's scenarios ship as files; the crash scenario (spikes, joins, leaves, two
    server crashes) hands out at least 98% of the capacity when steady and never more than
    102% in any second."""
    assert {"doorman-one.yaml", "doorman-five.yaml", "doorman-seven.yaml"} <= {
        p.name for p in SCENARIOS.glob("*.yaml")
    }
    found = run_json(
        capsys, "simulate", "leases", str(SCENARIOS / "doorman-seven.yaml"), "--format", "json"
    )
    assert isinstance(found["capacity_used"], float) and found["capacity_used"] >= 0.98
    assert isinstance(found["peak"], float) and 0.9 < found["peak"] <= 1.02
    rows = found["per_second"]
    assert isinstance(rows, list) and len(rows) == 3600
    assert main(["simulate", "leases", str(SCENARIOS / "doorman-one.yaml"), "--every", "600"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert len(text) == 4 and text[-1].startswith("doorman-one: capacity used ")


def test_the_refresh_intervals_after_an_event_are_left_out_of_capacity_used(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Demand moving from one leaf of a tree to the other leaves capacity unused until the
    leases catch up: those seconds show in the per-second figures but not in the average
    of the steady seconds."""
    scenario = tmp_path / "shift.yaml"
    scenario.write_text(
        "seconds: 400\nseed: 3\nresource:\n  capacity: 100\n"
        "  algorithm: {kind: PROPORTIONAL_SHARE, lease_length: 30, refresh_interval: 10,"
        " learning_mode_duration: 0}\n"
        "tree: [2]\nclients: 2\nwants: 5\n"
        "events:\n  - {at: 100, spike: 2, add: 40, at_server: root/0}\n"
        "  - {at: 200, spike: 2, add: 200, at_server: root/1}\n"
    )
    found = run_json(capsys, "simulate", "leases", str(scenario), "--format", "json")
    rows = found["per_second"]
    assert isinstance(rows, list)
    assert min(r["handed"] for r in rows[200:260]) < 100
    assert found["capacity_used"] == 1.0 and found["peak"] == 1.0
    assert found["steady_seconds"] == 400 - 90
