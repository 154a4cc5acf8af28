"""Several replicas on one Redis: each replica leases a bucket's global rate from the elected
capacity master (as a Doorman child asking for its Envoys' demand) and divides its lease
among its own Envoys, so that the Envoys of all replicas share one limit.

The master serves a bucket as a resource ``rlqs/<domain>/<k=v&...>`` whose template it
derives from the same descriptors (capacity: the rule's rate; FAIR_SHARE). Without a live
lease (no master yet, Redis or the master gone) a replica assigns nothing new: its Envoys
keep their buckets until the TTL, then take the filter's expired fallback.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from ferryman.algorithms.leases.model import AlgorithmSpec, Kind, ResourceTemplate
from ferryman.algorithms.leases.state import TemplateSource

if TYPE_CHECKING:
    from ferryman.client._capacity import AsyncCapacityClient, CapacityResource

__all__ = [
    "LEASE_SECONDS",
    "PREFIX",
    "BucketLeases",
    "RlqsTemplates",
    "parse_resource",
    "resource_id",
]

PREFIX = "rlqs/"
#: A replica's lease of a bucket lasts this long and is renewed every REFRESH_SECONDS: a
#: replica that dies stops counting within it.
LEASE_SECONDS = 10
REFRESH_SECONDS = 2

Key = tuple[str, tuple[tuple[str, str], ...]]


def resource_id(key: Key) -> str:
    """The capacity resource of a bucket: its domain and entries, escaped."""
    domain, entries = key
    pairs = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in entries)
    return f"{PREFIX}{quote(domain, safe='')}/{pairs}"


def parse_resource(resource: str) -> Key | None:
    """The bucket of a resource id (None: not a bucket's)."""
    if not resource.startswith(PREFIX):
        return None
    domain, sep, pairs = resource[len(PREFIX) :].partition("/")
    if not sep or not pairs:
        return None
    entries = []
    for pair in pairs.split("&"):
        key, eq, value = pair.partition("=")
        if not eq:
            return None
        entries.append((unquote(key), unquote(value)))
    return unquote(domain), tuple(sorted(entries))


class RlqsTemplates(TemplateSource):
    """The master's templates: a bucket's resource from the descriptors (``rate_of``: the
    rate a bucket is shared at, None when it is not shared), anything else from ``rest``."""

    def __init__(
        self, rest: TemplateSource, rate_of: Callable[[Key], tuple[float, Kind] | None]
    ) -> None:
        self._rest = rest
        self._rate_of = rate_of

    def template(self, resource_id: str) -> ResourceTemplate | None:
        key = parse_resource(resource_id)
        if key is None:
            return self._rest.template(resource_id)
        shared = self._rate_of(key)
        if shared is None:
            return None
        rate, kind = shared
        spec = AlgorithmSpec(
            kind=kind,
            lease_length=LEASE_SECONDS,
            refresh_interval=REFRESH_SECONDS,
            # A replica's Envoys would be denied while a new master learns: it divides at
            # once, and the leases of the last master lapse within LEASE_SECONDS.
            learning_mode_duration=0,
        )
        return ResourceTemplate(resource_id, rate, spec)

    def expiry_cap(self, resource_id: str) -> float | None:
        return self._rest.expiry_cap(resource_id)


class BucketLeases:
    """This replica's leases, one per bucket its Envoys report, asked of the master through
    ``target`` (any replica: a replica's Discovery names the master)."""

    def __init__(self) -> None:
        self.client: AsyncCapacityClient | None = None
        self._held: dict[Key, CapacityResource] = {}

    def start(self, target: str) -> None:
        from ferryman.client._capacity import AsyncCapacityClient

        client_id = f"{socket.gethostname()}/{target}/{os.getpid()}/rlqs"
        self.client = AsyncCapacityClient(target, client_id, fallback="pessimistic")

    def capacity(self, key: Key, wants: float) -> float | None:
        """The rate this replica may hand out for ``key`` now (None: no live lease yet);
        ``wants`` is heard at the next refresh, or at once for a new bucket."""
        client = self.client
        if client is None:
            return None
        wants = wants if math.isfinite(wants) and wants >= 0 else 0.0
        resource = self._held.get(key)
        if resource is None:
            resource = self._held[key] = client.resource(resource_id(key), wants)
        else:
            resource.ask(wants, now=False)
        capacity = resource.capacity
        return capacity if resource.mode == "lease" else None

    def current(self, key: Key) -> float | None:
        """The rate this replica may hand out for ``key`` now, asking nothing (None: no
        live lease)."""
        resource = self._held.get(key)
        if self.client is None or resource is None or resource.mode != "lease":
            return None
        return resource.capacity

    def forget(self, key: Key) -> None:
        resource = self._held.pop(key, None)
        if resource is not None:
            resource.release()

    def status(self) -> dict[str, object]:
        client = self.client
        if client is None:
            return {}
        return {"master": client.master, "last_error": client.last_error, "leases": len(self._held)}

    async def stop(self) -> None:
        client, self.client = self.client, None
        self._held.clear()
        if client is not None:
            await client.close()
