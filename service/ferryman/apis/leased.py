"""The leases behind ``leased_limit`` nodes: with ``--parent``, this server asks the parent
for each such resource of the loaded config, with the demand its nodes see as ``wants``,
and the engine sizes each node by the lease (see ferryman.algorithms.leased_limit)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
from typing import TYPE_CHECKING

from ferryman.algorithms.leased_limit import LEASED_LIMIT, LeasedLimit, LeasedLimiter
from ferryman.clock import Clock
from ferryman.config.model import Config
from ferryman.config.reloader import ConfigHolder
from ferryman.core.rules import Level
from ferryman.engine import RateLimitEngine
from ferryman.tasks import cancel

if TYPE_CHECKING:
    from ferryman.client._capacity import AsyncCapacityClient, CapacityResource

__all__ = ["LeasedResources", "leased_resources"]

log = logging.getLogger("ferryman.leased")

_TICK = 0.25  # seconds between looks at the demand and the config
# Asked above the demand seen: a lease is a refresh behind, and one sized exactly to the last
# seconds would refuse any growth (and the noise of a steady load) until the next refresh.
_HEADROOM = 1.1


def leased_resources(config: Config | None) -> set[str]:
    """Every resource a ``leased_limit`` node of ``config`` names."""
    found: set[str] = set()

    def visit(level: Level) -> None:
        for rule in level.rules:
            if isinstance(rule.limit, LeasedLimit):
                found.add(rule.limit.resource)
            visit(rule.children)

    if config is not None:
        for domain in config.domains.values():
            visit(domain.root)
    return found


def _number(value: float) -> float:
    return -1.0 if math.isinf(value) else value


class LeasedResources:
    """Keeps one lease per leased resource of the config, from ``parent``."""

    def __init__(
        self, parent: str, holder: ConfigHolder, engine: RateLimitEngine, clock: Clock
    ) -> None:
        limiter = engine.limiter(LEASED_LIMIT.name)
        assert isinstance(limiter, LeasedLimiter)
        self.parent = parent
        self._holder = holder
        self._limiter = limiter
        self._clock = clock
        self.client: AsyncCapacityClient | None = None
        self._held: dict[str, CapacityResource] = {}
        self._task: asyncio.Task[None] | None = None

    def read(self, resource_id: str) -> tuple[float | None, float | None]:
        """The engine's view: the live lease's capacity (None: none) and the safe capacity."""
        resource = self._held.get(resource_id)
        if resource is None:
            return None, None
        capacity = resource.capacity
        return (capacity if resource.mode == "lease" else None), resource.safe_capacity

    async def start(self, address: str) -> None:
        # The host's name and the process: sidecars listening on 127.0.0.1:8081 in every pod,
        # and the worker processes of one server, are distinct clients to the parent.
        from ferryman.client._capacity import AsyncCapacityClient

        client_id = f"{socket.gethostname()}/{address}/{os.getpid()}"
        self.client = AsyncCapacityClient(self.parent, client_id, fallback="safe")
        self._limiter.reader = self.read
        self._sync()
        self._task = asyncio.create_task(self._run(), name="ferryman-leased")

    def _sync(self) -> None:
        client = self.client
        assert client is not None
        wanted = leased_resources(self._holder.config)
        now = self._clock.now()
        for resource_id in wanted - set(self._held):
            self._held[resource_id] = client.resource(resource_id, self._wants(resource_id, now))
            log.info("leasing %s from %s", resource_id, self.parent)
        for resource_id in set(self._held) - wanted:
            self._held.pop(resource_id).release()
        for resource_id, resource in self._held.items():
            # Heard at the next refresh: a changing demand must not add calls to the parent.
            resource.ask(self._wants(resource_id, now), now=False)

    def _wants(self, resource_id: str, now: float) -> float:
        return self._limiter.demand(resource_id, now) * _HEADROOM

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(_TICK)
            try:
                self._sync()
            except Exception:  # never let the loop die; the next tick tries again
                log.exception("leased resources")

    def status(self) -> dict[str, object]:
        client = self.client
        if client is None:
            return {"parent": self.parent, "resources": {}}
        stats = client.stats()
        return {
            "parent": self.parent,
            "master": client.master,
            "last_error": client.last_error,
            "refreshes": stats.refreshes,
            "failures": stats.failures,
            "mode_changes": stats.mode_changes,
            "resources": {
                r: {
                    "capacity": _number(stats.capacity.get(r, 0.0)),
                    "mode": stats.mode.get(r),
                    "wants": self._held[r].wants,
                }
                for r in self._held
            },
        }

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None
        if self.client is not None:
            await self.client.close()
            self.client = None
