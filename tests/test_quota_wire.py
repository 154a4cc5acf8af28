"""A client built from the quota service's own .proto, in a process without ferryman, works
unchanged against ferryman's Allow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from grpc_tools import protoc  # type: ignore[import-untyped]

from helpers.server import ConfigDir, ServerFactory
from helpers.stores import on_stores

ROOT = Path(__file__).resolve().parents[1]
# The quota service's published contract, kept with the tests (tests/contracts/README.md).
SPEC = ROOT / "tests" / "contracts" / "quota_service.proto"
PACKAGED = ROOT / "service" / "ferryman" / "_proto" / "quotaservice" / "quota_service.proto"

CLIENT = """
import json, sys
import grpc
import quota_service_pb2 as pb, quota_service_pb2_grpc as rpc

stub = rpc.QuotaServiceStub(grpc.insecure_channel(sys.argv[1]))
out = []
for ns, bucket, tokens, override in json.loads(sys.argv[2]):
    req = pb.AllowRequest(namespace=ns, bucket_name=bucket, tokens_requested=tokens)
    if override is not None:
        req.max_wait_time_override = True
        req.max_wait_millis_override = override
    r = stub.Allow(req, timeout=10)
    out.append([pb.AllowResponse.Status.Name(r.status), r.tokens_granted, r.wait_millis])
print(json.dumps(out))
"""

QUOTA = """
namespaces:
  svc:
    buckets:
      db: {size: 10, fill_rate: 10, wait_timeout_millis: 1000, max_debt_millis: 2000}
"""


@pytest.fixture(scope="module")
def raw_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The spec's proto compiled by protoc into a directory of its own, with a client script."""
    out = tmp_path_factory.mktemp("raw_client")
    (out / "quota_service.proto").write_bytes(SPEC.read_bytes())
    code = protoc.main(
        [
            "protoc",
            f"-I{out}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "quota_service.proto",
        ]
    )
    assert code == 0
    (out / "client.py").write_text(CLIENT)
    return out


def test_packaged_proto_is_the_spec() -> None:
    """The .proto ferryman serves is the wire contract, byte for byte."""
    assert PACKAGED.read_bytes() == SPEC.read_bytes()


@on_stores("memory", "redis")
def test_raw_client_gets_the_spec_answers(
    raw_client: Path, config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """The spec's example and each refusal, as a quota service client sees them."""
    config_dir.write("quota.yaml", QUOTA)
    server = make_server()
    calls = [
        ["svc", "db", 10, None],
        ["svc", "db", 5, None],
        ["svc", "db", 10, None],
        ["svc", "db", 10, None],
        ["svc", "db", 11, None],
        ["svc", "nope", 1, None],
        ["svc", "db", -1, None],
        ["svc", "db", 1, -5],
    ]
    env = {"PATH": os.environ.get("PATH", "")}  # no PYTHONPATH: no ferryman in this process
    run = subprocess.run(
        [sys.executable, "client.py", f"127.0.0.1:{server.service.grpc_port}", json.dumps(calls)],
        cwd=raw_client,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [
        ["OK", 10, 0],
        ["OK", 5, 0],
        ["OK", 10, 500],
        ["REJECTED_TIMEOUT", 0, 0],
        ["REJECTED_TOO_MANY_TOKENS_REQUESTED", 0, 0],
        ["REJECTED_NO_BUCKET", 0, 0],
        ["REJECTED_INVALID_REQUEST", 0, 0],
        ["REJECTED_INVALID_REQUEST", 0, 0],
    ]
