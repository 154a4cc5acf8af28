"""Request validation, once for every API: a RequestError names the first malformed field.

Every request is bounded here before anything is looked up or counted, so that hostile
input costs a bounded amount of work and memory and changes no state. The limits are in
the README ("Limits on requests"); the gRPC message itself is capped before decoding
(``MAX_MESSAGE_BYTES``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ferryman.core.answers import DescriptorRequest
from ferryman.errors import RequestError

__all__ = [
    "MAX_DESCRIPTORS",
    "MAX_ENTRIES",
    "MAX_HITS",
    "MAX_KEY",
    "MAX_MESSAGE_BYTES",
    "MAX_NAME",
    "MAX_NAMES",
    "MAX_TRANSFER_ID",
    "MAX_VALUE",
    "check_descriptor",
    "check_name",
    "check_names",
    "check_request",
]

MAX_MESSAGE_BYTES = 4 << 20  # a gRPC request: room for the largest request within the limits below
MAX_DESCRIPTORS = 128  # per ShouldRateLimit request
MAX_ENTRIES = 32  # per descriptor: deeper than any configuration tree needs
MAX_KEY = 256  # characters of a domain or an entry's key
MAX_VALUE = 4096  # characters of an entry's value (a path, a header)
MAX_NAME = 256  # characters of any other name: groups, transfer ids, client names
MAX_NAMES = 64  # names in one list (copy groups)
MAX_TRANSFER_ID = 64 << 10  # a transfer id carries its domain and descriptor
# Hits per descriptor: the request-level hits_addend is a uint32, and so is every limit; a
# larger per-descriptor hits_addend (a uint64 on the wire) could only overflow counters.
MAX_HITS = (1 << 32) - 1


def _check_text(value: str, field: str, most: int) -> None:
    if len(value) > most:
        raise RequestError(field, f"longer than {most} characters ({len(value)})")


def check_name(value: str, field: str, *, required: bool = True, most: int = MAX_NAME) -> None:
    """A name (group, transfer id, client name): present when ``required``, at most
    ``most`` characters."""
    if required and not value:
        raise RequestError(field, "must not be empty")
    _check_text(value, field, most)


def check_names(values: Iterable[str], field: str) -> None:
    """A list of names (copy groups): at most MAX_NAMES, each non-empty and bounded."""
    for i, value in enumerate(values):
        if i >= MAX_NAMES:
            raise RequestError(field, f"more than {MAX_NAMES} names")
        check_name(value, f"{field}[{i}]")


def _check_domain(domain: str) -> None:
    if not domain:
        raise RequestError("domain", "must not be empty")
    _check_text(domain, "domain", MAX_KEY)


def _check_entries(entries: Sequence[tuple[str, str]], field: str) -> None:
    if len(entries) > MAX_ENTRIES:
        raise RequestError(field, f"more than {MAX_ENTRIES} entries ({len(entries)})")
    for j, (key, value) in enumerate(entries):
        if not key:
            raise RequestError(f"{field}[{j}].key", "must not be empty")
        _check_text(key, f"{field}[{j}].key", MAX_KEY)
        _check_text(value, f"{field}[{j}].value", MAX_VALUE)


def check_descriptor(domain: str, entries: Sequence[tuple[str, str]], field: str) -> None:
    """One descriptor (``field`` names it) of ``domain`` for ferryman's own API: both must be
    non-empty and within the limits, every key too."""
    _check_domain(domain)
    if not entries:
        raise RequestError(field, "must not be empty")
    _check_entries(entries, field)


def check_request(domain: str, descriptors: Sequence[DescriptorRequest]) -> None:
    """A ShouldRateLimit request: a domain and 1 to MAX_DESCRIPTORS well-formed descriptors.

    A descriptor without entries is allowed, as the reference allows it: it matches no rule
    and is answered OK with no limit.
    """
    _check_domain(domain)
    if not descriptors:
        raise RequestError("descriptors", "must not be empty")
    if len(descriptors) > MAX_DESCRIPTORS:
        raise RequestError(
            "descriptors", f"more than {MAX_DESCRIPTORS} descriptors ({len(descriptors)})"
        )
    for i, descriptor in enumerate(descriptors):
        _check_entries(descriptor.entries, f"descriptors[{i}].entries")
        if descriptor.hits is not None and descriptor.hits > MAX_HITS:
            raise RequestError(
                f"descriptors[{i}].hits_addend", f"more than {MAX_HITS} ({descriptor.hits})"
            )
