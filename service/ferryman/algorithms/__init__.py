"""The rule kinds, one package each, and this registry, the one list the loader, the engine,
explain, the console, resets and the backends read.

Each package under ``ferryman.algorithms`` holds one kind: its YAML spec and validation, its
model (pure decisions, time injected), its memory store, its Redis store and Lua script, its
limiter (the request path), and its :class:`~ferryman.core.algorithm.Algorithm` object.
Adding a kind is its package and one line in :data:`ALGORITHMS`. (``leases`` is Doorman's
capacity leases, not a rule kind.)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ferryman.algorithms.burst import BURST_TIERS
from ferryman.algorithms.copies import COPIES
from ferryman.algorithms.cost_budget import COST_BUDGET
from ferryman.algorithms.fixed_window import FIXED_WINDOW
from ferryman.algorithms.gcra import GCRA
from ferryman.algorithms.leased_limit import LEASED_LIMIT
from ferryman.algorithms.limit_list import LIMIT_LIST
from ferryman.algorithms.sliding_window import SLIDING_WINDOW
from ferryman.algorithms.token_bucket import TOKEN_BUCKET
from ferryman.core.algorithm import Algorithm

__all__ = ["ALGORITHMS", "BY_NAME", "COUNTERS", "algorithm_of"]

#: Every rule kind, in the order a node's keys are read and a request's calls are answered.
ALGORITHMS: tuple[Algorithm, ...] = (
    FIXED_WINDOW,
    BURST_TIERS,
    COPIES,
    TOKEN_BUCKET,
    SLIDING_WINDOW,
    GCRA,
    LEASED_LIMIT,
    LIMIT_LIST,
    COST_BUDGET,
)

BY_NAME: Mapping[str, Algorithm] = MappingProxyType({a.name: a for a in ALGORITHMS})

#: The kind that counts limits Envoy sends with a descriptor, and whose counters the
#: reference's other backends (memcache, REDIS_PERSECOND) keep.
COUNTERS = FIXED_WINDOW


def algorithm_of(kind: str) -> Algorithm:
    """The registered kind of a limit (``Limit.kind``)."""
    return BY_NAME[kind]
