"""A `ferryman serve` process with the config API on, and calls to that API."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from ferryman._proto.quotaservice import quota_service_pb2

from helpers.ports import free_port
from helpers.server import quota_stub, wait_for

WRITE = "w-token-1"
READ = "r-token-1"
TOKENS = f"{WRITE} alice write\n{READ} bob read\n"


class Served:
    """One real server process (``python -m ferryman serve``) on free loopback ports."""

    def __init__(
        self,
        config: Path,
        workdir: Path,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> None:
        self.config = config
        self.args = args or []
        self.grpc, self.http, self.debug = free_port(), free_port(), free_port()
        self.log = workdir / f"serve-{self.debug}.log"
        # No drain on SIGTERM unless ``env`` gives one: a stop would wait it out.
        self.env = {**os.environ, "FERRYMAN_SHUTDOWN_DRAIN": "0", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Served:
        args = [sys.executable, "-m", "ferryman", "serve", "--config", str(self.config)]
        args += ["--grpc-port", str(self.grpc), "--http-port", str(self.http)]
        args += ["--debug-port", str(self.debug), *self.args]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(f"ferryman serving (log {self.log})", self._up, timeout=20, interval=0.05)
        return self

    def _up(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the server exited: {self.log.read_text()}")
        try:
            return self.request("GET", "/healthcheck", port=self.http)[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        port: int | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port or self.debug, timeout=30)
        try:
            data = body.encode() if isinstance(body, str) else body
            conn.request(method, path, data, headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def api(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        token: str = WRITE,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """A config API call with ``token``: the status, headers and the JSON (or text). A
        body goes as JSON on POST and as YAML on PUT unless ``headers`` say otherwise."""
        sent = {"Authorization": f"Bearer {token}", **(headers or {})}
        if body is not None and not any(k.lower() == "content-type" for k in sent):
            sent["Content-Type"] = "application/json" if method == "POST" else "application/yaml"
        status, got, raw = self.request(method, "/api/v1" + path, body, sent)
        kind = got.get("Content-Type", "")
        return status, got, json.loads(raw) if kind.startswith("application/json") else raw

    def put(
        self, name: str, text: str, version: int | str, token: str = WRITE
    ) -> tuple[int, dict[str, str], Any]:
        return self.api("PUT", f"/config/{name}", text, token, {"If-Match": f'"{version}"'})

    def put_many(
        self, documents: Mapping[str, str | None], version: int | str
    ) -> tuple[int, dict[str, str], Any]:
        """PUT /api/v1/config: every document (None: deleted) as one version."""
        body = json.dumps({"documents": documents})
        headers = {"If-Match": f'"{version}"', "Content-Type": "application/json"}
        return self.api("PUT", "/config", body, headers=headers)

    def version(self) -> int:
        return int(self.api("GET", "/config")[2]["version"])

    def hit(self, domain: str, *entries: tuple[str, str]) -> int:
        """One ShouldRateLimit through the HTTP /json endpoint: 200 (OK) or 429 (over)."""
        body = json.dumps(
            {
                "domain": domain,
                "descriptors": [{"entries": [{"key": k, "value": v} for k, v in entries]}],
            }
        )
        return self.request("POST", "/json", body, port=self.http)[0]

    def allow(self, namespace: str, bucket: str) -> str:
        """One quotaservice Allow of a token: the answer's status name."""
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            request = quota_service_pb2.AllowRequest(
                namespace=namespace, bucket_name=bucket, tokens_requested=1
            )
            answer = quota_stub(channel).Allow(request, timeout=10)
        return str(quota_service_pb2.AllowResponse.Status.Name(answer.status))

    def status(self) -> dict[str, Any]:
        """The debug port's /status."""
        status, _, raw = self.request("GET", "/status")
        assert status == 200, raw
        data: dict[str, Any] = json.loads(raw)
        return data
