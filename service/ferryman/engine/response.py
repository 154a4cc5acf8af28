"""The parts of an answer beyond the statuses: rate limit headers and dynamic metadata."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ferryman.core.answers import Code, DescriptorRequest, EngineOptions, Status

__all__ = ["headers", "metadata"]


def headers(opts: EngineOptions, statuses: Sequence[Status]) -> tuple[tuple[str, str], ...]:
    """The rate limit headers of an answer, in the configured format."""
    if opts.header_format == "ietf":
        return ietf_headers(statuses)
    return draft_headers(opts, statuses)


def ietf_headers(statuses: Sequence[Status]) -> tuple[tuple[str, str], ...]:
    """``RateLimit-Policy`` and ``RateLimit`` (IETF structured fields): one policy per
    limit of the request, named by its rule's name or by its place in the request."""
    policies: list[str] = []
    states: list[str] = []
    for index, status in enumerate(statuses):
        for n, part in enumerate(status.parts or (status,)):
            limit = part.limit
            if limit is None or part.reset_after is None or limit.unit is None:
                continue
            name = limit.name or (f"d{index}" if not status.parts else f"d{index}.{n}")
            quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
            quota = limit.requests_per_unit if part.size is None else part.size
            window = part.window if part.window is not None else limit.unit.seconds
            policies.append(f"{quoted};q={quota};w={math.ceil(window)}")
            states.append(f"{quoted};r={part.remaining};t={part.reset_after}")
    if not policies:
        return ()
    return (("RateLimit-Policy", ", ".join(policies)), ("RateLimit", ", ".join(states)))


def draft_headers(opts: EngineOptions, statuses: Sequence[Status]) -> tuple[tuple[str, str], ...]:
    """The RateLimit-* headers of the most restrictive limited status (an over-limit one
    first, then the least remaining)."""
    best: Status | None = None
    for status in statuses:
        if status.limit is None or status.reset_after is None:
            continue
        if best is None:
            best = status
            continue
        rank = (status.code is not Code.OVER_LIMIT or status.quota, status.remaining)
        best_rank = (best.code is not Code.OVER_LIMIT or best.quota, best.remaining)
        if rank < best_rank:
            best = status
    if best is None or best.limit is None:
        return ()
    limit = str(best.limit.requests_per_unit if best.size is None else best.size)
    if best.window is not None:
        limit = f"{limit}, {limit};w={best.window:g}"
    return (
        (opts.limit_header, limit),
        (opts.remaining_header, str(best.remaining)),
        (opts.reset_header, str(best.reset_after)),
    )


def metadata(
    domain: str,
    descriptors: Sequence[DescriptorRequest],
    hits: int,
    rules: Mapping[str, Any],
) -> dict[str, Any]:
    """Dynamic metadata in the reference's shape: the request echoed (``domain``;
    ``descriptors``, each with ``entries`` as ``key=value`` strings, its ``limit`` and
    ``hitsAddend`` when sent; the request's ``hitsAddend`` when not 0), and under
    ``metadata`` the merged ``metadata:`` of the rules that passed, when there is any."""
    meta: dict[str, Any] = {
        "domain": domain,
        "descriptors": [_descriptor(d) for d in descriptors],
    }
    if hits:
        meta["hitsAddend"] = hits
    if rules:
        meta["metadata"] = dict(rules)
    return meta


def _descriptor(d: DescriptorRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": [f"{k}={v}" for k, v in d.entries]}
    if d.limit is not None and d.limit.unit is not None:
        out["limit"] = f"requests_per_unit:{d.limit.requests_per_unit} unit:{d.limit.unit.name}"
    if d.hits is not None:
        out["hitsAddend"] = d.hits
    return out
