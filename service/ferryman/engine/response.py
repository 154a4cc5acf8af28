"""The parts of an answer beyond the statuses: rate limit headers and dynamic metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ferryman.engine.model import Code, DescriptorRequest, EngineOptions, Status

__all__ = ["headers", "metadata"]


def headers(opts: EngineOptions, statuses: Sequence[Status]) -> tuple[tuple[str, str], ...]:
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
    """Dynamic metadata: the request as the reference echoes it, then the ``metadata`` of
    the rules that were within their limit (the request's own fields win)."""
    meta: dict[str, Any] = {
        "domain": domain,
        "descriptors": [
            {
                "entries": [{"key": k, "value": v} for k, v in d.entries],
                **({} if d.hits is None else {"hitsAddend": d.hits}),
            }
            for d in descriptors
        ],
        "hitsAddend": hits,
    }
    for name, value in rules.items():
        meta.setdefault(name, value)
    return meta
