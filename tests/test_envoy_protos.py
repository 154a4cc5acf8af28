"""Ferryman loads beside any other user of Envoy's protos (xds-protos, envoy-data-plane)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2

from ferryman.core.wire import mark_negative_hits, negative_hits

from helpers.client_domain import CLIENT_CONFIG
from helpers.server import ConfigDir, ServerFactory

SERVICE = Path(__file__).resolve().parents[1] / "service"

PROGRAM = textwrap.dedent(
    """
    import sys

    # Another user of Envoy's API registers its files first, as an application would.
    from envoy.service.ratelimit.v3 import rls_pb2
    from envoy.service.rate_limit_quota.v3 import rlqs_pb2
    import envoy_data_plane.envoy.service.ratelimit.v3 as data_plane

    import ferryman

    with ferryman.Client(sys.argv[1], timeout=5, fail_open=False) as client:
        result = client.should_rate_limit("client", [{"fixed": "x"}])
    print(result.code.name, rls_pb2.RateLimitRequest.DESCRIPTOR.full_name,
          rlqs_pb2.BucketId.DESCRIPTOR.full_name, data_plane.RateLimitRequest.__name__)
    """
)


def test_a_program_importing_xds_protos_first_uses_the_client(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """Envoy's RLS module imported from xds-protos, then ferryman.Client: no duplicate proto
    file, and the client's call is answered (envoy-data-plane loads beside both)."""
    config_dir.write("client.yaml", CLIENT_CONFIG)
    server = make_server(real_clock=True)
    env = {**os.environ, "PYTHONPATH": str(SERVICE)}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, f"127.0.0.1:{server.service.grpc_port}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "OK",
        "envoy.service.ratelimit.v3.RateLimitRequest",
        "envoy.service.rate_limit_quota.v3.BucketId",
        "RateLimitRequest",
    ]


def test_negative_hits_newer_than_xds_protos_is_read_from_the_wire() -> None:
    """Envoy 1.40's is_negative_hits (field 4, unknown to xds-protos) is read and written."""
    plain = ratelimit_pb2.RateLimitDescriptor()
    plain.entries.add(key="k", value="v")
    assert not negative_hits(plain)
    marked = ratelimit_pb2.RateLimitDescriptor()
    marked.CopyFrom(plain)
    mark_negative_hits(marked)
    assert negative_hits(marked)
    # The bytes Envoy 1.40 sends for the field: tag 0x20 (field 4, varint), value 1.
    assert marked.SerializeToString() == plain.SerializeToString() + b"\x20\x01"
    assert negative_hits(ratelimit_pb2.RateLimitDescriptor.FromString(b"\x20\x01"))
