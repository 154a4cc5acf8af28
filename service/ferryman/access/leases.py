"""What one capacity lease call may ask: bounded names, resources, wants and clients, and a
client id that stays with the caller that first used it.

Doorman trusts its clients: a client id is whatever the request says, a server's band says
how many clients it speaks for, and ``wants`` may be any number. These checks run before
the lease state sees a request, so that a caller can neither act under another's client
id nor claim the capacity of a billion clients.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ferryman.algorithms.leases.model import ResourceTemplate, find_template
from ferryman.errors import RequestError

__all__ = ["MAX_ID", "MAX_RESOURCES", "LeaseLimits", "Owners", "cap_wants", "check_ids"]

#: The longest client, server or resource id accepted (bytes of UTF-8).
MAX_ID = 256
#: The most resources one GetCapacity, GetServerCapacity or ReleaseCapacity may name.
MAX_RESOURCES = 100
# Client ids remembered with their owner; the oldest is forgotten past this.
_MAX_OWNERS = 100_000


@dataclass(frozen=True)
class LeaseLimits:
    """The ceilings a lease request is held to."""

    max_clients_per_server: int = 10
    # What ``wants`` is cut to on a resource no template names.
    unconfigured_ceiling: float = 1_000_000.0


def check_ids(client_id: str, field: str, resource_ids: Iterable[str], where: str) -> None:
    """INVALID_ARGUMENT naming the field for an overlong id, one that is not UTF-8 (a
    proto2 string hands those over as bytes), or too many resources."""
    _check_id(client_id, field)
    for i, resource_id in enumerate(resource_ids):
        if i >= MAX_RESOURCES:
            raise RequestError(where, f"more than {MAX_RESOURCES} resources in one call")
        _check_id(resource_id, f"{where}[{i}]")


def _check_id(value: object, field: str) -> None:
    if not isinstance(value, str):
        raise RequestError(field, "not UTF-8 text")
    if len(value.encode()) > MAX_ID:
        raise RequestError(field, f"longer than {MAX_ID} bytes")


def cap_wants(
    wants: float, resource_id: str, templates: tuple[ResourceTemplate, ...], limits: LeaseLimits
) -> float:
    """``wants`` of a resource no template names, cut to the ceiling (what is granted of
    it is what is asked). A configured resource's capacity bounds its grants already, and
    its algorithms weigh what each client wants beyond it (proportional share)."""
    if not math.isfinite(wants) or wants < 0:
        return wants  # the API refuses it, naming the field
    if find_template(templates, resource_id) is not None:
        return wants
    return min(wants, limits.unconfigured_ceiling)


class Owners:
    """Client id -> the caller key that first used it (bounded: the oldest forgotten)."""

    def __init__(self, most: int = _MAX_OWNERS) -> None:
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._most = most

    def claim(self, client_id: str, owner: str, refuse: Callable[[], Any]) -> None:
        """Bind ``client_id`` to ``owner`` if new; ``refuse()`` if another owns it."""
        held = self._owners.get(client_id)
        if held is None:
            self._owners[client_id] = owner
            if len(self._owners) > self._most:
                self._owners.popitem(last=False)
        elif held != owner:
            refuse()
        else:
            self._owners.move_to_end(client_id)
