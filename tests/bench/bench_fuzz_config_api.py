"""Random and mutated requests to every route of the config API of a real `ferryman serve`
(memory backend, files store): YAML tag tricks, keys that are not strings, anchors and
aliases, huge and deep documents, and JSON bodies of every shape, sent with an unscoped
token and with tokens scoped to one domain. Prints the statuses, the server's resident
memory as the run goes, the tracebacks it logged and the answers to a scoped token that
showed another domain's document or the access policy (none of either expected).

    python tests/bench/bench_fuzz_config_api.py [--cases 100000] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the tests/ helpers

from ferryman.apis.config_api import ROUTES  # noqa: E402
from ferryman.edge.http import MAX_BODY  # noqa: E402

from helpers.config_api import TOKENS, WRITE  # noqa: E402

ROOT, WEB_READ, WEB_WRITE = WRITE, "web-r", "web-w"
SCOPED = f"{WEB_READ} wendy read web\n{WEB_WRITE} walt write web\n"

# The server's documents; the markers are what the scoped tokens must never be shown.
SERVED = {
    "web.yaml": "domain: web\ndescriptors:\n  - key: user\n"
    "    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    "secret.yaml": "domain: payments\ndescriptors:\n  - key: ledger_marker_7f3\n"
    "    rate_limit: {unit: second, requests_per_unit: 5}\n",
    "access.yaml": "access:\n  - identities: ['spiffe://grant-marker-9c1/*']\n"
    "    allow: {rls: ['*']}\n  - identities: [anonymous]\n    allow: {rls: ['*']}\n",
    "quota.yaml": "namespaces:\n  pay_ns:\n    buckets:\n"
    "      b_marker_q2: {size: 2, fill_rate: 1, max_tokens_per_request: 2}\n",
}
MARKERS = ("ledger_marker_7f3", "grant-marker-9c1", "b_marker_q2")

# What the cases start from: documents of every kind, none holding a marker.
SEEDS = [
    "domain: fz\ndescriptors:\n  - key: user\n    value: bob\n"
    "    rate_limit: {unit: minute, requests_per_unit: 10}\n    metadata: {team: a}\n"
    "    descriptors:\n      - key: path\n"
    "        rate_limit: {unit: second, requests_per_unit: 2}\n",
    "domain: web\ndescriptors:\n  - key: user\n"
    "    rate_limit: {unit: hour, requests_per_unit: 7}\n",
    "domain: fz2\ndescriptors:\n  - key: t\n    token_bucket: {size: 2, fill_rate: 0.5}\n"
    "  - key: g\n    rate_limits: [{unit: hour, requests_per_unit: 2}]\n"
    "  - key: s\n    sliding_window: {unit: hour, requests_per_unit: 2}\n",
    "namespaces:\n  web:\n    buckets:\n      b: {size: 2, fill_rate: 1}\n",
    "access:\n  - identities: [anonymous]\n    allow: {rls: ['*']}\n",
    "resources:\n  - identifier_glob: 'fz*'\n    capacity: 10\n    safe_capacity: 1\n",
]
TAGS = [
    "!!bool", "!!int", "!!float", "!!null", "!!timestamp", "!!binary", "!!str", "!!set",
    "!!omap", "!!pairs", "!!map", "!!seq", "!!python/object:os.system", "!local",
    "!<tag:yaml.org,2002:int>", "!!merge", "!!python/name:os.system",
]  # fmt: skip
KEYS = ["1", "true", "null", "1.5", "~", "[a, b]", "{a: b}", "!!bool access", "!!int x",
        "2020-01-01", "0x1f", ".inf", "<<", "? [x]\n"]  # fmt: skip
NAMES = [
    "web.yaml", "secret.yaml", "access.yaml", "quota.yaml", "zz0.yaml", "zz1.yaml",
    "d/zz2.yml", "web.yaml/x.yaml", "../etc.yaml", ".hidden.yaml", "a.txt", "", "%00.yaml",
    "x" * 300 + ".yaml", "zz\u00e9.yaml",
]  # fmt: skip
OWN = ("zz0.yaml", "zz1.yaml", "d/zz2.yml")  # the names the unscoped token may write
HUGE = 100_000


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# -- documents -------------------------------------------------------------------------------


def _lines(rng: random.Random, text: str) -> tuple[list[str], int]:
    lines = text.splitlines() or [""]
    return lines, rng.randrange(len(lines))


def tag(rng: random.Random, text: str) -> str:
    """A tag before a key or a value of some line."""
    lines, i = _lines(rng, text)
    line = lines[i]
    head, colon, tail = line.partition(": ")
    pick = rng.choice(TAGS)
    if colon and rng.random() < 0.5:
        lines[i] = f"{head}: {pick} {tail}"
    else:
        stripped = line.lstrip(" -")
        lines[i] = line[: len(line) - len(stripped)] + f"{pick} {stripped}"
    return "\n".join(lines) + "\n"


def key(rng: random.Random, text: str) -> str:
    """A key that is not a string, in place of one or added."""
    lines, i = _lines(rng, text)
    line = lines[i]
    head, colon, tail = line.partition(":")
    pad = line[: len(head) - len(head.lstrip(" -"))]
    if colon and rng.random() < 0.6:
        lines[i] = f"{pad}{rng.choice(KEYS)}:{tail}"
    else:
        lines.insert(rng.randrange(len(lines) + 1), f"{rng.choice(KEYS)}: {rng.choice(KEYS)}")
    return "\n".join(lines) + "\n"


def anchor(rng: random.Random, text: str) -> str:
    """Anchors and aliases: a merge, an alias of a subtree, an undefined or looping one."""
    choice = rng.randrange(5)
    if choice == 0:
        return text + "base: &b {domain: payments}\n<<: *b\n"
    if choice == 1:
        return text.replace("descriptors:", "descriptors: &d", 1) + "more: *d\n"
    if choice == 2:
        return text + "x: *nowhere\n"
    if choice == 3:
        return text + "loop: &l [*l]\n"
    return "m: &m {domain: payments}\n" + text.replace("domain:", "<<: *m\nold:", 1)


def bomb(rng: random.Random, text: str) -> str:
    width, depth = rng.randint(2, 9), rng.randint(3, 12)
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth)]
    return text + "\n".join(lines) + "\n"


def deep(rng: random.Random, text: str) -> str:
    n = rng.choice([10, 63, 64, 65, 200, 5000, 100_000])
    if rng.random() < 0.5:
        return text + "x: " + "[" * n + "]" * n + "\n"
    n = min(n, 2000)
    return text + "x:\n" + "".join("  " * i + f"- k{i}:\n" for i in range(n))


def huge(rng: random.Random, text: str) -> str:
    line = "  - {key: k%d, rate_limit: {unit: second, requests_per_unit: 1}}\n"
    n = rng.choice([1000, 10_000, 14_000, 16_000])  # about 0.8 to 1.1 MiB at the top
    return "domain: fzbig\ndescriptors:\n" + "".join(line % i for i in range(n))


def garbage(rng: random.Random, text: str) -> str:
    data = bytearray(text.encode())
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    out = data.decode("utf-8", "replace")
    if rng.random() < 0.3:
        out = out[: rng.randrange(len(out) + 1)]
    if rng.random() < 0.2:
        out += "".join(chr(rng.choice([0, 7, 0x85, 0xFEFF, 0x2028, rng.randrange(0x10FFFF)])))
    return out


def reshape(rng: random.Random, text: str) -> str:
    lines, i = _lines(rng, text)
    kind = rng.randrange(3)
    if kind == 0:
        lines.insert(i, lines[i])  # a key twice
    elif kind == 1:
        lines[i] = " " * rng.randint(0, 6) + lines[i].lstrip()
    else:
        del lines[i]
    return "\n".join(lines) + "\n"


MUTATIONS: list[tuple[Callable[[random.Random, str], str], float]] = [
    (tag, 3), (key, 3), (anchor, 2), (reshape, 2), (garbage, 2), (bomb, 0.3),
    (deep, 0.3), (huge, 0.03),
]  # fmt: skip


def document(rng: random.Random) -> str:
    text = rng.choice(SEEDS)
    if rng.random() < 0.05:
        return text  # some valid
    funcs, weights = zip(*MUTATIONS, strict=True)
    for f in rng.choices(funcs, weights, k=rng.choice([1, 1, 2, 3])):
        text = f(rng, text)
    return text


# -- requests --------------------------------------------------------------------------------

Case = tuple[str, str, str, bytes | None, dict[str, str]]  # token, method, path, body, headers


def junk_json(rng: random.Random) -> bytes:
    n = rng.choice([10, 1000, 100_000, 300_000])
    return rng.choice(
        [
            ("[" * n + "]" * n).encode(),
            ('{"documents": ' + "{" * 10 + "}" * 10 + "}").encode(),
            b'{"documents": []}',
            b'{"documents": {"a.yaml": 5}}',
            b'{"documents": {"a.yaml": "domain: \\ud800"}}',
            b'{"version": 1e999}',
            b'{"version": "1"}',
            b'{"version": ' + b"9" * 5000 + b"}",
            b"[1, 2]",
            b"not json",
            b"\xff\xfe",
            b'{"domain": "payments", "descriptor": [{"key": 1}]}',
            b'{"namespace": ["x"], "bucket": {}}',
            json.dumps({"documents": {rng.choice(NAMES): "x" * 200_000}}).encode(),
        ]
    )


def name_for(rng: random.Random, token: str) -> str:
    return rng.choice(OWN) if token == ROOT else rng.choice(NAMES)


def case(rng: random.Random, version: int) -> Case:
    token = rng.choice([ROOT, ROOT, WEB_READ, WEB_WRITE, WEB_WRITE])
    headers = {"If-Match": rng.choice([f'"{version}"', f'"{version}"', '"0"', "junk", '"99"'])}
    r = rng.random()
    if r < 0.35:
        names = {name_for(rng, token) if token == ROOT else rng.choice(NAMES) for _ in range(3)}
        if token == ROOT:
            names |= {rng.choice(list(SERVED))}  # validate reaches every document for root
        docs = {n: None if rng.random() < 0.2 else document(rng) for n in names}
        return token, "POST", "/validate", json.dumps({"documents": docs}).encode(), headers
    if r < 0.62:
        texts = {name_for(rng, token): document(rng) for _ in range(rng.randint(1, 3))}
        if token == ROOT and sum(map(len, texts.values())) > HUGE:
            # Read and refused as stale, never stored: a megabyte document in force would
            # make every later validation of the whole set a megabyte longer.
            headers["If-Match"] = '"0"'
        if r < 0.55:
            name, text = next(iter(texts.items()))
            return token, "PUT", f"/config/{name}", text.encode(), headers
        return token, "PUT", "/config", json.dumps({"documents": texts}).encode(), headers
    if r < 0.66:
        return token, "DELETE", f"/config/{name_for(rng, token)}", None, headers
    if r < 0.78:
        path = rng.choice(
            ["/config", f"/config/{rng.choice(NAMES)}", "/history", "/history/1",
             f"/history/{rng.choice(['-1', 'x', '9' * 50, str(version)])}",
             f"/diff?from=1&to={version}", "/diff?from=x", f"/diff?to={'9' * 40}"]
        )  # fmt: skip
        return token, "GET", path, None, headers
    if r < 0.82:
        body = json.dumps({"version": rng.choice([1, version, -1, 0, 10**30, True])}).encode()
        return token, "POST", "/rollback", body, headers
    if r < 0.88:
        body = json.dumps(
            rng.choice(
                [
                    {"domain": "web", "descriptor": [{"key": "user", "value": "x"}]},
                    {"domain": "payments", "descriptor": [{"key": "k", "value": "v"}]},
                    {"namespace": "pay_ns", "bucket": "b_marker_q2"},
                    {"namespace": "web", "bucket": "b"},
                    {"domain": "web", "descriptor": []},
                ]
            )
        ).encode()
        return token, "POST", "/counters/reset", body, headers
    method, path = rng.choice([("POST", "/validate"), ("PUT", "/config"), ("POST", "/rollback")])
    return token, method, path, junk_json(rng), headers


def cases(seed: int, count: int, version: Callable[[], int]) -> Iterator[Case]:
    rng = random.Random(seed)
    for _ in range(count):
        yield case(rng, version())


# -- the run ---------------------------------------------------------------------------------


def serve(work: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    config = work / "config"
    config.mkdir()
    for name, text in SERVED.items():
        (config / name).write_text(text)
    (work / "tokens").write_text(TOKENS + SCOPED)
    log = work / "serve.log"
    env = {**os.environ, "USE_STATSD": "false", "ADMIN_TOKENS_FILE": str(work / "tokens")}
    ports = ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ferryman", "serve", "--config", str(config), *ports],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"debug :(\d+)", log.read_text(errors="replace"))
        if found:
            return proc, int(found.group(1)), log
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("ferryman serve did not start:\n" + log.read_text())


class Client:
    """One kept-alive connection to the debug port, opened again when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def send(self, token: str, method: str, path: str, body: bytes | None,
             headers: dict[str, str]) -> tuple[int, bytes]:  # fmt: skip
        sent = {"Authorization": f"Bearer {token}", **headers}
        if body is not None:
            yaml_body = path.startswith("/config/")
            sent["Content-Type"] = "application/yaml" if yaml_body else "application/json"
        target = "/api/v1" + quote(path, safe="/%?=&")
        if body is not None and len(body) > MAX_BODY:
            return self._oversized(method, target, sent, len(body))
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn = self.conn
        try:
            conn.request(method, target, body, sent)
            response = conn.getresponse()
            data = response.read()
        except (http.client.HTTPException, OSError):
            conn.close()
            self.conn = None
            raise
        if response.getheader("Connection", "").lower() == "close":
            conn.close()
            self.conn = None
        return response.status, data

    def _oversized(
        self, method: str, target: str, headers: dict[str, str], length: int
    ) -> tuple[int, bytes]:
        """A body past the server's limit: its head alone, and the answer (the server
        answers without reading the body, then closes)."""
        head = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
        return status, data.partition(b"\r\n\r\n")[2]


def run(
    proc: subprocess.Popen[bytes], port: int, count: int, seed: int
) -> tuple[dict[str, Any], list[tuple[int, int]], float]:
    client = Client(port)
    statuses: collections.Counter[str] = collections.Counter()
    routes: collections.Counter[str] = collections.Counter()
    leaks: list[str] = []
    failed: list[str] = []
    cuts: list[str] = []
    version = [1]

    def current() -> int:
        return version[0]

    samples = [(0, rss_kib(proc.pid))]
    start = time.monotonic()
    for n, (token, method, path, body, headers) in enumerate(cases(seed, count, current), 1):
        sent_at = time.monotonic()
        try:
            status, data = client.send(token, method, path, body, headers)
        except (http.client.HTTPException, OSError) as exc:
            status, data = 0, b""
            if len(cuts) < 10:
                took = time.monotonic() - sent_at
                cuts.append(f"{method} {path} ({len(body or b'')} bytes, {took:.1f} s): {exc!r}")
        route = _route(method, path)
        routes[route] += 1
        statuses[f"{status}"] += 1
        if status >= 500 and len(failed) < 10:
            failed.append(f"{method} {path} {(body or b'')[:120]!r}: {status}")
        if token != ROOT and any(m.encode() in data for m in MARKERS):
            statuses["shown to a scoped token"] += 1
            if len(leaks) < 10:
                leaks.append(f"{token} {method} {path}: {data[:200]!r}")
        if status == 200 and method != "GET" and data.startswith(b"{"):
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                version[0] = max(version[0], int(json.loads(data).get("version", 0)))
        if status == 412:
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                version[0] = int(json.loads(data)["current"])
        if n % max(1, count // 10) == 0:
            samples.append((n, rss_kib(proc.pid)))
    elapsed = time.monotonic() - start
    found = {
        "statuses": statuses, "routes": routes, "leaks": leaks, "failed": failed, "cuts": cuts
    }  # fmt: skip
    return found, samples, elapsed


def _route(method: str, path: str) -> str:
    path = "/api/v1" + path.partition("?")[0]
    for m, pattern in ROUTES:
        if m == method and (
            pattern == path or (pattern.endswith("*") and path.startswith(pattern[:-1]))
        ):
            return f"{m} {pattern}"
    return f"{method} {path} (no route)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log", type=Path, help="keep the server's log there")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, port, log = serve(Path(tmp))
        try:
            found, samples, elapsed = run(proc, port, args.cases, args.seed)
        finally:
            proc.terminate()
            proc.wait(20)
        text = log.read_text(errors="replace")
        if args.log:
            args.log.write_text(text)
    print(
        f"{args.cases} cases in {elapsed:.1f} s ({args.cases / elapsed:.0f}/s), seed {args.seed}\n"
    )
    print("| route | calls |\n|---|---|")
    for name, count in sorted(found["routes"].items()):
        print(f"| {name} | {count} |")
    print("\n| answered | calls |\n|---|---|")
    for name, count in sorted(found["statuses"].items()):
        print(f"| {name} | {count} |")
    print("\n| after cases | server RSS (MiB) |\n|---|---|")
    for n, kib in samples:
        print(f"| {n} | {kib / 1024:.1f} |")
    print(f"\ntracebacks logged: {text.count('Traceback')}")
    if "Traceback" in text:
        first = text[text.index("Traceback") :].splitlines()[:40]
        print("the first:\n    " + "\n    ".join(first))
    shown = found["statuses"].pop("shown to a scoped token", 0)
    print(f"answers to a scoped token showing another document: {shown}")
    for line in found["leaks"]:
        print("shown:", line)
    for line in found["failed"]:
        print("failed inside the server:", line)
    for line in found["cuts"]:
        print("connection cut (status 0):", line)


if __name__ == "__main__":
    main()
