"""``ferryman explain`` and the debug port's /explain: why a descriptor is limited."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ferryman.engine.explain import render

from helpers.server import ConfigDir, ServerFactory
from helpers.stores import on_stores

ROOT = Path(__file__).resolve().parents[1]
DESCRIPTORS = ROOT / "descriptors"
LIMIT = (
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
)


SMOOTH = """\
domain: s
descriptors:
  - key: bucket
    token_bucket: {size: 4, fill_rate: 1, max_debt_millis: 5000}
  - key: sliding
    sliding_window: {unit: minute, requests_per_unit: 5}
"""


def explain(*args: str) -> tuple[int, dict[str, Any]]:
    """Run ``ferryman explain ... --format json``; its exit status and answer."""
    done = subprocess.run(
        [sys.executable, "-m", "ferryman", "explain", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, answer


def local(domain: str, *descriptors: str) -> tuple[int, list[dict[str, Any]]]:
    args = ["--config", str(DESCRIPTORS), "--domain", domain]
    for d in descriptors:
        args += ["--descriptor", d]
    code, answer = explain(*args)
    return code, answer["descriptors"]


def test_exact_value_then_bare_key_reach_the_fixed_window() -> None:
    """Each level says how it matched; the rule and its counter key are named."""
    code, [d] = local("messaging", "message_type=marketing,to_number=2061111111")
    assert code == 0
    assert [s["matched"] for s in d["walk"]] == ["exact", "bare key"]
    assert d["rule"]["kind"] == "fixed_window"
    assert (d["rule"]["requests_per_unit"], d["rule"]["unit"]) == (5, "day")
    assert d["counter_key"].startswith("messaging_message_type_marketing_to_number_2061111111_")
    assert (
        d["walk"][1]["source"].startswith(str(DESCRIPTORS.name))
        or "messaging.yaml" in (d["walk"][1]["source"])
    )


def test_wildcard_is_named_and_share_threshold_counts_under_the_pattern() -> None:
    """A wildcard match names its pattern; with share_threshold the key holds the pattern."""
    code, [d] = local("edge-proxy", "generic_key=slow-path,path=/api/users")
    assert code == 0
    assert d["walk"][1]["matched"] == "wildcard" and d["walk"][1]["pattern"] == "/api/*"
    assert "path_/api/*_" in d["counter_key"]


def test_replaces_removes_the_replaced_rule_from_the_request() -> None:
    """per_ip is replaced by partners when both are sent; nothing is counted for it."""
    code, [ip, partner] = local("edge-proxy", "remote_address=10.0.0.1", "header_match=partner")
    assert code == 0
    assert ip["replaced_by"] == "edge-proxy.header_match_partner"
    assert "counter_key" not in ip
    assert partner["rule"]["replaces"] == ["per_ip"]


def test_shadow_mode_and_unlimited_are_reported() -> None:
    """shadow_mode shows on the rule; an unlimited wildcard is its own kind."""
    _, [bulk] = local("edge-proxy", "generic_key=bulk")
    assert bulk["rule"]["shadow_mode"] is True
    _, [internal] = local("messaging", "sender=internal-billing")
    assert internal["rule"]["kind"] == "unlimited"
    assert internal["walk"][0]["pattern"] == "internal-*"


def test_no_match_says_where_the_walk_stopped_and_what_was_expected() -> None:
    """The level that failed lists what the tree has there; the exit status is 1."""
    code, [d] = local("messaging", "message_type=nope")
    assert code == 1
    step = d["walk"][0]
    assert step["matched"] is None
    assert "message_type=marketing" in step["expected"] and "sender" in step["expected"]
    assert "no match at level 1" in d["outcome"]
    code, answer = explain("--config", str(DESCRIPTORS), "--domain", "nope", "--descriptor", "k=v")
    assert code == 1 and answer["domain_found"] is False


def test_against_a_running_server_the_current_count_is_shown_and_nothing_counted(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Through the debug port: the count after three hits, unchanged by asking twice."""
    config_dir.write("d.yaml", LIMIT)
    server = make_server()
    for _ in range(3):
        server.ask("d", [("k", "v")])
    target = f"127.0.0.1:{server.service.debug_port}"
    for _ in range(2):
        code, answer = explain("--target", target, "--domain", "d", "--descriptor", "k=v")
        assert code == 0
        [d] = answer["descriptors"]
        assert (d["count"], d["remaining"]) == (3, 2)
        assert 0 < d["reset_after"] <= 60
    status, body = server.http("GET", "/explain?domain=d", debug=True)
    assert status == 400 and b"descriptor" in body


@on_stores("memory", "redis")
def test_a_token_bucket_and_a_sliding_window_are_read_without_taking(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """/explain gives a bucket's tokens (negative in debt) and its debt, and a sliding
    window's estimate, what it leaves and its window's end; asking again changes nothing."""
    config_dir.write("s.yaml", SMOOTH)
    server = make_server()
    query = "/explain?domain=s&descriptor=bucket=u&descriptor=sliding=u"

    def read() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        status, body = server.http("GET", query, debug=True)
        assert status == 200, body
        answer = json.loads(body)
        bucket, sliding = answer["descriptors"]
        return answer, bucket, sliding

    _, bucket, sliding = read()
    assert (bucket["tokens"], bucket["remaining"], bucket["debt_ms"]) == (4, 4, 0)
    assert (sliding["estimate"], sliding["remaining"]) == (0, 5)
    server.ask("s", [("bucket", "u")], hits=3)
    server.ask("s", [("sliding", "u")], hits=2)
    for _ in range(2):
        _, bucket, sliding = read()
        assert (bucket["tokens"], bucket["remaining"], bucket["debt_ms"]) == (1, 1, 0)
        assert (sliding["estimate"], sliding["remaining"]) == (2, 3)
        assert 0 < sliding["reset_after"] <= 60
    server.ask("s", [("bucket", "u")], hits=3)  # one token held, two borrowed: 2 s of debt
    answer, bucket, _ = read()
    assert (bucket["tokens"], bucket["remaining"], bucket["debt_ms"]) == (-2, 0, 2000)
    assert bucket["counter_key"].endswith("ferryman_bucket_{s.bucket|u}")
    text = render(answer)
    assert "now: -2 tokens, 0 left, in debt: 2000ms to wait" in text
    assert "now: 2 counted (estimate), 3 left, window ends in" in text
