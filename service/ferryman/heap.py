"""The collector's settings for a serving process.

Python's cycle collector walks every tracked object of a generation when it runs, and the
objects a server holds from its start (modules, the generated protobuf and OpenTelemetry
classes, the loaded config) are most of its heap: each full collection then pays for them
again, a cost per request that grows with the code loaded rather than with the traffic.
Once the service has started they are moved out of the collector's sight (``gc.freeze``):
they stay alive as they would have, and collections walk only what was made since.
Young collections run less often, since nearly every object of a request is freed by its
reference count before a collection could find it.
"""

from __future__ import annotations

import gc

__all__ = ["describe", "settle"]

#: Allocations between young collections (Python's default is 700).
YOUNG = 10_000


def settle() -> None:
    """Called once the service is up: what exists now is kept out of later collections."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)


def describe() -> dict[str, int]:
    """The collector's state, for /status: the objects kept out of collections and the
    allocations between young collections."""
    return {"frozen": gc.get_freeze_count(), "young_threshold": gc.get_threshold()[0]}
