"""Burst tiers from Python: ``request_rate`` with ``max_wait`` and ``min_copies``.

    python examples/request_rate.py [HOST:PORT]

With ``descriptors/burst-cookbook.yaml`` loaded, ``simple_user`` allows five hits per second
per user. The example takes all five, then asks for one more with ``max_wait=3``: the client
backs off (never waking before the service's ``retry_after``) and gets it about a second
later. Then it asks for ten hits but settles for whatever there is (``min_copies=1``).
The target defaults to 127.0.0.1:8081; exit status 1 if the wait did not pay off.
"""

from __future__ import annotations

import sys
import uuid

import ferryman


def main(target: str) -> int:
    user = {"simple_user": f"example-{uuid.uuid4().hex[:8]}"}
    with ferryman.Client(target) as client:
        first = client.request_rate("cookbook", user, copies=5)
        print(f"asked for 5: granted {first.copies}")

        waited = client.request_rate("cookbook", user, max_wait=3)
        print(
            f"asked for 1 more, waiting up to 3s: success={waited.success} "
            f"granted {waited.copies} after {waited.waited:.2f}s and {waited.attempts} attempts"
        )

        bulk = client.request_rate("cookbook", user, copies=10, min_copies=1)
        context = bulk.context
        if context is not None:
            tier = f"now in tier {context.active_tier_index} of {context.active_tier_limit}/s"
        else:
            tier = "no answer from the service"
        print(f"asked for 10, at least 1: granted {bulk.copies} ({tier})")
        if waited.degraded:
            print("(degraded: the service did not answer, the client granted locally)")
    return 0 if waited.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"))
