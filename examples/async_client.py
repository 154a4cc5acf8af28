"""The asyncio client: concurrent ``request_rate`` calls and the ``grpc.aio`` interceptor.

    python examples/async_client.py [HOST:PORT]

With ``descriptors/burst-cookbook.yaml`` loaded, eight tasks of one user each want a hit of
``simple_user`` (five per second) and may wait up to three seconds: five go at once, the
other three back off and get theirs about a second later. Then one ``Health/Check`` goes
through a ``grpc.aio`` channel with the interceptor. The target defaults to 127.0.0.1:8081.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import cast

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

import ferryman


async def main(target: str) -> int:
    user = {"simple_user": f"async-{uuid.uuid4().hex[:8]}"}
    async with ferryman.AsyncClient(target) as client:
        results = await asyncio.gather(
            *(client.request_rate("cookbook", user, max_wait=3) for _ in range(8))
        )
        for i, r in enumerate(sorted(results, key=lambda r: r.waited), 1):
            print(f"task {i}: success={r.success} waited {r.waited:.2f}s")

        def route(method: str, request: object) -> ferryman.Route | None:
            return ("cookbook", {"simple_user": f"aio-{user['simple_user']}"})

        interceptor = ferryman.AsyncRateLimitInterceptor(client, route, max_wait=1)
        # grpc-stubs wants a cast (or an ignore) for any aio interceptor.
        interceptors = [cast("grpc.aio.ClientInterceptor", interceptor)]
        async with grpc.aio.insecure_channel(target, interceptors=interceptors) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            print(f"intercepted Health/Check: {status}")
    return 0 if all(r.success for r in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081")))
