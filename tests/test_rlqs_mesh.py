"""A simulated mesh on Envoy's quota service over real gRPC: a few hundred streams from one
process, each reporting as Envoy 1.40 does, against an in-process server ticking every
0.1 s. What it asserts is not timing: which streams are accepted, what each Envoy holds,
what the shares of a bucket add up to."""

from __future__ import annotations

import asyncio
import time

from helpers.rlqs_mesh import BucketKey, Envoy, Held, Mesh, until
from helpers.server import ConfigDir, ServerFactory

ENVOYS = 200
ROUTES = 4
LIMIT = 600.0
CONFIG = """
domain: mesh
descriptors:
  - key: route
    rate_limit: {unit: second, requests_per_unit: 600}
"""


def _routes_of(i: int) -> list[dict[str, str]]:
    return [{"route": f"r{i % ROUTES}"}, {"route": f"r{(i + 1) % ROUTES}"}]


def _high(envoy: Envoy, bucket: BucketKey) -> bool:
    return (envoy.index + int(bucket[0][1][1:])) % 2 == 0


def test_a_mesh_of_streams_holds_shares_that_add_up_to_the_limit_after_a_demand_step(
    config_dir: ConfigDir, make_server: ServerFactory
) -> None:
    """200 Envoys each reporting two of four shared buckets every second: every stream is
    accepted, every Envoy holds a token bucket for each of its buckets, and after half of
    each bucket's Envoys step their demand up and half down, the low ones hold less than the
    high ones and each bucket's shares add up to 95-102% of its limit."""
    config_dir.write("mesh.yaml", CONFIG)
    server = make_server(rlqs_tick=0.1)
    mesh = Mesh(
        f"127.0.0.1:{server.service.grpc_port}",
        "mesh",
        [_routes_of(i) for i in range(ENVOYS)],
        interval=1.0,
        demand=10.0,
    )
    sums = asyncio.run(_step(mesh))
    assert not mesh.refused, [(e.name, e.code, e.details) for e in mesh.refused[:5]]
    assert len(mesh.accepted) == ENVOYS
    assert sorted(sums) == [f"r{i}" for i in range(ROUTES)]
    for route, total in sums.items():
        assert 0.95 * LIMIT <= total <= 1.02 * LIMIT, (route, total)


async def _step(mesh: Mesh) -> dict[str, float]:
    """Per route, the rates its Envoys hold once the shares have followed a demand step."""
    changed = [time.monotonic()]

    def moved(envoy: Envoy, bucket: BucketKey, old: Held | None, new: Held) -> None:
        if old is None or old.rate != new.rate:
            changed[0] = new.at

    mesh.listeners.append(moved)
    await mesh.start()
    try:
        async with asyncio.timeout(60):
            await mesh.answered.wait()
        async with asyncio.timeout(60):
            await until(lambda: _all_held(mesh))  # a token bucket per Envoy and bucket
        mesh.set_demand(lambda e, b: 100.0 if _high(e, b) else 1.0)
        async with asyncio.timeout(60):
            await until(lambda: _apart(mesh))  # the low Envoys hold less than the high ones
            # Settled: no share has moved for longer than a report interval.
            await until(lambda: time.monotonic() - changed[0] > 1.5)
        sums: dict[str, float] = {}
        for envoy in mesh.envoys:
            for bucket, held in envoy.held.items():
                route = dict(bucket)["route"]
                sums[route] = sums.get(route, 0.0) + (held.rate or 0.0)
        return sums
    finally:
        await mesh.close()


def _all_held(mesh: Mesh) -> bool:
    return all(len(e.held) == 2 and all(h.tokens > 0 for h in e.held.values()) for e in mesh.envoys)


def _apart(mesh: Mesh) -> bool:
    lows = [h.rate or 0.0 for e in mesh.envoys for b, h in e.held.items() if not _high(e, b)]
    highs = [h.rate or 0.0 for e in mesh.envoys for b, h in e.held.items() if _high(e, b)]
    return max(lows) < min(highs)
