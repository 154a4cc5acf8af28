"""The config API through real server processes: versions, If-Match, validation, history
and its trimming, diff, rollback, tokens, counter resets of every kind of node and of quota
buckets (memory and Redis), the Redis store shared by replicas, a read-only directory,
concurrent writers, /status, and the `ferryman config` command."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ferryman.config.reloader import ConfigHolder
from ferryman.config.store import MAX_DIFF_LINES, ConfigVersions, RedisStore, Version
from ferryman.connections.redis import RedisConnection
from ferryman.connections.redis_target import parse_backend_url
from ferryman.errors import StaleVersionError
from ferryman.stats import Stats

from helpers.config_api import READ, TOKENS, WRITE, Served
from helpers.configmap import configmap_volume
from helpers.ports import listeners
from helpers.redis_procs import RedisProcess
from helpers.server import wait_for


def web(limit: int, unit: str = "hour") -> str:
    return (
        "domain: web\ndescriptors:\n  - key: user\n"
        f"    rate_limit: {{unit: {unit}, requests_per_unit: {limit}}}\n"
    )


BAD = (
    "domain: web\ndescriptors:\n  - key: user\n"
    "    rate_limit: {unit: minite, requests_per_unit: 2}\n"
    "  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: -1}\n"
)


# A node of each kind a reset clears (or refuses), and quota buckets that do not refill
# (within a test).
KINDS = """\
domain: kinds
descriptors:
  - key: tiers
    burst_tiers:
      - {limit: 2, window: 1h, active: 1h, cooldown: 0}
  - key: bucket
    token_bucket: {size: 2, fill_rate: 0.001}
  - key: sliding
    sliding_window: {unit: hour, requests_per_unit: 2}
  - key: limits
    rate_limits: [{unit: hour, requests_per_unit: 2}, {gcra: {rate: 1, per: 1h, burst: 5}}]
  - key: seats
    copies: {limit: 1, hold_ttl: 30s}
"""
QUOTA = """\
namespaces:
  pay:
    buckets:
      refunds: {size: 2, fill_rate: 0.001, max_tokens_per_request: 2, wait_timeout_millis: 0,
                max_debt_millis: 0}
  logins:
    dynamic_bucket_template: {size: 1, fill_rate: 0.001, max_tokens_per_request: 1,
                              wait_timeout_millis: 0, max_debt_millis: 0}
"""


def config_dir(root: Path) -> Path:
    """A config directory with web.yaml (3 per hour), the node kinds and the quota file."""
    directory = root / "config"
    directory.mkdir()
    (directory / "web.yaml").write_text(web(3))
    (directory / "kinds.yaml").write_text(KINDS)
    (directory / "quota.yaml").write_text(QUOTA)
    return directory


def reset(server: Served, request: dict[str, object]) -> tuple[int, Any]:
    status, _, body = server.api("POST", "/counters/reset", json.dumps(request))
    return status, body


def limit_of(server: Served, user: str) -> int:
    """How many hits ``user`` gets before 429 (counting up to 20)."""
    for n in range(20):
        if server.hit("web", ("user", user)) == 429:
            return n
    return 20


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server on a files store, a memory backend and a token file, for the module."""
    root = tmp_path_factory.mktemp("config-api")
    (root / "tokens").write_text(TOKENS)
    server = Served(config_dir(root), root, {"ADMIN_TOKENS_FILE": str(root / "tokens")}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_served(
    redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One server on the Redis backend with CONFIG_STORE=redis keeping 3 history entries."""
    root = tmp_path_factory.mktemp("config-api-redis")
    (root / "tokens").write_text(TOKENS)
    env = {
        "ADMIN_TOKENS_FILE": str(root / "tokens"),
        "CONFIG_STORE": "redis",
        "CONFIG_HISTORY": "3",
        "CACHE_KEY_PREFIX": f"cfgapi{random.randrange(1 << 30)}_",
    }
    server = Served(config_dir(root), root, env, ["--backend", redis_server.url]).start()
    yield server
    server.stop()


def test_a_write_is_in_force_when_it_is_answered(served: Served) -> None:
    """PUT with the current ETag: 200 with the next version, and ShouldRateLimit already
    counts against the new limit; GET returns the document with its ETag."""
    status, headers, doc = served.api("GET", "/config/web.yaml")
    base = int(headers["ETag"].strip('"'))
    status, headers, body = served.put("web.yaml", web(5), base)
    assert status == 200, body
    assert body["version"] == base + 1 and body["author"] == "alice"
    assert headers["ETag"] == f'"{base + 1}"'
    assert limit_of(served, "write-1") == 5
    status, headers, doc = served.api("GET", "/config/web.yaml")
    assert doc.decode() == web(5) and headers["ETag"] == f'"{base + 1}"'
    assert (served.config / "web.yaml").read_text() == web(5)


def test_a_stale_or_missing_if_match_changes_nothing(served: Served) -> None:
    """If-Match of an older version: 412 naming the latest; none: 428; the file is as it was."""
    base = served.version()
    before = (served.config / "web.yaml").read_text()
    status, _, body = served.put("web.yaml", web(9), base - 1)
    assert status == 412 and body["current"] == base
    status, _, body = served.api("PUT", "/config/web.yaml", web(9))
    assert status == 428 and "If-Match" in body["error"]
    assert (served.config / "web.yaml").read_text() == before
    assert served.version() == base


def test_a_bad_document_is_refused_with_every_problem_and_the_last_good_stays(
    served: Served,
) -> None:
    """400 listing each problem with its line, column and path; the config in force and the
    file are unchanged."""
    base = served.version()
    served.put("web.yaml", web(4), base)
    status, _, body = served.put("web.yaml", BAD, base + 1)
    assert status == 400
    where = {(p["line"], p["path"]) for p in body["problems"]}
    assert (4, "descriptors[0].rate_limit.unit") in where
    assert (6, "descriptors[1].rate_limit.requests_per_unit") in where
    assert all(p["file"] == "web.yaml" for p in body["problems"])
    assert served.version() == base + 1
    assert (served.config / "web.yaml").read_text() == web(4)
    assert limit_of(served, "bad-1") == 4


def test_history_diff_and_rollback_after_three_writes(served: Served) -> None:
    """Three writes are three versions, newest first, each with its author and change; the
    diff of two is a unified diff; rollback makes a new version equal to the old one."""
    base = served.version()
    for i, limit in enumerate((6, 7, 8)):
        assert served.put("web.yaml", web(limit), base + i)[0] == 200
    status, _, body = served.api("GET", "/history")
    top = body["history"][:3]
    assert [e["version"] for e in top] == [base + 3, base + 2, base + 1]
    assert {e["author"] for e in top} == {"alice"}
    assert all(e["changed"] == ["web.yaml"] for e in top)
    status, _, diff = served.api("GET", f"/diff?from={base + 1}&to={base + 3}")
    text = diff.decode()
    assert status == 200
    assert "-    rate_limit: {unit: hour, requests_per_unit: 6}" in text
    assert "+    rate_limit: {unit: hour, requests_per_unit: 8}" in text
    status, _, body = served.api("POST", "/rollback", json.dumps({"version": base + 1}))
    assert status == 200 and body["version"] == base + 4 and body["kind"] == "rollback"
    assert limit_of(served, "rollback-1") == 6
    status, _, old = served.api("GET", f"/history/{base + 3}")
    assert old["documents"]["web.yaml"] == web(8)  # history is never rewritten


def test_tokens_none_wrong_and_read_only(served: Served) -> None:
    """No token or a wrong one: 401; a read token may read but writing is 403."""
    assert served.request("GET", "/api/v1/config")[0] == 401
    assert served.api("GET", "/config", token="nope")[0] == 401
    assert served.api("GET", "/config", token=READ)[0] == 200
    base = served.version()
    status, _, body = served.api(
        "PUT", "/config/web.yaml", web(1), token=READ, headers={"If-Match": f'"{base}"'}
    )
    assert status == 403 and "bob" in body["error"]
    assert served.version() == base


def test_the_token_file_is_read_again_and_without_it_the_api_is_off(served: Served) -> None:
    """Tokens added to the file work at once; with the file gone the API answers 404."""
    tokens = Path(served.env["ADMIN_TOKENS_FILE"])
    tokens.write_text(TOKENS + "new-token carol read\n")
    assert served.api("GET", "/config", token="new-token")[2]["you"]["user"] == "carol"
    tokens.rename(tokens.with_suffix(".away"))
    try:
        status, _, body = served.api("GET", "/config")
        assert status == 404 and b"ADMIN_TOKENS_FILE" in body
    finally:
        tokens.with_suffix(".away").rename(tokens)
    assert served.api("GET", "/config")[0] == 200


def test_a_counter_reset_on_memory_lets_the_descriptor_in_again(served: Served) -> None:
    """A fixed window at its limit is cleared by a reset, which the history records."""
    base = served.version()
    served.put("web.yaml", web(2), base)
    assert limit_of(served, "reset-1") == 2
    request = {"domain": "web", "descriptor": [{"key": "user", "value": "reset-1"}]}
    status, _, body = served.api("POST", "/counters/reset", json.dumps(request))
    assert status == 200 and body["held"] is True and body["kind"] == "fixed_window"
    assert served.hit("web", ("user", "reset-1")) == 200
    event = served.api("GET", "/history")[2]["history"][0]
    assert event["kind"] == "reset" and event["author"] == "alice"
    assert event["event"]["descriptor"] == [["user", "reset-1"]]
    assert reset(served, {"domain": "web", "descriptor": [{"key": "x", "value": "y"}]})[0] == 404
    for value in ({}, {"value": None}, {"value": 5}):
        status, body = reset(served, {"domain": "web", "descriptor": [{"key": "user", **value}]})
        assert status == 400 and body["error"].startswith("descriptor[0].value:"), body


def test_a_file_edit_is_a_version_too(served: Served) -> None:
    """An edit of the directory's files, loaded by the watcher, is recorded as a version."""
    base = served.version()
    (served.config / "web.yaml").write_text(web(11))
    wait_for("the file edit recorded", lambda: served.version() == base + 1)
    entry = served.api("GET", "/history")[2]["history"][0]
    assert entry["author"] == "files" and entry["changed"] == ["web.yaml"]
    assert limit_of(served, "file-1") == 11


def test_concurrent_writers_with_random_if_match_lose_nothing(served: Served) -> None:
    """50 writers, each with a random If-Match near the latest: every write either lands as
    a version of its own or gets 412; the history holds exactly the landed ones."""
    base = served.version()
    rng = random.Random(24)

    def write(i: int) -> tuple[int, int | None]:
        guess = base + rng.randrange(0, 6)
        text = web(100 + i)
        status, _, body = served.put("web.yaml", text, guess)
        return status, body["version"] if status == 200 else None

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(write, range(50)))
    assert {s for s, _ in results} <= {200, 412}
    landed = sorted(v for s, v in results if s == 200 and v is not None)
    assert landed, "no write landed"
    assert landed == list(range(base + 1, base + 1 + len(landed)))  # one version each
    history = served.api("GET", "/history")[2]["history"]
    written = {e["version"]: e for e in history if e["kind"] == "api" and e["version"] > base}
    assert sorted(written) == landed
    latest = served.api("GET", f"/history/{landed[-1]}")[2]["documents"]["web.yaml"]
    assert (served.config / "web.yaml").read_text() == latest


def test_the_cli_shows_the_diff_first_and_writes_only_with_yes(
    served: Served, tmp_path: Path
) -> None:
    """`ferryman config apply` without --yes prints the diff and validation and writes
    nothing; with --yes it writes; a bad file is reported at its line, not written."""
    token = tmp_path / "token"
    token.write_text(WRITE + "\n")
    target = f"http://127.0.0.1:{served.debug}"
    new = tmp_path / "web.yaml"
    new.write_text(web(13))
    base = served.version()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "ferryman", "config", *args]
        command.extend(["--target", target, "--token-file", str(token)])
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=60,
            env=served.env,
            stdin=subprocess.DEVNULL,
        )

    shown = cli("apply", str(new))
    assert "+    rate_limit: {unit: hour, requests_per_unit: 13}" in shown.stdout
    assert "valid" in shown.stdout and shown.returncode == 1
    assert served.version() == base
    done = cli("apply", str(new), "--yes")
    assert done.returncode == 0 and f"version {base + 1}" in done.stdout
    bad = tmp_path / "bad" / "web.yaml"
    bad.parent.mkdir()
    bad.write_text(BAD)
    refused = cli("apply", str(bad), "--yes")
    assert refused.returncode == 1 and "web.yaml:4:" in refused.stdout
    # Several files are one version: two documents that trade their domains are valid as a
    # set, though neither is alone (a domain would be defined twice in between).
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "web.yaml").write_text(web(14).replace("domain: web", "domain: swap"))
    (pair / "swap.yaml").write_text(web(15))
    two = cli("apply", str(pair / "web.yaml"), str(pair / "swap.yaml"), "--yes")
    assert two.returncode == 0 and f"version {base + 2}" in two.stdout, two.stdout + two.stderr
    assert served.version() == base + 2
    assert limit_of(served, "cli-pair") == 15
    (pair / "back").mkdir()
    (pair / "back" / "swap.yaml").write_text(web(14).replace("domain: web", "domain: swap"))
    back = cli("apply", str(new), str(pair / "back" / "swap.yaml"), "--yes")
    assert back.returncode == 0 and f"version {base + 3}" in back.stdout
    assert limit_of(served, "cli-back") == 13
    swapped = cli("apply", str(new), str(pair / "web.yaml"), "--name", "x", "--yes")
    assert swapped.returncode == 2 and "--name goes with one FILE" in swapped.stderr
    assert "added swap.yaml, changed web.yaml [swap.yaml, web.yaml]" in cli("history").stdout
    reset = cli("reset-counter", "--domain", "web", "--descriptor", "user=cli")
    assert reset.returncode == 0 and "web.user" in reset.stdout
    bucket = cli("reset-counter", "--namespace", "pay", "--bucket", "refunds")
    assert bucket.returncode == 0 and "quota_bucket pay/refunds" in bucket.stdout


def test_a_configmap_directory_makes_the_api_read_only(tmp_path: Path) -> None:
    """A ConfigMap volume cannot be written: reads work, writes answer 409 saying why."""
    configmap_volume(tmp_path / "config", {"web.yaml": web(3)}, "2024_01_01")
    (tmp_path / "tokens").write_text(TOKENS)
    server = Served(
        tmp_path / "config", tmp_path, {"ADMIN_TOKENS_FILE": str(tmp_path / "tokens")}
    ).start()
    try:
        status, _, body = server.api("GET", "/config")
        assert status == 200 and "ConfigMap" in body["read_only"]
        status, _, body = server.put("web.yaml", web(5), body["version"])
        assert status == 409 and "ConfigMap" in body["error"]
        assert limit_of(server, "cm") == 3
    finally:
        server.stop()


def test_two_replicas_on_one_redis_share_versions(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    """CONFIG_STORE=redis: a write through one replica is enforced by the other; a counter
    reset clears the shared Redis counter; a replica started afterwards, with the old files,
    comes up with the new version."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "web.yaml").write_text(web(3))
    (tmp_path / "tokens").write_text(TOKENS)
    env = {
        "ADMIN_TOKENS_FILE": str(tmp_path / "tokens"),
        "CONFIG_STORE": "redis",
        "CACHE_KEY_PREFIX": f"cfgapi{random.randrange(1 << 30)}_",
    }

    def replica() -> Served:
        return Served(tmp_path / "config", tmp_path, env, ["--backend", redis_server.url]).start()

    a, b = replica(), replica()
    try:
        assert a.version() == b.version() == 1  # one seed, not two
        status, _, body = a.put("web.yaml", web(2), 1)
        assert status == 200 and body["version"] == 2
        wait_for("replica b on version 2", lambda: b.version() == 2)
        assert limit_of(b, "shared") == 2  # counted in the shared Redis
        assert a.hit("web", ("user", "shared")) == 429
        request = {"domain": "web", "descriptor": [{"key": "user", "value": "shared"}]}
        status, _, body = b.api("POST", "/counters/reset", json.dumps(request))
        assert status == 200 and body["held"] is True
        assert a.hit("web", ("user", "shared")) == 200
        status, _, body = b.put("web.yaml", web(9), 1)
        assert status == 412 and body["current"] == 2
        b.stop()
        c = replica()
        try:
            assert c.version() == 2
            assert limit_of(c, "restarted") == 2
            assert (tmp_path / "config" / "web.yaml").read_text() == web(3)  # files untouched
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("which", ["served", pytest.param("redis_served", marks=pytest.mark.redis)])
def test_a_reset_clears_burst_tiers_token_buckets_sliding_windows_and_lists(
    which: str, request: pytest.FixtureRequest
) -> None:
    """Each kind at its limit is answered as from a fresh state after a reset; a tenant
    never counted holds nothing; held copies are freed only where no session holds them
    (none here)."""
    server: Served = request.getfixturevalue(which)
    kinds = {
        "tiers": "burst_tiers",
        "bucket": "token_bucket",
        "sliding": "sliding_window",
        "limits": "limit_list",
    }
    for key, kind in kinds.items():
        assert [server.hit("kinds", (key, "t1")) for _ in range(3)] == [200, 200, 429], key
        status, body = reset(
            server, {"domain": "kinds", "descriptor": [{"key": key, "value": "t1"}]}
        )
        assert status == 200 and body["kind"] == kind and body["held"] is True, body
        assert [server.hit("kinds", (key, "t1")) for _ in range(3)] == [200, 200, 429], key
        status, body = reset(
            server, {"domain": "kinds", "descriptor": [{"key": key, "value": "t0"}]}
        )
        assert status == 200 and body["held"] is False
    status, body = reset(
        server, {"domain": "kinds", "descriptor": [{"key": "seats", "value": "a"}]}
    )
    assert status == 200 and body["kind"] == "copies" and body["held"] is False, body


@pytest.mark.parametrize("which", ["served", pytest.param("redis_served", marks=pytest.mark.redis)])
def test_a_quota_bucket_reset_fills_the_bucket_again(
    which: str, request: pytest.FixtureRequest
) -> None:
    """{"namespace", "bucket"} fills the bucket Allow takes from again, named or dynamic
    (which stays registered); the history records it; no matching bucket is 404."""
    server: Served = request.getfixturevalue(which)
    spent = ["OK", "OK", "REJECTED_TIMEOUT"]
    assert [server.allow("pay", "refunds") for _ in range(3)] == spent
    status, body = reset(server, {"namespace": "pay", "bucket": "refunds"})
    assert status == 200 and body["held"] is True
    assert (body["kind"], body["rule"]) == ("quota_bucket", "pay/refunds")
    assert [server.allow("pay", "refunds") for _ in range(3)] == spent
    event = server.api("GET", "/history")[2]["history"][0]
    assert event["kind"] == "reset" and event["event"]["namespace"] == "pay"
    assert [server.allow("logins", "u1") for _ in range(2)] == ["OK", "REJECTED_TIMEOUT"]
    status, body = reset(server, {"namespace": "logins", "bucket": "u1"})
    assert status == 200 and body["held"] is True and body["rule"] == "logins/u1"
    assert [server.allow("logins", "u1") for _ in range(2)] == ["OK", "REJECTED_TIMEOUT"]
    assert reset(server, {"namespace": "logins", "bucket": "u2"})[1]["held"] is False
    status, body = reset(server, {"namespace": "nowhere", "bucket": "x"})
    assert status == 404 and "nowhere/x" in body["error"]
    status, body = reset(server, {"namespace": "pay", "bucket": "no-such"})
    assert status == 400 and "bucket" in body["error"]


def test_the_files_store_keeps_the_last_config_history_entries(tmp_path: Path) -> None:
    """CONFIG_HISTORY=3: after four writes the history holds the newest three versions,
    on disk too; an older one is answered 404, the newest is there."""
    (tmp_path / "tokens").write_text(TOKENS)
    env = {"ADMIN_TOKENS_FILE": str(tmp_path / "tokens"), "CONFIG_HISTORY": "3"}
    server = Served(config_dir(tmp_path), tmp_path, env).start()
    try:
        base = server.version()
        for i in range(4):
            assert server.put("web.yaml", web(20 + i), base + i)[0] == 200
        history = server.api("GET", "/history")[2]["history"]
        assert [e["version"] for e in history] == [base + 4, base + 3, base + 2]
        kept = sorted(
            p.name[:8] for p in (tmp_path / "config" / ".ferryman-history").glob("*.json")
        )
        assert kept == [f"{v:08d}" for v in (base + 2, base + 3, base + 4)]
        assert server.api("GET", f"/history/{base + 1}")[0] == 404
        newest = server.api("GET", f"/history/{base + 4}")
        assert newest[0] == 200 and newest[2]["documents"]["web.yaml"] == web(23)
    finally:
        server.stop()


@pytest.mark.redis
def test_the_redis_store_keeps_the_last_config_history_entries(
    redis_served: Served, redis_server: RedisProcess
) -> None:
    """CONFIG_HISTORY=3 on Redis: the history list and the version hashes are the newest
    three; an older version is answered 404, the newest is there."""
    server = redis_served
    base = server.version()
    for i in range(4):
        assert server.put("web.yaml", web(20 + i), base + i)[0] == 200
    history = server.api("GET", "/history")[2]["history"]
    assert [e["version"] for e in history] == [base + 4, base + 3, base + 2]
    prefix = server.env["CACHE_KEY_PREFIX"]
    client = redis_server.client()
    hashes = [
        str(k, "utf-8") if isinstance(k, bytes) else k
        for k in client.keys(f"{{{prefix}ferryman_config}}:v:*")
    ]
    client.close()
    assert sorted(int(k.rsplit(":", 1)[1]) for k in hashes) == [base + 2, base + 3, base + 4]
    assert server.api("GET", f"/history/{base + 1}")[0] == 404
    newest = server.api("GET", f"/history/{base + 4}")
    assert newest[0] == 200 and newest[2]["documents"]["web.yaml"] == web(23)


def test_status_reports_the_config_api_version_beside_the_loads(served: Served) -> None:
    """/status keeps `version` (loads) and adds the store and its version, which follows
    the API's writes."""
    base = served.version()
    config = served.status()["config"]
    assert (config["store"], config["store_version"]) == ("files", base)
    loads = config["version"]
    assert served.put("web.yaml", web(3), base)[0] == 200
    config = served.status()["config"]
    assert config["store_version"] == base + 1 == served.version()
    assert config["version"] == loads + 1


def test_a_write_of_several_documents_is_one_version(served: Served) -> None:
    """PUT /api/v1/config: two documents that are valid only together (domains swapped
    between files) are one version; a stale If-Match changes nothing; null deletes."""
    base = served.version()
    one, two = "domain: one\ndescriptors: []\n", "domain: two\ndescriptors: []\n"
    status, _, body = served.put_many({"x/a.yaml": one, "x/b.yaml": two}, base)
    assert status == 200 and body["version"] == base + 1, body
    assert body["changed"] == ["x/a.yaml", "x/b.yaml"]
    assert served.put("x/a.yaml", two, base + 1)[0] == 400  # alone: 'two' twice
    status, _, body = served.put_many({"x/a.yaml": two, "x/b.yaml": one}, base + 1)
    assert status == 200 and body["version"] == base + 2, body
    assert (served.config / "x" / "a.yaml").read_text() == two
    status, _, body = served.put_many({"x/a.yaml": None}, base + 1)
    assert status == 412 and body["current"] == base + 2
    status, _, body = served.put_many({"x/a.yaml": None, "x/b.yaml": None}, base + 2)
    assert status == 200 and body["summary"] == "deleted x/a.yaml, deleted x/b.yaml"
    assert not (served.config / "x" / "a.yaml").exists()
    assert served.put_many({}, base + 3)[0] == 400
    assert served.put_many({"x/a.yaml": None}, base + 3)[0] == 404


def test_names_outside_the_directory_or_through_a_link_or_a_file_are_refused(
    served: Served, tmp_path: Path
) -> None:
    """'..', absolute and percent-encoded names, a symbolic link to a directory outside,
    and a name below a document are refused with 400 naming `name`; nothing is written."""
    base = served.version()
    for path in ("../x.yaml", "/abs.yaml", "%2e%2e%2fx.yaml", "a/%2E%2E/%2e%2e/x.yaml"):
        status, _, body = served.api(
            "PUT", f"/config/{path}", web(1), headers={"If-Match": f'"{base}"'}
        )
        assert status == 400 and body["error"].startswith("name:"), (path, body)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = served.config / "shared"
    os.symlink(outside, link)
    try:
        lone = "domain: lone\ndescriptors: []\n"
        status, _, body = served.put("shared/x.yaml", lone, base)
        assert status == 400 and "symbolic link" in body["error"], body
        status, _, body = served.put_many({"shared/x.yaml": lone}, base)
        assert status == 400 and body["error"].startswith("name:")
    finally:
        link.unlink()
    assert list(outside.iterdir()) == []
    status, _, body = served.put("web.yaml/b.yaml", web(1), base)
    assert status == 400 and "inside 'web.yaml'" in body["error"], body
    assert served.version() == base


def test_a_write_the_disk_refuses_is_an_error_and_changes_no_document(served: Served) -> None:
    """A file that cannot be made (in an immutable directory, which even root cannot
    write) answers 500 with the reason, as JSON; of two documents written together,
    neither is written."""
    base = served.version()
    frozen = served.config / "frozen"
    frozen.mkdir()
    if subprocess.run(["chattr", "+i", str(frozen)], capture_output=True).returncode:
        frozen.rmdir()
        pytest.skip("chattr +i is not available on this file system")
    docs = {"other.yaml": "domain: o1\ndescriptors: []\n", "frozen/x.yaml": "domain: o2\n"}
    try:
        status, _, body = served.put_many(docs, base)
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], check=True)
        frozen.rmdir()
    assert status == 500 and "cannot write" in body["error"], body
    assert "no document was changed" in body["error"]
    assert not (served.config / "other.yaml").exists()
    assert [p.name for p in served.config.iterdir() if p.name.endswith(".tmp")] == []
    assert served.version() == base


def test_a_long_document_is_left_out_of_the_diff_saying_so(served: Served) -> None:
    """/validate and /diff do not diff a document longer than the cap: the answer names
    it and the diff says why."""
    big = "domain: big\ndescriptors: []\n" + "# a line\n" * MAX_DIFF_LINES
    status, _, body = served.api("POST", "/validate", json.dumps({"documents": {"big.yaml": big}}))
    assert status == 200 and body["valid"] is True
    assert body["diff_capped"] == ["big.yaml"]
    assert f"big.yaml: not diffed, longer than {MAX_DIFF_LINES} lines" in body["diff"]
    base = served.version()
    assert served.put("big.yaml", big, base)[0] == 200
    status, headers, diff = served.api("GET", f"/diff?from={base}&to={base + 1}")
    assert status == 200 and headers["X-Diff-Capped"] == "big.yaml"
    assert b"not diffed" in diff
    assert served.api("DELETE", "/config/big.yaml", headers={"If-Match": f'"{base + 1}"'})[0] == 200


def test_writes_from_another_site_or_in_a_form_type_are_refused(served: Served) -> None:
    """A JSON body needs Content-Type application/json (415 otherwise); a write whose
    Sec-Fetch-Site or Origin names another site is 403; the page's own origin may write."""
    base = served.version()
    rollback = json.dumps({"version": base})
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        status, _, body = served.api("POST", "/rollback", rollback, headers={"Content-Type": kind})
        assert status == 415 and "application/json" in body["error"], kind
    status, _, body = served.api(
        "POST", "/rollback", rollback, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert status == 403 and "another site" in body["error"]
    assert (
        served.api("POST", "/rollback", rollback, headers={"Sec-Fetch-Site": "same-site"})[0] == 403
    )
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{served.http}"):
        status, _, body = served.api(
            "PUT", "/config/web.yaml", web(3), headers={"If-Match": f'"{base}"', "Origin": origin}
        )
        assert status == 403, origin
    assert served.version() == base
    own = {"If-Match": f'"{base}"', "Origin": f"http://127.0.0.1:{served.debug}"}
    assert served.api("PUT", "/config/web.yaml", web(3), headers=own)[0] == 200
    same = {"Sec-Fetch-Site": "same-origin", "Origin": "http://elsewhere"}
    assert served.api("POST", "/rollback", rollback, headers=same)[0] == 200


def test_tokens_are_matched_whole(served: Served) -> None:
    """A token's prefix, or the token with more after it, is not the token."""
    assert served.api("GET", "/config", token=WRITE[:-1])[0] == 401
    assert served.api("GET", "/config", token=WRITE + "x")[0] == 401
    assert served.api("GET", "/config", token=WRITE)[0] == 200


def test_workers_on_one_directory_write_one_version_per_if_match(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    """--workers 2 on a files store: 20 writes with one If-Match land once, the rest are
    412 naming the new version, whichever worker answers; both workers then report it."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "web.yaml").write_text(web(3))
    (tmp_path / "tokens").write_text(TOKENS)
    env = {"ADMIN_TOKENS_FILE": str(tmp_path / "tokens")}
    args = ["--backend", redis_server.url, "--workers", "2"]
    server = Served(tmp_path / "config", tmp_path, env, args).start()
    try:
        wait_for("both workers on the debug port", lambda: listeners(server.debug) == 2)
        wait_for("both workers answering", lambda: server.api("GET", "/config")[0] == 200)
        base = server.version()
        answers = [server.put("web.yaml", web(100 + i), base) for i in range(20)]
        landed = [body for status, _, body in answers if status == 200]
        assert len(landed) == 1, [(s, b) for s, _, b in answers]
        assert all(b["current"] == base + 1 for s, _, b in answers if s != 200)
        assert {server.version() for _ in range(10)} == {base + 1}
        history = server.api("GET", "/history")[2]["history"]
        assert [e["version"] for e in history] == list(range(base + 1, 0, -1))
    finally:
        server.stop()


@pytest.mark.redis
def test_an_invalid_version_in_redis_is_not_put_in_force_and_a_bad_entry_is_survived(
    redis_served: Served, redis_server: RedisProcess
) -> None:
    """A version another replica left in Redis that this one finds invalid: the version
    in force, its ETag and /status stay; GET /config reports it as `rejected`; a write on
    it lands. A `current` key that is not a number is counted and the follower goes on."""
    server = redis_served
    base = server.version()
    tag = "{" + server.env["CACHE_KEY_PREFIX"] + "ferryman_config}"
    docs = server.api("GET", f"/history/{base}")[2]["documents"]
    client = redis_server.client()

    def put_version(number: int, web_yaml: str) -> None:
        meta = {"version": number, "author": "elsewhere", "time": 0.0, "summary": "x"}
        fields = {"meta": json.dumps(meta), **{f"d:{n}": str(t) for n, t in docs.items()}}
        fields["d:web.yaml"] = web_yaml
        for name, value in fields.items():
            client.hset(f"{tag}:v:{number}", name, value)
        client.set(f"{tag}:current", number)
        client.publish(f"{tag}:changes", number)

    try:
        put_version(base + 1, BAD)
        wait_for("the bad version seen", lambda: server.api("GET", "/config")[2]["rejected"])
        status, headers, body = server.api("GET", "/config")
        assert body["version"] == base and headers["ETag"] == f'"{base}"'
        assert body["rejected"]["version"] == base + 1 and "minite" in body["rejected"]["error"]
        assert server.status()["config"]["store_version"] == base
        status, _, body = server.put("web.yaml", web(5), base)
        assert status == 412 and body["current"] == base + 1
        status, _, body = server.put("web.yaml", web(5), base + 1)
        assert status == 200 and body["version"] == base + 2
        assert server.api("GET", "/config")[2]["rejected"] is None
        assert limit_of(server, "redis-good") == 5

        def follow_errors() -> int:
            text = server.request("GET", "/stats")[2].decode()
            counts = [line.rsplit(" ", 1) for line in text.splitlines()]
            return sum(int(n) for name, n in counts if "config_api.follow_errors" in name)

        client.set(f"{tag}:current", "not-a-number")
        wait_for("the bad entry counted", lambda: follow_errors() > 0)
        docs["web.yaml"] = web(6)
        put_version(base + 3, web(6))
        wait_for("the next version in force", lambda: server.version() == base + 3)
        assert limit_of(server, "redis-after") == 6
    finally:
        client.close()


@pytest.mark.redis
def test_a_stale_write_on_redis_catches_up_before_answering(redis_server: RedisProcess) -> None:
    """Two replicas' ConfigVersions on one Redis, b not yet following a's write: b's write
    on the new version lands, and a 412 names the real latest, which b then has."""

    async def run() -> None:
        conn = RedisConnection(parse_backend_url(redis_server.url))
        await conn.start()
        prefix = f"stale{random.randrange(1 << 30)}_"
        a_store, b_store = RedisStore(conn, 10, prefix), RedisStore(conn, 10, prefix)
        a = ConfigVersions(a_store, ConfigHolder(), Stats())
        b = ConfigVersions(b_store, ConfigHolder(), Stats())
        try:
            await a_store.commit({"web.yaml": web(1)}, 0, Version(1, "seed", 0, "seed"))
            assert (await b.follow()) is not None
            await a.change("web.yaml", web(2), 1, "alice")
            await a.change("web.yaml", web(3), 2, "alice")
            with pytest.raises(StaleVersionError) as stale:
                await b.change("web.yaml", web(4), 1, "bob")
            assert stale.value.current == 3 and b_store.current().version.number == 3
            assert (await b.change("web.yaml", web(4), 3, "bob")).number == 4
            with pytest.raises(StaleVersionError) as stale:  # the compare-and-set refuses
                await a.change("web.yaml", web(5), 3, "alice")
            assert stale.value.current == 4 and a_store.current().version.number == 4
        finally:
            await conn.close()

    asyncio.run(run())
