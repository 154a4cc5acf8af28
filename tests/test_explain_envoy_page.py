"""The debug port's /explain/envoy: a ``ferryman serve`` process given the shipped Envoy
files (ENVOY_CONFIG_FILES) and descriptors answers, for a route, what
``ferryman explain --envoy`` answers, with the backend's current counts."""

from __future__ import annotations

import http.client
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2

from ferryman.cli import main
from ferryman.errors import SettingsError
from ferryman.server.app import Service
from ferryman.settings import Settings

from helpers.serve_process import ServeProcess
from helpers.server import ServerFactory, descriptor, rls_stub

ROOT = Path(__file__).resolve().parents[1]
FRONT = str(ROOT / "envoy" / "front-proxy.yaml")
SIDECAR = str(ROOT / "envoy" / "sidecar.yaml")
DESCRIPTORS = str(ROOT / "descriptors")
# What a read of the backend adds to an explained descriptor (and the counter key, whose
# window start is the time of the read).
NOW_FIELDS = ("counter_key", "count", "remaining", "reset_after")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One ``ferryman serve`` on the shipped descriptors, explaining two shipped files."""
    process = ServeProcess(
        tmp_path_factory.mktemp("serve"),
        {"ENVOY_CONFIG_FILES": f"{FRONT}, {SIDECAR}"},
        "--config",
        DESCRIPTORS,
    )
    try:
        process.wait_serving()
        yield process
    finally:
        process.stop()
        process.kill()


def page(server: ServeProcess, *params: tuple[str, str]) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.debug_port, timeout=10)
    try:
        conn.request("GET", f"/explain/envoy?{urlencode(params)}" if params else "/explain/envoy")
        response = conn.getresponse()
        body: dict[str, Any] = json.loads(response.read())
        return response.status, body
    finally:
        conn.close()


def command(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """``ferryman explain --envoy FRONT --envoy SIDECAR ARGS --format json``, in this process."""
    capsys.readouterr()
    files = ["--envoy", FRONT, "--envoy", SIDECAR, "--config", DESCRIPTORS]
    code = main(["explain", *files, *args, "--format", "json"])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    answer: dict[str, Any] = json.loads(out)
    return answer


def without_now(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer without what the time of the read and the backend add."""
    copy: dict[str, Any] = json.loads(json.dumps(answer))
    for entry in copy["entries"]:
        for d in entry["descriptors"]:
            for name in NOW_FIELDS:
                d.get("explain", {}).pop(name, None)
    return copy


def test_the_page_lists_the_files_and_their_routes(
    served: ServeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a route: the files of the setting (both of them) and the routes of both,
    those the command names."""
    status, listing = page(served)
    assert status == 200, listing
    assert listing["files"] == [FRONT, SIDECAR]
    assert listing["routes"] == command(capsys)["known_routes"]
    assert {"/api/", "/bulk", "/burst/simple", "/slow/"} <= set(listing["routes"])
    assert "edge" in listing["virtual_hosts"]


@pytest.mark.parametrize(
    "params",
    [
        [("route", "/burst/simple")],
        [("route", "/api/"), ("header", ":path=/api/v1"), ("remote_address", "10.1.2.3")],
        [("route", "edge"), ("domain", "cookbook")],
    ],
    ids=["variable", "headers-and-address", "virtual-host-and-domain"],
)
def test_a_route_is_answered_as_the_command_answers_it(
    served: ServeProcess, capsys: pytest.CaptureFixture[str], params: list[tuple[str, str]]
) -> None:
    """The page and ``ferryman explain --envoy`` agree: a route whose values are all left
    variable, one given a header and the client address (its descriptors explained level by
    level), and a virtual host's routes kept to one domain."""
    flags = {"route": "--route", "header": "--header", "remote_address": "--remote-address"}
    args = [a for name, value in params for a in (flags.get(name, "--domain"), value)]
    expected = command(capsys, *args)
    status, answer = page(served, *params)
    assert status == 200, answer
    assert answer["entries"], answer
    assert without_now(answer) == without_now(expected)
    if ("domain", "cookbook") in params:
        assert {e["domain"] for e in answer["entries"]} == {"cookbook"}
    if len(params) > 1 and params[1][0] == "header":
        explained = [d for e in answer["entries"] for d in e["descriptors"] if "explain" in d]
        assert explained and all("count" in d["explain"] for d in explained), explained


def _remote(answer: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any]
    [found] = [
        d["explain"]
        for e in answer["entries"]
        for d in e["descriptors"]
        if [x[0] for x in d["entries"]] == ["remote_address"]
    ]
    return found


def test_the_counts_are_the_backends(served: ServeProcess) -> None:
    """A request counted through gRPC shows in the route's answer: the client address's
    per-minute counter holds one hit, 99 left (read twice around the hit, so that the hit
    is known to be in the window read)."""
    params = (("route", "/bulk"), ("remote_address", "10.0.0.7"))
    request = rls_pb2.RateLimitRequest(
        domain="edge-proxy", descriptors=[descriptor([("remote_address", "10.0.0.7")])]
    )
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        stub = rls_stub(channel)
        for _ in range(3):
            before = _remote(page(served, *params)[1])
            stub.ShouldRateLimit(request, timeout=10)
            after = _remote(page(served, *params)[1])
            if before["counter_key"] == after["counter_key"]:
                break
    assert before["counter_key"] == after["counter_key"]
    assert before["rule"]["stats_key"] == "edge-proxy.remote_address"
    assert after["count"] - before["count"] == 1
    assert after["remaining"] == 100 - after["count"]


@pytest.mark.parametrize(
    ("params", "status", "named"),
    [
        ([("route", "/nope")], 404, "route"),
        ([("route", "")], 400, "route"),
        ([("route", "/bulk"), ("header", "novalue")], 400, "header"),
        ([("route", "/bulk"), ("remote_address", "not-an-ip")], 400, "remote_address"),
        ([("route", "/bulk"), ("route", "/api/")], 400, "route"),
        ([("rout", "/bulk")], 400, "rout"),
    ],
    ids=["unknown-route", "empty-route", "header", "address", "twice", "unknown-parameter"],
)
def test_bad_parameters_are_refused_naming_them(
    served: ServeProcess, params: list[tuple[str, str]], status: int, named: str
) -> None:
    """An unknown route is not found (the routes there are named); a bad value, a value
    given twice or an unknown parameter is a bad request naming the parameter."""
    got, answer = page(served, *params)
    assert got == status, answer
    assert answer["error"].startswith(f"{named}: "), answer
    if status == 404:
        assert "/bulk" in answer["error"]


def test_without_the_setting_the_page_says_it_is_off(make_server: ServerFactory) -> None:
    """No ENVOY_CONFIG_FILES: not found, with the reason and how to turn it on."""
    server = make_server()
    status, body = server.http("GET", "/explain/envoy?route=/bulk", debug=True)
    assert status == 404
    error = json.loads(body)["error"]
    assert error.startswith("ENVOY_CONFIG_FILES: not set") and "--envoy" in error


def test_without_the_extra_the_start_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting given without envoy-data-plane installed: refused at start, saying what
    to install."""
    monkeypatch.setitem(sys.modules, "envoy_data_plane", None)  # import raises ImportError
    with pytest.raises(SettingsError, match=r"ENVOY_CONFIG_FILES.*pip install ferryman\[envoy\]"):
        Service(Settings(envoy_config_files=(FRONT,)))


def test_a_file_that_cannot_be_read_stops_the_start(tmp_path: Path) -> None:
    """``serve --envoy`` with a file that is not there: exit 2 naming it, nothing served."""
    missing = tmp_path / "missing.yaml"
    process = ServeProcess(tmp_path, {}, "--config", DESCRIPTORS, "--envoy", str(missing))
    try:
        assert process.wait_exit() == 2
    finally:
        process.kill()
    assert f"{missing}: cannot read" in process.text
    assert "ferryman serving" not in process.text and "Traceback" not in process.text
