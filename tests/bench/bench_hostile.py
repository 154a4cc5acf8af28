"""Bad input against a real `ferryman serve` (memory backend, mutual TLS on every port):
each hostile request, connection and configuration file, the answers it got (counted), and
the server's resident memory. Prints a Markdown table.

    python tests/bench/bench_hostile.py [--values 1000000] [--max-keys 100000] [--expire]

Needs the test extras (cryptography). ``--values`` distinct descriptor values are sent on a
wildcard rule (128 per request); ``--expire`` then waits for their minute window to end and
reports the counters and memory left.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the tests/ helpers

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: E402

from helpers.certs import Authority, Pem  # noqa: E402

CONFIG = """
domain: bench
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1000000}
"""
SAN = "bench.client"
SERVING = re.compile(r"ferryman serving[^:]*: grpc :(\d+), http :(\d+), debug :(\d+)")
Entry = ratelimit_pb2.RateLimitDescriptor.Entry


def descriptor(entries: list[tuple[str, str]], hits: int | None = None) -> Any:
    d = ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key=k, value=v) for k, v in entries])
    if hits is not None:
        d.hits_addend.value = hits
    return d


def rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class Bench:
    def __init__(self, work: Path, max_keys: int) -> None:
        self.work = work
        self.ca = Authority(work / "ca")
        self.other_ca = Authority(work / "other", "other CA")
        self.server_pem = self.ca.server()
        self.client = self.ca.issue("client", dns=(SAN,), client=True)
        self.config = work / "config"
        self.config.mkdir()
        (self.config / "bench.yaml").write_text(CONFIG)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_", "GRPC_"))}
        env.update(
            GRPC_SERVER_USE_TLS="true",
            GRPC_SERVER_TLS_CERT=str(self.server_pem.cert),
            GRPC_SERVER_TLS_KEY=str(self.server_pem.key),
            GRPC_CLIENT_TLS_CACERT=str(self.ca.cert),
            GRPC_CLIENT_TLS_SAN=SAN,
            MEMORY_MAX_KEYS=str(max_keys),
            LOG_LEVEL="warn",
        )
        self.log = work / "ferryman.log"
        ports = ["--grpc-port", "0", "--http-port", "0", "--debug-port", "0"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ferryman", "serve", "--config", str(self.config), *ports],
                env={**env, "LOG_LEVEL": "info"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            match = SERVING.search(self.log.read_text(errors="replace"))
            if match:
                self.grpc, self.http, self.debug = map(int, match.groups())
                break
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(self.log.read_text())
            time.sleep(0.05)
        self.channel = self.secure_channel(self.client)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.rows: list[tuple[str, str, str, str]] = []

    def secure_channel(self, client: Pem | None, ca: Path | None = None) -> grpc.Channel:
        credentials = grpc.ssl_channel_credentials(
            (ca or self.ca.cert).read_bytes(),
            client.key.read_bytes() if client else None,
            client.cert.read_bytes() if client else None,
        )
        return grpc.secure_channel(f"127.0.0.1:{self.grpc}", credentials)

    def rss(self) -> tuple[int, int]:
        """(current, peak) resident memory in MiB."""
        pid = self.proc.pid
        return rss_kib(pid, "VmRSS") // 1024, rss_kib(pid, "VmHWM") // 1024

    def https(self, port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        import http.client

        context = ssl.create_default_context(cafile=str(self.ca.cert))
        context.load_cert_chain(self.client.cert, self.client.key)
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
        try:
            conn.request(method, path, body=body or None)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.https(self.debug, "GET", "/status")[1])
        return result

    def stat(self, name: str) -> int:
        body = self.https(self.debug, "GET", "/stats")[1].decode()
        for line in body.splitlines():
            key, _, value = line.rpartition(": ")
            if key == name:
                return int(value)
        return 0

    def record(self, what: str, answers: collections.Counter[str], note: str = "") -> None:
        shown = ", ".join(f"{code} x{n}" for code, n in answers.most_common())
        current, peak = self.rss()
        self.rows.append((what, shown, f"{current} / {peak}", note))
        print(f"  {what}: {shown} (RSS {current} MiB, peak {peak}) {note}", file=sys.stderr)

    def calls(self, what: str, make: Callable[[], Any], n: int = 20, note: str = "") -> None:
        answers: collections.Counter[str] = collections.Counter()
        for _ in range(n):
            try:
                response = self.stub.ShouldRateLimit(make(), timeout=10)
                answers[rls_pb2.RateLimitResponse.Code.Name(response.overall_code)] += 1
            except grpc.RpcError as exc:
                answers[exc.code().name] += 1
        self.record(what, answers, note)

    def transport(self, what: str, channel: Callable[[], grpc.Channel], n: int = 5) -> None:
        answers: collections.Counter[str] = collections.Counter()
        request = rls_pb2.RateLimitRequest(domain="bench", descriptors=[descriptor([("k", "t")])])
        for _ in range(n):
            with channel() as ch:
                try:
                    stub = rls_pb2_grpc.RateLimitServiceStub(ch)  # type: ignore[no-untyped-call]
                    stub.ShouldRateLimit(request, timeout=5)
                    answers["OK"] += 1
                except grpc.RpcError as exc:
                    answers[exc.code().name] += 1
        self.record(what, answers)

    def raw(self, what: str, port: int, data: bytes, n: int = 5) -> None:
        """Plaintext bytes to a TLS port: what comes back before the close."""
        answers: collections.Counter[str] = collections.Counter()
        for _ in range(n):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(data)
                try:
                    reply = s.recv(64)
                except OSError:
                    reply = b""
            text = (
                "closed" if not reply else ("HTTP answer" if reply[:5] == b"HTTP/" else "TLS alert")
            )
            answers[text] += 1
        self.record(what, answers)

    def flood(self, values: int) -> None:
        """``values`` distinct values on the wildcard rule, 128 per request, 32 in flight."""
        answers: collections.Counter[str] = collections.Counter()
        start = time.monotonic()
        pending: collections.deque[Any] = collections.deque()

        def requests() -> Iterator[Any]:
            for base in range(0, values, 128):
                batch = [
                    descriptor([("ip", f"v{i}")]) for i in range(base, min(values, base + 128))
                ]
                yield rls_pb2.RateLimitRequest(domain="bench", descriptors=batch)

        def settle(future: Any) -> None:
            try:
                response = future.result()
                for s in response.statuses:
                    answers[rls_pb2.RateLimitResponse.Code.Name(s.code)] += 1
            except grpc.RpcError as exc:
                answers[exc.code().name] += 1

        for request in requests():
            pending.append(self.stub.ShouldRateLimit.future(request, timeout=60))
            if len(pending) >= 32:
                settle(pending.popleft())
        while pending:
            settle(pending.popleft())
        took = time.monotonic() - start
        status = self.status()["memory"]
        self.record(
            f"{values:,} distinct values on a wildcard rule "
            f"(MEMORY_MAX_KEYS={status['max_keys']:,})",
            answers,
            f"{took:.0f} s; counters kept {status['keys']:,}, evicted {status['evicted']:,}, "
            f"refused {status['refused']:,}",
        )

    def config_file(self, what: str, make: Callable[[Path], Path]) -> None:
        before = self.stat("ratelimit.service.config_load_error")
        staging = self.work / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        staged = make(staging)
        target = self.config / staged.name
        start = time.monotonic()
        os.rename(staged, target)
        while self.stat("ratelimit.service.config_load_error") == before:
            if time.monotonic() - start > 60:
                break
            time.sleep(0.02)
        took = time.monotonic() - start
        error = self.status()["config"]["last_error"] or "(none)"
        reason = error.split(": ", 1)[-1]
        reason = re.sub(r"'/[^']*'", "'...'", reason)  # temporary paths say nothing
        reason = reason if len(reason) <= 80 else reason[:77] + "..."
        still = self.stub.ShouldRateLimit(
            rls_pb2.RateLimitRequest(domain="bench", descriptors=[descriptor([("k", "c")])]),
            timeout=10,
        )
        in_force = rls_pb2.RateLimitResponse.Code.Name(still.overall_code)
        self.record(
            what,
            collections.Counter({f"rejected: {reason}": 1}),
            f"rejected {took:.2f} s after the rename (debounce included); "
            f"the last good config answers {in_force}",
        )
        if target.is_symlink() or target.exists():
            target.unlink()

    def stop(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def hostile_files() -> list[tuple[str, Callable[[Path], Path]]]:
    def write(name: str, data: bytes) -> Callable[[Path], Path]:
        def make(d: Path) -> Path:
            (d / name).write_bytes(data)
            return d / name

        return make

    def huge(d: Path) -> Path:
        line = b"  - {key: k, value: v, rate_limit: {unit: second, requests_per_unit: 1}}\n"
        with (d / "huge.yaml").open("wb") as f:
            f.write(b"domain: huge\ndescriptors:\n")
            while f.tell() < 50 << 20:
                f.write(line * (1 << 14))
        return d / "huge.yaml"

    def link(name: str, target: str) -> Callable[[Path], Path]:
        def make(d: Path) -> Path:
            os.symlink(target, d / name)
            return d / name

        return make

    def fifo(d: Path) -> Path:
        os.mkfifo(d / "pipe.yaml")
        return d / "pipe.yaml"

    bomb = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb += ["domain: bomb", "descriptors: *a9"]
    return [
        ("invalid YAML", write("bad.yaml", b"domain: x\ndescriptors: [unclosed\n")),
        ("alias bomb (9^9 leaves)", write("bomb.yaml", "\n".join(bomb).encode())),
        ("50 MB file", huge),
        (
            "10,000-deep nesting",
            write("deep.yaml", b"domain: d\ndescriptors: " + b"[" * 10_000 + b"]" * 10_000),
        ),
        ("binary file", write("blob.yaml", bytes(range(256)) * 64)),
        ("symlink loop", link("loop.yaml", "loop.yaml")),
        ("file removed before it is read", link("gone.yaml", "removed.yaml")),
        ("FIFO", fifo),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", type=int, default=1_000_000)
    parser.add_argument("--max-keys", type=int, default=100_000)
    parser.add_argument("--expire", action="store_true", help="wait for the flood to expire")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ferryman-hostile-"))
    bench = Bench(work, args.max_keys)
    try:
        current, peak = bench.rss()
        bench.rows.append(("(server started)", "", f"{current} / {peak}", ""))
        from ferryman.engine import validate as v

        def req(
            entries: list[tuple[str, str]],
            hits: int | None = None,
            domain: str = "bench",
            times: int = 1,
        ) -> Callable[[], Any]:
            message = rls_pb2.RateLimitRequest(
                domain=domain, descriptors=[descriptor(entries, hits)] * times
            )
            return lambda: message

        ok = req([("k", "v")])
        many = [(f"k{i}", "v") for i in range(v.MAX_ENTRIES + 1)]
        print("requests", file=sys.stderr)
        cases: list[tuple[str, Callable[[], Any], str]] = [
            ("well-formed request (baseline)", ok, ""),
            (
                f"message over {v.MAX_MESSAGE_BYTES >> 20} MiB",
                req([("k", "x" * (v.MAX_MESSAGE_BYTES + 1))]),
                "",
            ),
            (f"{v.MAX_DESCRIPTORS + 1} descriptors", req([("k", "v")], times=129), ""),
            (f"{v.MAX_ENTRIES + 1} entries in a descriptor", req(many), ""),
            (f"key of {v.MAX_KEY + 1} characters", req([("k" * (v.MAX_KEY + 1), "v")]), ""),
            (f"value of {v.MAX_VALUE + 1} characters", req([("k", "v" * (v.MAX_VALUE + 1))]), ""),
            ("domain of 1,000 characters", req([("k", "v")], domain="b" * 1000), ""),
            ("descriptor hits_addend 2^64-1", req([("k", "v")], hits=2**64 - 1), ""),
            (
                "descriptor hits_addend 2^32-1 (allowed)",
                req([("k", "big")], hits=2**32 - 1),
                "the counter passes 2^32 and goes on: over the limit, no overflow",
            ),
            ("descriptor with no entries", req([]), "OK with no limit, as the reference"),
        ]
        for what, make, note in cases:
            bench.calls(what, make, note=note)
        undecodable = bench.channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=lambda b: b,
            response_deserializer=rls_pb2.RateLimitResponse.FromString,
        )
        answers: collections.Counter[str] = collections.Counter()
        for _ in range(20):
            try:
                undecodable(b"\x0a\x02\xff\xfe", timeout=5)
                answers["OK"] += 1
            except grpc.RpcError as exc:
                answers[exc.code().name] += 1
        bench.record("undecodable bytes (invalid UTF-8)", answers)
        print("transport", file=sys.stderr)
        bench.transport(
            "plaintext gRPC client", lambda: grpc.insecure_channel(f"127.0.0.1:{bench.grpc}")
        )
        bench.transport(
            "client trusting another CA",
            lambda: bench.secure_channel(bench.client, bench.other_ca.cert),
        )
        bench.transport("no client certificate", lambda: bench.secure_channel(None))
        stranger = bench.ca.issue("stranger", dns=("someone.else",), client=True)
        bench.transport(
            "client certificate without the SAN", lambda: bench.secure_channel(stranger)
        )
        other = bench.other_ca.issue("other", dns=(SAN,), client=True)
        bench.transport("client certificate from another CA", lambda: bench.secure_channel(other))
        http_get = b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n"
        bench.raw("plaintext HTTP to the HTTPS port", bench.http, http_get)
        bench.raw("plaintext HTTP to the debug port", bench.debug, http_get)
        print("configuration files", file=sys.stderr)
        for what, write in hostile_files():
            bench.config_file(what, write)
        print("cardinality", file=sys.stderr)
        bench.flood(args.values)
        if args.expire:
            time.sleep(61 - time.time() % 60 + 1)
            bench.calls("one request after the window ended", ok, n=1)
            memory = bench.status()["memory"]
            bench.rows[-1] = (*bench.rows[-1][:3], f"counters kept {memory['keys']:,}")
    finally:
        bench.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("| bad input | answers (count) | RSS / peak RSS (MiB) | notes |")
    print("|---|---|---|---|")
    for row in bench.rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
