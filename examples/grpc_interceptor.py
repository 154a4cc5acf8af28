"""Rate-limit your own outgoing gRPC calls: the client interceptor (quota-service pattern).

    python examples/grpc_interceptor.py [HOST:PORT]

Any gRPC service will do as the callee; this example calls the gRPC health service that
ferryman itself serves on HOST:PORT, through a channel whose interceptor asks ferryman
first. Each ``Health/Check`` spends one hit of ``cookbook`` / ``simple_user`` (five per
second, ``descriptors/burst-cookbook.yaml``), so the sixth call in a second is refused with
RateLimitedError before it leaves the process. The target defaults to 127.0.0.1:8081.
"""

from __future__ import annotations

import sys
import uuid

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import ferryman

CALLER = f"health-checker-{uuid.uuid4().hex[:8]}"


def route(method: str, request: object) -> ferryman.Route | None:
    """Health checks spend the caller's hits; every other call goes through unlimited."""
    if method == "/grpc.health.v1.Health/Check":
        return ("cookbook", {"simple_user": CALLER})
    return None


def main(target: str) -> int:
    with ferryman.Client(target) as limiter, grpc.insecure_channel(target) as channel:
        limited = grpc.intercept_channel(channel, ferryman.RateLimitInterceptor(limiter, route))
        health = health_pb2_grpc.HealthStub(limited)
        refused = 0
        for i in range(1, 8):
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            except ferryman.RateLimitedError as exc:
                refused += 1
                print(f"call {i}: refused: {exc}")
            else:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                print(f"call {i}: {status}")
    return 0 if refused == 2 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"))
