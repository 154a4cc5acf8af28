"""Charon's per-domain switches: ``allow_unconfigured`` records the traffic no rule covers,
``ignore_limits`` puts a whole domain in shadow mode; both through Envoy's RLS and
ferryman.v1 on a real server, both reloadable, both read by ``ferryman check``."""

from __future__ import annotations

import json

import pytest

from ferryman._proto.ferryman.v1 import limiter_pb2
from ferryman.config.loader import load_sources
from ferryman.engine.observe import TopK
from ferryman.errors import ConfigError

from helpers.server import ConfigDir, Server, ServerFactory, codes, limiter_stub, wait_for

WEB = """
domain: web
allow_unconfigured: true
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tiers
    burst_tiers:
      - {limit: 1, window: 1m, active: 1h}
"""


def ask_v1(server: Server, domain: str, key: str, copies: int) -> limiter_pb2.RateResponse:
    request = limiter_pb2.RateRequest(
        domain=domain, descriptor=[limiter_pb2.Entry(key=key, value="t")], copies=copies
    )
    reply: limiter_pb2.RateResponse = limiter_stub(server.channel).Request(request, timeout=10)
    return reply


def unconfigured(server: Server) -> dict[str, object]:
    status, body = server.http("GET", "/unconfigured", debug=True)
    assert status == 200
    found: dict[str, object] = json.loads(body)["domains"]
    return found


def test_check_reads_both_switches_and_refuses_a_typo_and_a_non_boolean_with_its_line() -> None:
    """Both keys load as booleans; a misspelt key and a quoted "true" are named with their
    file and line."""
    config = load_sources([("w.yaml", "domain: w\nallow_unconfigured: true\nignore_limits: on\n")])
    assert config.domains["w"].allow_unconfigured and config.domains["w"].ignore_limits
    bad = "domain: w\nallow_unconfgured: true\nignore_limits: 'true'\n"
    with pytest.raises(ConfigError) as info:
        load_sources([("bad.yaml", bad)])
    found = {(p.file, p.line, p.path) for p in info.value.problems}
    assert found == {("bad.yaml", 2, "allow_unconfgured"), ("bad.yaml", 3, "ignore_limits")}


def test_allow_unconfigured_records_what_no_rule_covers_through_rls_and_v1(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Descriptors that reach no limit are answered OK and counted per domain, most frequent
    first, over Envoy's RLS and ferryman.v1; a configured descriptor and a domain without
    the switch are not recorded, and turning the switch off forgets the domain's table."""
    config_dir.write("web.yaml", WEB)
    config_dir.write("api.yaml", "domain: api\ndescriptors:\n  - key: user\n")
    server = make_server()
    answers = [codes(server.ask("web", [("path", "/a")], [("user", "u")])) for _ in range(3)]
    assert answers == [["OK", "OK"], ["OK", "OVER_LIMIT"], ["OK", "OVER_LIMIT"]]
    server.ask("web", [("path", "/b")])
    server.ask("api", [("path", "/a")])
    assert ask_v1(server, "web", "job", 4).granted == 4
    seen = unconfigured(server)
    assert list(seen) == ["web"]
    web = seen["web"]
    assert isinstance(web, dict)
    assert [(t["descriptor"], t["count"]) for t in web["top"]] == [
        ("job=t", 4),
        ("path=/a", 3),
        ("path=/b", 1),
    ]
    assert web["total"] == 8
    assert server.stat("ratelimit.service.rate_limit.web.unconfigured") == 8
    config_dir.write("web.yaml", WEB.replace("allow_unconfigured: true\n", ""))
    wait_for("the reload", lambda: server.ask("web", [("x", "y")]) and not unconfigured(server))


def test_ignore_limits_lets_everything_through_counted_and_a_reload_turns_it_off(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """With ignore_limits every over-limit hit is answered OK and counted as shadow_mode
    (RLS and ferryman.v1), /status names the switch; rewriting the file without it
    refuses again."""
    config_dir.write("web.yaml", WEB.replace("allow_unconfigured", "ignore_limits"))
    server = make_server()
    answers = [codes(server.ask("web", [("user", "u")]))[0] for _ in range(3)]
    assert answers == ["OK", "OK", "OK"]
    assert server.stat("ratelimit.service.rate_limit.web.user.shadow_mode") == 2
    assert [ask_v1(server, "web", "tiers", 1).granted for _ in range(2)] == [1, 1]
    status = json.loads(server.http("GET", "/status", debug=True)[1])
    assert status["config"]["switches"] == {
        "web": {"allow_unconfigured": False, "ignore_limits": True}
    }
    config_dir.write("web.yaml", WEB.replace("allow_unconfigured: true\n", ""))
    wait_for("the reload", lambda: codes(server.ask("web", [("user", "u")])) == ["OVER_LIMIT"])
    assert ask_v1(server, "web", "tiers", 1).granted == 0


def test_space_saving_keeps_the_heavy_hitters_in_a_bounded_table() -> None:
    """Past k keys the table stays at k, the frequent keys stay with exact counts, and a
    newcomer inherits the evicted count as its error."""
    table = TopK(3)
    for i in range(100):
        table.add((("k", "hot"),), 1, float(i))
        table.add((("k", f"cold{i}"),), 1, float(i))
    assert len(table.counts) == 3
    top = table.top(100.0)
    assert top[0]["descriptor"] == "k=hot" and top[0]["count"] == 100 and top[0]["error"] == 0
    assert table.total == 200
    assert all(int(str(t["count"])) - int(str(t["error"])) <= 1 for t in top[1:])
