"""Request validation, once for every API: a RequestError names the first malformed field."""

from __future__ import annotations

from collections.abc import Sequence

from ferryman.engine.model import DescriptorRequest
from ferryman.errors import RequestError

__all__ = ["check_descriptor", "check_request"]


def check_descriptor(domain: str, entries: Sequence[tuple[str, str]], field: str) -> None:
    """One descriptor (``field`` names it) of ``domain``: both must be non-empty, every key too."""
    if not domain:
        raise RequestError("domain", "must not be empty")
    if not entries:
        raise RequestError(field, "must not be empty")
    for j, (key, _value) in enumerate(entries):
        if not key:
            raise RequestError(f"{field}[{j}].key", "must not be empty")


def check_request(domain: str, descriptors: Sequence[DescriptorRequest]) -> None:
    """A ShouldRateLimit request: a domain and at least one well-formed descriptor."""
    if not domain:
        raise RequestError("domain", "must not be empty")
    if not descriptors:
        raise RequestError("descriptors", "must not be empty")
    for i, descriptor in enumerate(descriptors):
        check_descriptor(domain, descriptor.entries, f"descriptors[{i}].entries")
