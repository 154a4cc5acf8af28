"""Envoy's question, asked from Python: ShouldRateLimit on the ``messaging`` domain.

    python examples/should_rate_limit.py [HOST:PORT]

With ``descriptors/messaging.yaml`` loaded (``ferryman serve`` from the repository root),
six marketing messages to one number: five are OK, the sixth is over the limit of five a
day. The target defaults to 127.0.0.1:8081.
"""

from __future__ import annotations

import sys
import uuid

import ferryman


def main(target: str) -> int:
    number = f"206{uuid.uuid4().int % 10**7:07d}"  # a fresh counter on every run
    descriptor = {"message_type": "marketing", "to_number": number}
    with ferryman.Client(target) as client:
        for i in range(1, 7):
            result = client.should_rate_limit("messaging", [descriptor])
            status = result.statuses[0]
            limit = status.limit
            shown = f"{limit.requests_per_unit}/{limit.unit}" if limit else "none"
            print(f"message {i}: {result.code.name} (limit {shown}, remaining {status.remaining})")
            if result.degraded:
                print("  (degraded: the service did not answer, the client let it through)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"))
