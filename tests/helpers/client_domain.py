"""The ``client`` test domain, and a tiny gRPC service whose calls spend its hits."""

from __future__ import annotations

from concurrent import futures

import grpc

import ferryman

CLIENT_CONFIG = """
domain: client
descriptors:
  - key: tight            # two hits per second: a rejected hit gets in about a second later
    burst_tiers:
      - {limit: 2, window: 1s, active: 1h}
  - key: closed           # one hit a minute: retry_after is far beyond any max_wait here
    burst_tiers:
      - {limit: 1, window: 60s, active: 1h}
  - key: shut             # never: retry_after is unset, so the bare backoff schedule runs
    burst_tiers: []
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 2, name: fixed_two}
  - key: outer
    descriptors:
      - key: inner
        rate_limit: {unit: hour, requests_per_unit: 1}
"""

ECHO = "/test.Echo/Say"


class Echo:
    """A tiny gRPC service (``/test.Echo/Say``, bytes in and out) that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(self._say)}
                )
            ]
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _say(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        return b"echo:" + request

    def stop(self) -> None:
        self.server.stop(None)


def route_echo(method: str, request: bytes) -> ferryman.Route | None:
    """Echo calls spend the ``tight`` hits of the user named by the request."""
    return ("client", {"tight": request.decode()}) if method == ECHO else None
