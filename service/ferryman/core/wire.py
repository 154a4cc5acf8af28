"""Fields of Envoy 1.40's messages that the xds-protos build of Envoy's API does not know yet:
they reach ferryman as unknown fields, read and written here."""

from __future__ import annotations

from typing import Any

from google.protobuf import unknown_fields

__all__ = ["mark_negative_hits", "negative_hits"]

# Envoy 1.40's RateLimitDescriptor.is_negative_hits (field 4, a varint) is newer than the
# xds-protos build of Envoy's API: the field arrives as an unknown field, read from there.
_NEGATIVE_HITS_FIELD = 4
_NEGATIVE_HITS_TRUE = b"\x20\x01"  # field 4, wire type 0, value 1


def negative_hits(descriptor: Any) -> bool:
    """Whether a descriptor's ``is_negative_hits`` is set (hits given back, not taken)."""
    fields = unknown_fields.UnknownFieldSet(descriptor)
    return any(
        fields[i].field_number == _NEGATIVE_HITS_FIELD
        and fields[i].wire_type == 0
        and fields[i].data != 0
        for i in range(len(fields))
    )


def mark_negative_hits(descriptor: Any) -> None:
    """Set a descriptor's ``is_negative_hits``, as Envoy 1.40 sends it."""
    descriptor.MergeFromString(_NEGATIVE_HITS_TRUE)
