"""Capacity leases (Doorman): clients lease shares of a global capacity and decide locally.

``model`` holds the values, ``algorithms`` divides a capacity, ``state`` grants and expires
leases and ``election`` picks one master among replicas. A server that leases from a parent
does so through ``ferryman.apis.capacity_parent``.
"""

from ferryman.algorithms.leases.algorithms import Division, allocate, divide
from ferryman.algorithms.leases.model import (
    AlgorithmSpec,
    Band,
    Demand,
    Kind,
    Lease,
    ResourceTemplate,
    find_template,
    with_parameters,
)
from ferryman.algorithms.leases.state import LeaseState, ResourceState, TemplateSource

__all__ = [
    "AlgorithmSpec",
    "Band",
    "Demand",
    "Division",
    "Kind",
    "Lease",
    "LeaseState",
    "ResourceState",
    "ResourceTemplate",
    "TemplateSource",
    "allocate",
    "divide",
    "find_template",
    "with_parameters",
]
