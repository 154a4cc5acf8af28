"""The decision log and ``ferryman replay``: a live server's log replayed gives the answers
the server gave; the log never blocks (dropped and counted), rotates at its cap; replay
compares two configs, reads Envoy access logs and draws its plot."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ferryman.cli import main
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.core.answers import Code, Decision, DescriptorRequest, Status
from ferryman.engine.observe import Seen
from ferryman.replay.decision_log import DecisionLog, read_log
from ferryman.replay.replay import replay
from ferryman.stats import Stats

from helpers.server import EPOCH, ConfigDir, ServerFactory, codes, descriptor, wait_for

REPO = Path(__file__).resolve().parent.parent

CONFIG = """
domain: web
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: job
    sliding_window: {unit: minute, requests_per_unit: 40}
  - key: tiers
    burst_tiers:
      - {limit: 2, window: 1s, active: 1h}
      - {limit: 5, window: 1s, active: 2s, cooldown: 10s}
"""


def _seen(t: float) -> Seen:
    decision = Decision(Code.OK, (Status(Code.OK),))
    return Seen(t, "web", (DescriptorRequest((("user", "u"),)),), 0, (None,), decision)


def test_a_live_servers_decision_log_replays_to_the_answers_it_gave(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock, tmp_path: Path
) -> None:
    """Traffic over gRPC on fixed windows, a sliding window and burst tiers, its time
    moving, is logged line by line; replaying the log in process gives, request by request,
    the codes the server answered, and the per-rule counts add up to them."""
    config_dir.write("web.yaml", CONFIG)
    log = tmp_path / "decisions.jsonl"
    server = make_server(decision_log=str(log))
    answered: list[str] = []
    for i in range(240):
        clock.set(EPOCH + i * 0.13)
        user = [("user", f"u{i % 3}")]
        path = [("path", f"/api/{i % 2}")]
        other = [("job", "j")] if i % 2 else [("tiers", "t")]
        hits = 2 if i % 7 == 0 else 0
        answered.append(
            ",".join(codes(server.ask("web", descriptor(user), path, other, hits=hits)))
        )
    server.ask("nowhere", [("k", "v")])
    wait_for("every line written", lambda: len(log.read_text().splitlines()) == 241)
    assert "OVER_LIMIT" in "".join(answered) and "OK" in "".join(answered)
    logged = list(read_log(log))
    assert [",".join(x.codes) for x in logged[:-1]] == answered
    config = load_sources([("web.yaml", CONFIG)])
    outcome = asyncio.run(replay(logged, config))
    again: list[str] = []

    async def each() -> None:
        from ferryman.replay.replay import Replay

        fresh = Replay(config)
        for item in logged:
            decision = await fresh.decide(item)
            again.append(",".join(s.code.name for s in decision.statuses))

    asyncio.run(each())
    assert again[:-1] == answered
    rules = {r.rule: r for r in outcome.config.results()}
    assert sum(r.refused for r in rules.values()) == "".join(answered).count("OVER_LIMIT")
    assert rules["web.user"].requests == 240


def test_a_full_queue_drops_and_counts_and_never_blocks(tmp_path: Path) -> None:
    """With the writer not keeping up (here not started), decisions past the queue's size
    are dropped at once and counted."""
    stats = Stats()
    log = DecisionLog(tmp_path / "d.jsonl", stats, size=2)
    for i in range(5):
        log.decided(_seen(EPOCH + i))
    assert log.dropped == 3
    assert stats.get("ratelimit.service.decision_log.dropped") == 3


def test_the_log_rotates_at_its_cap_and_survives_an_unwritable_path(tmp_path: Path) -> None:
    """Past DECISION_LOG_MAX_BYTES the file becomes <file>.1 and a new one starts; a path
    that cannot be written drops (and counts) its lines and names the error."""

    async def run(log: DecisionLog, n: int) -> None:
        await log.start()
        for i in range(n):
            log.decided(_seen(EPOCH + i))
            await asyncio.sleep(0.005)
        await log.stop()

    path = tmp_path / "d.jsonl"
    capped = DecisionLog(path, Stats(), max_bytes=600)
    asyncio.run(run(capped, 12))
    rotated = path.with_name("d.jsonl.1")
    assert capped.rotations >= 1 and rotated.exists()
    assert path.stat().st_size <= 600 and rotated.stat().st_size <= 600
    assert capped.written == 12
    broken = DecisionLog(tmp_path, Stats())  # a directory: cannot be opened for writing
    asyncio.run(run(broken, 3))
    assert broken.dropped == 3 and broken.written == 0 and broken.last_error


def _write_log(path: Path, lines: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            tenant = "acme" if i % 2 else "other"
            line = {
                "t": EPOCH + i * 0.25,
                "domain": "web",
                "hits": 0,
                "descriptors": [{"entries": [["user", tenant]]}],
                "rules": ["web.user"],
                "codes": ["OK"],
                "code": "OK",
            }
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def test_replay_compares_two_configs_by_tenant_and_draws_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--against reports each config's rules and the tenants whose answers change, with the
    share refused and when; --plot writes an SVG with a line per rule and answer."""
    log = tmp_path / "d.jsonl"
    _write_log(log, 400)
    loose, tight = tmp_path / "loose", tmp_path / "tight"
    for where, n in ((loose, 10), (tight, 1)):
        where.mkdir()
        (where / "web.yaml").write_text(
            f"domain: web\ndescriptors:\n  - key: user\n"
            f"    rate_limit: {{unit: second, requests_per_unit: {n}}}\n"
        )
    svg = tmp_path / "plot.svg"
    argv = ["replay", str(log), "--config", str(loose), "--against", str(tight)]
    assert main([*argv, "--format", "json", "--plot", str(svg)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["decisions"] == 400
    assert report["config"]["rules"][0]["refused"] == 0
    against = report["against"]["rules"][0]
    assert (against["rule"], against["requests"], against["refused"]) == ("web.user", 400, 200)
    changed = {d["tenant"]: d for d in report["differences"]}
    assert changed["user=acme"]["newly_refused"] == 100
    assert (
        "refuses 50.0% of tenant user=acme's requests (100 of 200)"
        in (changed["user=acme"]["summary"])
    )
    assert svg.read_text().startswith("<svg") and svg.read_text().count("<polyline") == 4
    assert main(argv) == 0
    assert "differences:" in capsys.readouterr().out


def test_an_envoy_access_log_replays_through_the_routes_actions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each access log line becomes the descriptors its route's rate limit actions send
    (headers, client address): the per-IP limit of the example front proxy refuses the
    101st request of one client within a minute."""
    pytest.importorskip("envoy_data_plane")
    log = tmp_path / "access.log"
    with log.open("w") as f:
        for i in range(105):
            entry = {
                "start_time": f"2026-11-27T09:00:{i // 4:02d}.{(i % 4) * 250:03d}Z",
                "path": f"/api/{i}",
                "downstream_remote_address": "10.0.0.1:40000",
            }
            f.write(json.dumps(entry) + "\n")
    envoy = REPO / "envoy" / "front-proxy.yaml"
    descriptors = REPO / "descriptors"
    argv = ["replay", str(log), "--envoy", str(envoy), "--config", str(descriptors)]
    assert main([*argv, "--format", "json"]) == 0
    rules = {r["rule"]: r for r in json.loads(capsys.readouterr().out)["rules"]}
    per_ip = rules["edge-proxy.remote_address"]
    assert (per_ip["requests"], per_ip["refused"]) == (105, 5)
    assert per_ip["refused_tenants"] == [{"tenant": "remote_address=10.0.0.1", "refused": 5}]
