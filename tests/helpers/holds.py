"""The ``jobs`` test domain of held copies, and a client holding an open Session on it."""

from __future__ import annotations

import queue
from typing import Any

from ferryman._proto.ferryman.v1 import limiter_pb2

from helpers.server import Server, limiter_stub

JOBS_CONFIG = """
domain: jobs
descriptors:
  - key: tenant
    copies:
      limit: 10
      global_limit: 12
      groups:
        - {name: probation, limit: 5, members: [new-co, trial-*]}
        - {name: vip, limit: 50, members: [acme]}
        - {name: everyone, limit: 9, members: ["*"]}
  - key: fixed
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: upstream
    copies: {limit: 2, hold_ttl: 30s}
"""


class Holder:
    """A client with an open Session stream on one server."""

    def __init__(self, server: Server, name: str = "test") -> None:
        self.stub = limiter_stub(server.channel)
        self._out: queue.Queue[limiter_pb2.SessionRequest | None] = queue.Queue()
        self._stream = self.stub.Session(iter(self._out.get, None))
        self._out.put(
            limiter_pb2.SessionRequest(open=limiter_pb2.SessionRequest.Open(client_name=name))
        )
        opened = next(self._stream)
        self.session_id = opened.opened.session_id
        assert self.session_id

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        return (("ferryman-session", self.session_id),)

    def reserve(self, tenant: str, copies: int, min_copies: int | None = None) -> Any:
        request = limiter_pb2.ReserveRequest(
            domain="jobs", descriptor=[limiter_pb2.Entry(key="tenant", value=tenant)],
            copies=copies,
        )  # fmt: skip
        if min_copies is not None:
            request.min_copies = min_copies
        return self.stub.Reserve(request, metadata=self.md, timeout=10)

    def release(self, tenant: str, copies: int, groups: list[str]) -> Any:
        return self.stub.Release(
            limiter_pb2.ReleaseRequest(
                domain="jobs", descriptor=[limiter_pb2.Entry(key="tenant", value=tenant)],
                copies=copies, groups=groups,
            ),
            metadata=self.md, timeout=10,
        )  # fmt: skip

    def transfer(self, tenant: str, copies: int, groups: list[str], ttl: float) -> str:
        request = limiter_pb2.TransferRequest(
            domain="jobs", descriptor=[limiter_pb2.Entry(key="tenant", value=tenant)],
            copies=copies, groups=groups,
        )  # fmt: skip
        request.ttl.FromMilliseconds(int(ttl * 1000))
        reply = self.stub.Transfer(request, metadata=self.md, timeout=10)
        return str(reply.transfer_id)

    def seize(self, transfer_id: str) -> Any:
        return self.stub.Seize(
            limiter_pb2.SeizeRequest(transfer_id=transfer_id), metadata=self.md, timeout=10
        )

    def close(self) -> None:
        self._out.put(None)
        for _ in self._stream:
            pass
