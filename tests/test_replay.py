"""The decision log and ``ferryman replay``: a live server's log (ShouldRateLimit and
ferryman.v1 Request decisions) replayed gives the answers the server gave; the log never
blocks (dropped and counted), rotates at its cap; replay compares two configs, reads Envoy
access logs and draws its plot."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.cli import main
from ferryman.clock import ManualClock
from ferryman.config.loader import load_sources
from ferryman.core.answers import Code, Decision, DescriptorRequest, Status
from ferryman.engine.observe import Requested, Seen
from ferryman.replay.decision_log import (
    DecisionLog,
    Logged,
    LoggedRequest,
    decode,
    encode,
    read_log,
)
from ferryman.replay.replay import Replay, replay
from ferryman.stats import Stats

from helpers.server import (
    EPOCH,
    ConfigDir,
    Server,
    ServerFactory,
    codes,
    descriptor,
    limiter_stub,
    wait_for,
)

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

# Charon's burst tiers asked over ferryman.v1, beside a domain that ignores its limits.
CHARON = """
domain: charon
allow_unconfigured: true
descriptors:
  - key: tiers
    burst_tiers:
      - {limit: 2, window: 1s, active: 1h}
      - {limit: 5, window: 1s, active: 2s, cooldown: 10s}
"""
SHADOW = """
domain: shadow
ignore_limits: true
descriptors:
  - key: tiers
    burst_tiers:
      - {limit: 1, window: 1s, active: 1h}
"""
TIGHT = """
domain: charon
descriptors:
  - key: tiers
    burst_tiers:
      - {limit: 1, window: 1s, active: 1h}
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
    logged = [x for x in read_log(log) if isinstance(x, Logged)]
    assert len(logged) == 241
    assert [",".join(x.codes) for x in logged[:-1]] == answered
    config = load_sources([("web.yaml", CONFIG)])
    outcome = asyncio.run(replay(logged, config))
    again: list[str] = []

    async def each() -> None:
        fresh = Replay(config)
        for item in logged:
            decision = await fresh.decide(item)
            again.append(",".join(s.code.name for s in decision.statuses))

    asyncio.run(each())
    assert again[:-1] == answered
    rules = {r.rule: r for r in outcome.config.results()}
    assert sum(r.refused for r in rules.values()) == "".join(answered).count("OVER_LIMIT")
    assert rules["web.user"].requests == 240


def _ask_v1(server: Server, domain: str, entry: tuple[str, str], copies: int, least: int) -> int:
    request = limiter_pb2.RateRequest(
        domain=domain,
        descriptor=[limiter_pb2.Entry(key=entry[0], value=entry[1])],
        copies=copies,
        min_copies=least,
    )
    reply: limiter_pb2.RateResponse = limiter_stub(server.channel).Request(request, timeout=10)
    return reply.granted


def test_a_live_servers_v1_requests_replay_to_the_copies_it_granted(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock, tmp_path: Path
) -> None:
    """ferryman.v1 Requests on a burst-tier node (whole and partial grants, refusals), on
    an unconfigured descriptor and on an ignore_limits domain, with ShouldRateLimit on the
    same node between them, are logged a line each; replaying the log grants, request by
    request, the copies the server granted, each rule's requests, refusals and shadow
    violations are the server's, and a tighter node names the tenants it newly refuses."""
    config_dir.write("charon.yaml", CHARON)
    config_dir.write("shadow.yaml", SHADOW)
    log = tmp_path / "decisions.jsonl"
    server = make_server(decision_log=str(log))
    granted: list[int] = []
    live: Counter[str] = Counter()  # charon.tiers' requests and refusals, both APIs
    for i in range(150):
        clock.set(EPOCH + i * 0.1)
        tenant, copies = ("tiers", f"t{i % 2}"), 1 + i % 3
        if i % 10 == 9:
            refused = codes(server.ask("charon", [tenant])) == ["OVER_LIMIT"]
            live.update(["requests"] + ["refused"] * refused)
            continue
        domain, entry = {4: ("shadow", tenant), 7: ("charon", ("job", "j"))}.get(
            i % 10, ("charon", tenant)
        )
        got = _ask_v1(server, domain, entry, copies, copies if i % 4 else 1)
        granted.append(got)
        if domain == "charon" and entry == tenant:
            live.update(["requests"] + ["refused"] * (got == 0))
    wait_for("every line written", lambda: len(log.read_text().splitlines()) == 150)
    assert live["refused"] and 0 in granted and any(0 < g < 3 for g in granted)
    logged = list(read_log(log))
    asked = [x for x in logged if isinstance(x, LoggedRequest)]
    assert [x.granted for x in asked] == granted
    assert {x.rule for x in asked} == {"charon.tiers", "shadow.tiers", None}
    config = load_sources([("charon.yaml", CHARON), ("shadow.yaml", SHADOW)])

    async def again() -> list[int]:
        fresh, out = Replay(config), []
        for item in logged:  # in order: ShouldRateLimit moves the same tiers
            if isinstance(item, LoggedRequest):
                out.append((await fresh.decide(item)).granted)
            else:
                await fresh.decide(item)
        return out

    assert asyncio.run(again()) == granted
    tight = load_sources([("charon.yaml", TIGHT), ("shadow.yaml", SHADOW)])
    outcome = asyncio.run(replay(logged, config, tight))
    rules = {r.rule: r for r in outcome.config.results()}
    assert (rules["charon.tiers"].requests, rules["charon.tiers"].refused) == (
        live["requests"],
        live["refused"],
    )
    shadowed = server.stat("ratelimit.service.rate_limit.shadow.tiers.shadow_mode")
    assert shadowed and (rules["shadow.tiers"].refused, rules["shadow.tiers"].shadow) == (
        0,
        shadowed,
    )
    assert outcome.changes[(("tiers", "t0"),)].newly_refused > 0


def test_a_request_line_reads_back_as_it_was_written() -> None:
    """A ferryman.v1 Request decision is one line marked "api": "request" that reads back as
    what was asked, the node reached (or none) and the copies granted; a line of an
    unknown api is not a decision log line."""
    rule = load_sources([("charon.yaml", CHARON)]).domains["charon"].root.match("tiers", "t")
    entries = (("tiers", "t"), ("sub", "x"))
    line = encode(Requested(EPOCH + 0.5, "charon", entries, 3, 1, 250, rule, 2))
    assert "\n" not in line and json.loads(line)["api"] == "request"
    assert decode(line) == LoggedRequest(
        EPOCH + 0.5, "charon", entries, 3, 1, 250, "charon.tiers", 2
    )
    unconfigured = encode(Requested(EPOCH, "charon", (("job", "j"),), 4, 4, 0, None, 4))
    assert decode(unconfigured) == LoggedRequest(EPOCH, "charon", (("job", "j"),), 4, 4, 0, None, 4)
    with pytest.raises(ValueError, match="unknown api"):
        decode(line.replace('"request"', '"lease"'))


def test_a_full_queue_drops_and_counts_and_never_blocks(tmp_path: Path) -> None:
    """With the writer not keeping up (here not started), decisions past the queue's size
    (ShouldRateLimit's and Request's alike) are dropped at once and counted."""
    stats = Stats()
    log = DecisionLog(tmp_path / "d.jsonl", stats, size=2)
    for i in range(5):
        log.decided(_seen(EPOCH + i))
    log.requested(Requested(EPOCH, "charon", (("job", "j"),), 1, 1, 0, None, 1))
    assert log.dropped == 4
    assert stats.get("ratelimit.service.decision_log.dropped") == 4


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
