"""Shaping for Envoy: a GCRA or token-bucket node with ``max_wait`` books a ShouldRateLimit
its turn and the server holds the answer until then (memory and Redis), a request that
cannot wait that long (its own deadline, or the node's bound) is refused at once and books
nothing; ``max_wait`` on other kinds is refused; the waits are counted in the rule's stats
and /status, shown by explain, and checked against Envoy's filter timeout."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.clock import ManualClock
from ferryman.config import load_sources
from ferryman.core.answers import DescriptorRequest
from ferryman.engine.explain import render
from ferryman.errors import ConfigError

from helpers.envoy_cli import envoy_cli
from helpers.server import (
    EPOCH,
    ConfigDir,
    Server,
    ServerFactory,
    descriptor,
    limiter_stub,
    overall,
    wait_for,
)
from helpers.stores import on_stores

CONFIG = """
domain: s
descriptors:
  - key: fast
    gcra: {rate: 100, per: 1s, burst: 1}
    max_wait: 100ms
  - key: slow
    gcra: {rate: 2, per: 1s, burst: 1}
    max_wait: 1s
  - key: bucket
    token_bucket: {size: 1, fill_rate: 100, max_debt_millis: 500}
    max_wait: 100ms
  - key: waits
    token_bucket: {size: 1, fill_rate: 2, max_debt_millis: 5000, wait_timeout_millis: 3000}
    max_wait: 1s
  - key: plain
    gcra: {rate: 2, per: 1s, burst: 1}
"""
STAT = "ratelimit.service.rate_limit.s"


def ask(server: Server, key: str, timeout: float = 10) -> str:
    """One ShouldRateLimit on ``key=t`` with ``timeout`` as its deadline: its overall code."""
    request = rls_pb2.RateLimitRequest(domain="s", descriptors=[descriptor([(key, "t")])])
    return overall(server.stub.ShouldRateLimit(request, timeout=timeout))


def status(server: Server) -> dict[str, Any]:
    code, body = server.http("GET", "/status", debug=True)
    assert code == 200, body
    shaping: dict[str, Any] = json.loads(body)["shaping"]
    return shaping


def shaped(server: Server, key: str, n: int, may_wait: float = math.inf) -> list[Any]:
    """``n`` decisions on ``key=t`` in a row, straight from the engine: (code, wait)."""
    engine = server.service.engine
    out = []
    for _ in range(n):
        asked = [DescriptorRequest(((key, "t"),))]
        decision = server.run(engine.should_rate_limit("s", asked, may_wait=may_wait))
        out.append((decision.code.name, round(decision.wait, 6)))
    return out


@on_stores("memory", "redis")
@pytest.mark.parametrize(
    ("key", "waits"),
    [
        # GCRA, 100 a second, burst 1: one now, then one every 10 ms up to 100 ms.
        ("fast", [0.0, *(i / 100 for i in range(1, 11))]),
        # A token bucket of 1: one now, one on debt, then each waits for the debt ahead.
        ("bucket", [0.0, 0.0, *(i / 100 for i in range(1, 11))]),
    ],
)
def test_each_request_is_booked_behind_the_ones_before_it(
    key: str,
    waits: list[float],
    config_dir: ConfigDir,
    make_server: ServerFactory,
    clock: ManualClock,
) -> None:
    """At one instant, requests that may wait are booked turns one after another up to the
    node's max_wait; the rest are over the limit with no wait, and a caller that cannot
    wait is refused where a waiting one would have been held."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    got = shaped(server, key, len(waits) + 3)
    assert got == [("OK", w) for w in waits] + [("OVER_LIMIT", 0.0)] * 3
    assert shaped(server, key, 1, may_wait=0.0) == [("OVER_LIMIT", 0.0)]
    assert server.stat(f"{STAT}.{key}.served_with_wait") == len([w for w in waits if w])
    assert server.stat(f"{STAT}.{key}.waited_ms") == round(sum(waits) * 1000)


@on_stores("memory", "redis")
def test_the_server_holds_each_answer_until_its_turn(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """2 a second, max_wait 1 s: the first passes, the next two are held (0.5 s, 1 s) and
    answered OK in that order, the fourth is refused at once while they are held; /status
    counts them held, then done."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    assert ask(server, "slow") == "OK"
    done: list[tuple[str, str]] = []
    lock = threading.Lock()
    request = rls_pb2.RateLimitRequest(domain="s", descriptors=[descriptor([("slow", "t")])])

    def send(name: str) -> Any:
        future = server.stub.ShouldRateLimit.future(request, timeout=10)

        def finished(f: Any) -> None:
            with lock:
                done.append((name, overall(f.result())))

        future.add_done_callback(finished)
        return future

    futures = [send("half")]
    wait_for("one answer held", lambda: status(server)["holding"] == 1)
    futures.append(send("whole"))
    wait_for("two answers held", lambda: status(server)["holding"] == 2)
    futures.append(send("late"))
    for future in futures:
        future.result(timeout=10)
    wait_for("every answer counted", lambda: len(done) == 3)
    assert done == [("late", "OVER_LIMIT"), ("half", "OK"), ("whole", "OK")]
    shown = status(server)
    assert (shown["holding"], shown["held"], shown["left"]) == (0, 2, 0)
    assert shown["seconds_waited"] == 1.5 and shown["longest_wait"] == 1.0
    assert shown["waits"]["le_0.5s"] == 1 and shown["waits"]["le_1s"] == 1


@on_stores("memory", "redis")
def test_a_deadline_before_the_turn_is_refused_at_once_and_books_nothing(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """A caller whose deadline (0.2 s) comes before its turn (0.5 s) is answered
    OVER_LIMIT, not held past its deadline; the next caller gets the turn it would have
    had (0.5 s), so nothing was booked."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    assert ask(server, "slow") == "OK"
    assert ask(server, "slow", timeout=0.2) == "OVER_LIMIT"
    assert status(server)["held"] == 0
    assert ask(server, "slow") == "OK"
    assert server.stat(f"{STAT}.slow.waited_ms") == 500


@on_stores("memory", "redis")
def test_callers_that_do_not_wait_on_the_server_are_answered_as_before(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """POST /json answers at once (the second request is over the limit); a node without
    max_wait refuses a waiting caller too; ferryman.v1's Request is given the least of its
    own max_wait, the node's wait_timeout_millis and the node's max_wait."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)
    body = json.dumps(
        {"domain": "s", "descriptors": [{"entries": [{"key": "slow", "value": "j"}]}]}
    )
    answers = [json.loads(server.http("POST", "/json", body.encode())[1]) for _ in range(2)]
    assert [a["overallCode"] for a in answers] == ["OK", "OVER_LIMIT"]
    assert shaped(server, "plain", 2) == [("OK", 0.0), ("OVER_LIMIT", 0.0)]

    def request(key: str) -> limiter_pb2.RateResponse:
        asked = limiter_pb2.RateRequest(
            domain="s", descriptor=[limiter_pb2.Entry(key=key, value="v1")], copies=1
        )
        asked.max_wait.FromSeconds(5)
        reply: limiter_pb2.RateResponse = limiter_stub(server.channel).Request(asked, timeout=10)
        return reply

    gcra = [request("slow") for _ in range(4)]
    assert [r.granted for r in gcra] == [1, 1, 1, 0]
    assert [r.wait.ToMilliseconds() for r in gcra[:3]] == [0, 500, 1000]
    bucket = [request("waits") for _ in range(5)]
    assert [r.granted for r in bucket] == [1, 1, 1, 1, 0]
    assert [r.wait.ToMilliseconds() for r in bucket[:4]] == [0, 0, 500, 1000]


BAD = [
    ("rate_limit: {unit: second, requests_per_unit: 1}", "a fixed window node cannot tell"),
    ("sliding_window: {unit: second, requests_per_unit: 1}", "sliding window node cannot"),
    ("descriptors: [{key: k2, gcra: {rate: 1, per: 1s}}]", "max_wait needs a limit beside it"),
    ("gcra: {rate: 1, per: 1s}\n    max_wait: 0s", "max_wait must be positive"),
    ("gcra: {rate: 1, per: 1s}\n    max_wait: soon", "expected a duration"),
    ("token_bucket: {size: 1, fill_rate: 1}", "its max_debt_millis is 0"),
]


@pytest.mark.parametrize(("body", "message"), BAD, ids=[b[1] for b in BAD])
def test_max_wait_where_it_cannot_be_honoured_is_an_error(body: str, message: str) -> None:
    """max_wait on a kind that cannot tell when hits fit, on a node with no limit, not a
    positive duration, or on a token bucket that allows no debt: refused with its file,
    line and path."""
    text = "domain: d\ndescriptors:\n  - key: k\n    " + body + "\n"
    if "max_wait" not in body:
        text += "    max_wait: 1s\n"
    with pytest.raises(ConfigError) as err:
        load_sources([("b.yaml", text)])
    shown = str(err.value)
    assert "b.yaml:" in shown and "descriptors[0].max_wait" in shown, shown
    assert message in shown, shown


def test_a_broken_limit_beside_max_wait_is_reported_once() -> None:
    """A limit that does not load is the problem told: max_wait beside it is not also
    said to lack a limit."""
    text = "domain: d\ndescriptors:\n  - key: k\n    gcra: {rate: 0, per: 1s}\n    max_wait: 1s\n"
    with pytest.raises(ConfigError) as err:
        load_sources([("b.yaml", text)])
    problems = [p.message for p in err.value.problems]
    assert len(problems) == 1 and problems[0].startswith("rate must be positive"), problems


def test_ferryman_check_lists_max_wait_and_refuses_it_on_a_fixed_window(tmp_path: Path) -> None:
    """``ferryman check`` shows each node's max_wait (text and JSON) and refuses one on a
    fixed window, naming the file and line."""
    (tmp_path / "s.yaml").write_text(CONFIG)
    run = [sys.executable, "-m", "ferryman", "check", str(tmp_path)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "s.slow: GCRA 2 per 1s, burst 1 [max_wait 1s]" in done.stdout
    listed = subprocess.run(
        [*run, "--format", "json"], capture_output=True, text=True, timeout=60, check=False
    )
    limits = {e["key"]: e["max_wait"] for e in json.loads(listed.stdout)["domains"][0]["limits"]}
    assert limits["s.fast"] == 0.1 and limits["s.plain"] is None
    bad = CONFIG.replace(
        "gcra: {rate: 2, per: 1s, burst: 1}\n    max_wait",
        "rate_limit: {unit: second, requests_per_unit: 2}\n    max_wait",
    )
    (tmp_path / "s.yaml").write_text(bad)
    done = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "s.yaml:9:" in done.stdout and "max_wait is refused" in done.stdout, done.stdout


@on_stores("memory")
def test_explain_shows_max_wait_and_the_wait_a_hit_would_get_now(
    config_dir: ConfigDir, make_server: ServerFactory, clock: ManualClock
) -> None:
    """/explain names the node's max_wait and, once hits are booked, how long a hit would
    wait now and whether it would be held or refused."""
    config_dir.write("s.yaml", CONFIG)
    server = make_server()
    clock.set(EPOCH)

    def explained() -> str:
        code, body = server.http("GET", "/explain?domain=s&descriptor=slow=t", debug=True)
        assert code == 200, body
        return render(json.loads(body))

    assert "held up to 1s for their turn (max_wait)" in explained()
    shaped(server, "slow", 2)
    assert "a hit now waits 1s: held (max_wait 1s)" in explained()
    shaped(server, "slow", 1)
    assert "a hit now waits 1.5s: refused (max_wait 1s)" in explained()


ENVOY = """\
static_resources:
  listeners:
    - name: s
      address:
        socket_address: {address: 127.0.0.1, port_value: 10000}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": HCM_TYPE
                stat_prefix: s
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": RL_TYPE
                      domain: s
                      TIMEOUT
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service:
                          envoy_grpc: {cluster_name: ferryman}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                route_config:
                  virtual_hosts:
                    - name: s
                      domains: ["*"]
                      rate_limits:
                        - actions:
                            - generic_key: {descriptor_key: slow, descriptor_value: t}
                      routes:
                        - match: {prefix: /}
                          route: {cluster: upstream}
""".replace(
    "HCM_TYPE",
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager",
).replace("RL_TYPE", "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit")


@pytest.mark.parametrize(
    ("timeout", "warned"),
    [("", True), ("timeout: 0.5s", True), ("timeout: 2s", False)],
    ids=["default 20ms", "0.5s", "2s"],
)
def test_envoy_check_warns_when_the_filter_gives_up_before_max_wait(
    timeout: str, warned: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A filter whose timeout (20 ms by default) is shorter than a reached rule's max_wait
    is warned of, naming the rule, the timeout and what Envoy then does."""
    config = tmp_path / "descriptors"
    config.mkdir()
    (config / "s.yaml").write_text(CONFIG)
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(ENVOY.replace("TIMEOUT", timeout or "stage: 0"))
    run = envoy_cli(capsys, "check", str(envoy), "--config", str(config), "--format", "json")
    assert run.code == 0, run.out
    messages = [f["message"] for f in json.loads(run.out)["findings"]]
    held = [m for m in messages if "max_wait" in m]
    if not warned:
        assert held == []
        return
    shown = "default 20ms" if not timeout else "0.5s"
    assert len(held) == 1, messages
    assert held[0].startswith("s.slow (") and "up to 1s (max_wait)" in held[0], held
    assert f"filter's timeout ({shown}, " in held[0] and "lets it through" in held[0], held
