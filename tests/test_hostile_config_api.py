"""A hostile caller of the config API: a token scoped to one domain reaches no other
document through any route, and no document is answered 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ferryman.access.scopes import document_scopes, read_scopes
from ferryman.apis.config_api import ROUTES
from ferryman.config.loader import load_sources

from helpers.config_api import WRITE, Served

ROOT, WEB_READ, WEB_WRITE = WRITE, "web-r", "web-w"
TOKENS = f"{ROOT} root write\n{WEB_READ} wendy read web\n{WEB_WRITE} walt write web\n"

WEB = (
    "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
)
PAYMENTS = (
    "domain: payments\ndescriptors:\n  - key: ledger_marker_7f3\n"
    "    rate_limit: {unit: second, requests_per_unit: 5}\n"
)
ACCESS = (
    "access:\n  - identities: ['spiffe://grant-marker-9c1/*']\n    allow: {rls: ['*']}\n"
    "  - identities: [anonymous]\n    allow: {rls: ['*']}\n"
)
QUOTA = (
    "namespaces:\n  pay_ns:\n    buckets:\n"
    "      b_marker_q2: {size: 2, fill_rate: 1, max_tokens_per_request: 2}\n"
)
#: What the web tokens must never see: the other documents' contents...
CONTENT = ("ledger_marker_7f3", "grant-marker-9c1", "b_marker_q2")
#: ...and, where a route lists documents, their names.
NAMES = ("secret.yaml", "access.yaml", "quota.yaml")


@dataclass(frozen=True)
class Attempt:
    """One hostile request. ``hidden``: whatever it is answered, no marker shows (the root
    token's answer shows one: the request would reach it). Otherwise it is refused (403)
    and no version is written."""

    method: str
    path: str
    body: Any = None
    hidden: tuple[str, ...] = ()


def docs(**documents: str | None) -> dict[str, Any]:
    return {"documents": {k.replace("_", ".", 1): v for k, v in documents.items()}}


#: Per route of the routing table, requests that try to reach payments' document, the
#: access policy or the quota file with a token scoped to web.
ATTEMPTS: dict[tuple[str, str], list[Attempt]] = {
    ("GET", "/api/v1/config"): [Attempt("GET", "/config", hidden=CONTENT + NAMES)],
    ("PUT", "/api/v1/config"): [
        Attempt("PUT", "/config", docs(secret_yaml=None)),
        Attempt("PUT", "/config", docs(web_yaml=PAYMENTS)),
        Attempt("PUT", "/config", docs(access_yaml="access: []\n")),
        Attempt("PUT", "/config", docs(web_yaml=WEB, quota_yaml=None)),
    ],
    ("GET", "/api/v1/config/*"): [
        Attempt("GET", f"/config/{name}", hidden=CONTENT) for name in NAMES
    ],
    ("PUT", "/api/v1/config/*"): [
        Attempt("PUT", "/config/secret.yaml", WEB),  # taking over payments' file
        Attempt("PUT", "/config/web.yaml", PAYMENTS),
        Attempt("PUT", "/config/access.yaml", "access: []\n"),
    ],
    ("DELETE", "/api/v1/config/*"): [Attempt("DELETE", f"/config/{name}") for name in NAMES],
    ("POST", "/api/v1/validate"): [
        Attempt("POST", "/validate", docs(secret_yaml=None), CONTENT),
        Attempt("POST", "/validate", docs(access_yaml=None), CONTENT),
        Attempt("POST", "/validate", docs(quota_yaml=None), CONTENT),
        Attempt("POST", "/validate", docs(secret_yaml=WEB), CONTENT),
        Attempt("POST", "/validate", docs(web_yaml=None, secret_yaml=None), CONTENT),
    ],
    ("GET", "/api/v1/history"): [Attempt("GET", "/history", hidden=NAMES)],
    ("GET", "/api/v1/history/*"): [Attempt("GET", "/history/1", hidden=CONTENT)],
    ("GET", "/api/v1/diff"): [Attempt("GET", "/diff?from=1&to=2", hidden=CONTENT)],
    ("POST", "/api/v1/rollback"): [Attempt("POST", "/rollback", {"version": 1})],
    ("POST", "/api/v1/counters/reset"): [
        Attempt(
            "POST",
            "/counters/reset",
            {"domain": "payments", "descriptor": [{"key": "ledger_marker_7f3", "value": "x"}]},
        ),
        Attempt("POST", "/counters/reset", {"namespace": "pay_ns", "bucket": "b_marker_q2"}),
    ],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server whose directory holds web, payments (secret.yaml), the access policy and
    the quota file; version 2 changes payments' limit, so that diffs show its lines."""
    root = tmp_path_factory.mktemp("hostile-config-api")
    directory = root / "config"
    directory.mkdir()
    for name, text in (("web.yaml", WEB), ("secret.yaml", PAYMENTS)):
        (directory / name).write_text(text)
    (directory / "access.yaml").write_text(ACCESS)
    (directory / "quota.yaml").write_text(QUOTA)
    (root / "tokens").write_text(TOKENS)
    server = Served(directory, root, {"ADMIN_TOKENS_FILE": str(root / "tokens")}).start()
    status, _, body = server.api(
        "PUT", "/config/secret.yaml", PAYMENTS.replace(": 5}", ": 6}"), ROOT, {"If-Match": '"1"'}
    )
    assert status == 200, body
    yield server
    server.stop()


def call(server: Served, attempt: Attempt, token: str) -> tuple[int, str]:
    """The attempt with ``token`` (If-Match: the current version): its status and text."""
    version = server.api("GET", "/config", token=ROOT)[2]["version"]
    body = attempt.body
    if body is not None and not isinstance(body, str):
        body = json.dumps(body)
    headers = {"If-Match": f'"{version}"'}
    if attempt.method == "PUT" and not isinstance(attempt.body, str):
        headers["Content-Type"] = "application/json"
    status, _, answer = server.api(attempt.method, attempt.path, body, token, headers)
    return status, answer.decode() if isinstance(answer, bytes) else json.dumps(answer)


def tracebacks(server: Served) -> int:
    return server.log.read_text(errors="replace").count("Traceback")


@pytest.mark.parametrize("route", sorted(ROUTES), ids=lambda r: " ".join(r))
def test_a_token_scoped_to_web_reaches_no_other_document_through(
    served: Served, route: tuple[str, str]
) -> None:
    """Every route of the routing table, asked for payments' document, the access policy
    or the quota file by a token scoped to web (read or write), shows none of them and
    changes nothing, where the unscoped token's same request shows them."""
    attempts = ATTEMPTS.get(route)
    assert attempts, f"{route}: a route of the config API without hostile requests here"
    for attempt in attempts:
        if attempt.hidden:
            _, shown = call(served, attempt, ROOT)
            assert any(m in shown for m in attempt.hidden), (attempt, "reaches nothing")
        for token in (WEB_READ, WEB_WRITE):
            before = served.version()
            status, shown = call(served, attempt, token)
            assert status < 500, (attempt, token, shown)
            assert not [m for m in attempt.hidden or CONTENT + NAMES if m in shown], (
                attempt,
                token,
                shown,
            )
            if not attempt.hidden:
                assert status == 403, (attempt, token, status, shown)
            assert served.version() == before
    assert tracebacks(served) == 0


def test_validating_a_null_document_shows_a_web_token_nothing_of_it(served: Served) -> None:
    """POST /validate naming payments' document or the access policy null, with a read
    token scoped to web, is 403 and shows neither (a GET of either is 403 too)."""
    for name in ("secret.yaml", "access.yaml"):
        body = json.dumps({"documents": {name: None}})
        status, _, answer = served.api("POST", "/validate", body, WEB_READ)
        assert status == 403, answer
        assert not [m for m in CONTENT if m in json.dumps(answer)]
        assert served.api("GET", f"/config/{name}", token=WEB_READ)[0] == 403
    status, _, answer = served.api("POST", "/validate", json.dumps(docs(web_yaml=None)), WEB_READ)
    assert status == 200 and "-domain: web" in answer["diff"], answer


def test_a_clash_with_a_document_the_token_may_not_read_names_nothing_of_it(
    served: Served,
) -> None:
    """A web token validating a second quota file (for its own namespace) learns that a
    document it may not read has a problem, and not which one, where, or what it holds."""
    text = "namespaces:\n  web:\n    buckets:\n      b: {size: 1, fill_rate: 1}\n"
    body = json.dumps(docs(a_yaml=text))
    status, _, answer = served.api("POST", "/validate", body, WEB_READ)
    assert status == 200 and not answer["valid"], answer
    assert "a problem in a document this token may not read" in json.dumps(answer)
    assert not [m for m in CONTENT + NAMES if m in json.dumps(answer)], answer
    status, _, answer = served.api("POST", "/validate", body, ROOT)
    assert "quota.yaml" in json.dumps(answer["problems"]), answer


@pytest.mark.parametrize("token", [ROOT, WEB_WRITE])
def test_a_key_that_is_not_a_string_is_refused_with_its_file_and_line(
    served: Served, token: str
) -> None:
    """PUT zz.yaml with ``!!bool access: 1`` (a key that is not a string) is 400 naming
    zz.yaml and line 2, writes nothing and logs no traceback, for any write token."""
    before = served.version()
    status, _, answer = served.put("zz.yaml", "domain: web\n!!bool access: 1", before, token)
    assert status == 400, answer
    problem = answer["problems"][0]
    assert (problem["file"], problem["line"]) == ("zz.yaml", 2), answer
    assert "not a string" in problem["message"]
    assert served.version() == before and tracebacks(served) == 0


@pytest.mark.parametrize(
    "name", ["x" * 245 + ".yaml", "/".join(["d" * 200] * 6) + ".yaml"], ids=["part", "path"]
)
def test_a_name_too_long_for_a_file_is_400_naming_it(served: Served, name: str) -> None:
    """A valid document under a name too long to stage beside its file (a part over 240
    characters; a path over 1024) is 400 naming ``name``, not a disk error (500), and
    writes nothing."""
    before = served.version()
    status, _, answer = served.put(name, WEB.replace("domain: web", "domain: long"), before)
    assert status == 400 and "name" in answer["error"] and "too long" in answer["error"], answer
    assert served.version() == before


def test_a_flood_of_writes_without_a_token_is_logged_at_a_bounded_rate(served: Served) -> None:
    """200 writes without a known token are 401, counted, and logged once (then counted
    into the next line), where a token holder's refusals are each logged with its user."""
    log = served.log
    before = log.read_text(errors="replace").count("/api/v1/rollback refused")
    for _ in range(200):
        assert served.api("POST", "/rollback", '{"version": 1}', "no-such-token")[0] == 401
    lines = log.read_text(errors="replace").count("/api/v1/rollback refused")
    assert lines - before <= 1, lines - before
    assert served.api("POST", "/rollback", '{"version": 1}', WEB_WRITE)[0] == 403
    assert "rollback refused: walt's token may not write every document" in log.read_text()


def bomb() -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\ndomain: web\n"


LIMIT = (
    "domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %s}\n"
)
META = "domain: web\ndescriptors:\n  - key: k\n    metadata: %s\n"
#: Documents that once reached the loader or the scopes reader unchecked: (text, line).
HOSTILE = {
    "bool tag on a key": ("domain: web\n!!bool access: 1", 2),
    "number key": ("domain: web\n1: x\n", 2),
    "list key": ("? [a, b]\n: c\ndomain: web\n", 1),
    "int tag on text": (LIMIT % "!!int abc", 4),
    "float tag on text": (LIMIT % "!!float abc", 4),
    "empty float": (LIMIT % "!!float", 4),
    "5000 digits": (LIMIT % ("9" * 5000), 4),
    "bool key in metadata": (META % "{!!bool x: 1}", 4),
    "bad timestamp in metadata": (META % "{x: !!timestamp 2020-99-99}", 4),
    "timestamp tag on a key": ("domain: web\n!!timestamp x: 1\n", 2),
    "python tag": ("domain: !!python/object:os.system x\n", 1),
    "local tag": ("domain: !secret web\n", 1),
    "binary tag": ("domain: !!binary abc\n", 1),
    "alias bomb": (bomb(), 1),
    "deep nesting": ("domain: web\nx: " + "[" * 5000 + "]" * 5000 + "\n", 2),
}


@pytest.mark.parametrize(("text", "line"), HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_document_is_400_with_its_file_and_line_never_500(
    served: Served, text: str, line: int
) -> None:
    """Written by an unscoped or a scoped token, or validated, a document with YAML tag
    tricks, keys that are not strings, aliases or deep nesting is refused naming its
    file and line: never 500, never a traceback, no version written."""
    before = served.version()
    for token in (ROOT, WEB_WRITE):
        status, _, answer = served.put("zz.yaml", text, before, token)
        assert status == 400, answer
        assert (answer["problems"][0]["file"], answer["problems"][0]["line"]) == ("zz.yaml", line)
    body = json.dumps(docs(zz_yaml=text))
    status, _, answer = served.api("POST", "/validate", body, WEB_READ)
    assert status == 200 and not answer["valid"], answer
    assert answer["problems"][0]["line"] == line
    assert served.version() == before and tracebacks(served) == 0


def test_bodies_too_deep_or_not_text_are_400_never_500(served: Served) -> None:
    """A JSON body nested 200,000 deep is 400, and so is a document's text holding a lone
    surrogate (not UTF-8 text): never 500."""
    deep = "[" * 200_000 + "]" * 200_000
    assert served.api("POST", "/validate", deep, WEB_READ)[0] == 400
    deep = '{"documents": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert served.api("POST", "/validate", deep, WEB_READ)[0] == 400
    surrogate = '{"documents": {"zz.yaml": "domain: \\ud800"}}'
    status, _, answer = served.api("POST", "/validate", surrogate, ROOT)
    assert status == 400 and "surrogate" in answer["error"], answer
    assert tracebacks(served) == 0


def loaded_scopes(name: str, text: str) -> set[str]:
    """The scopes of what the loader reads from one document."""
    config = load_sources([(name, text)])
    found = set(config.domains)
    if config.quota is not None:
        found |= set(config.quota.namespaces)
        if config.quota.global_default_bucket is not None:
            found.add("@global_default_bucket")
    if config.resources:
        found.add("@resources")
    if config.access is not None:
        found.add("@access")
    return found


MERGED = "<<: {domain: payments}\ndescriptors: []\n"


@pytest.mark.parametrize(
    "path",
    [*sorted(Path(__file__).parent.parent.joinpath("descriptors").glob("*.yaml")), None],
    ids=lambda p: p.name if p else "samples",
)
def test_a_documents_scopes_are_what_the_loader_reads_from_it(path: Path | None) -> None:
    """For every example document and the samples here, the scopes a token needs are the
    domains, namespaces, resources or policy the loader reads from it."""
    texts = [(path.name, path.read_text())] if path else [
        ("w.yaml", WEB), ("p.yaml", PAYMENTS), ("a.yaml", ACCESS), ("q.yaml", QUOTA),
        ("m.yaml", MERGED),  # a merge key names the domain
    ]  # fmt: skip
    for name, text in texts:
        assert read_scopes(name, text) == loaded_scopes(name, text), name
    assert document_scopes(MERGED) == {"payments"}
