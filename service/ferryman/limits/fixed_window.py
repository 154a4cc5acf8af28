"""The reference fixed-window arithmetic: epoch-aligned windows and near/over stats."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["StatDelta", "classify", "reset_after", "window_start"]


def window_start(now: float, seconds: int) -> int:
    """Start of the epoch-aligned window of ``seconds`` that contains ``now``."""
    return int(now // seconds) * seconds


def reset_after(now: float, seconds: int) -> int:
    """Whole seconds until the window containing ``now`` ends (as the reference reports it)."""
    return seconds - int(now) % seconds


@dataclass(slots=True)
class StatDelta:
    within: int = 0
    near: int = 0
    over: int = 0


def classify(
    hits: int, limit: int, before: int, after: int, ratio: float
) -> tuple[bool, StatDelta]:
    """Decide one descriptor and split its hits into within/near/over as the reference does.

    ``before`` and ``after`` are the counter around this request's hits; the request is over
    the limit iff ``after > limit``.
    """
    near_threshold = math.floor(limit * ratio)
    if after > limit:
        if before >= limit:
            return True, StatDelta(over=hits)
        return True, StatDelta(over=after - limit, near=limit - max(near_threshold, before))
    near = 0
    if after > near_threshold:
        near = hits if before >= near_threshold else after - near_threshold
    return False, StatDelta(within=hits, near=near)
