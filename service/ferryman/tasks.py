"""Background tasks of long-lived parts (elections, reloaders, samplers, sinks)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["awaiting", "cancel"]


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has stopped; None is nothing to stop."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where ``task`` waits: each coroutine of its await chain, outermost first, as
    ``file:line in function``."""
    where: list[str] = []
    step: Any = task.get_coro()
    while step is not None:
        frame = getattr(step, "cr_frame", None) or getattr(step, "ag_frame", None)
        frame = frame or getattr(step, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            where.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        step = (
            getattr(step, "cr_await", None)
            or getattr(step, "ag_await", None)
            or getattr(step, "gi_yieldfrom", None)
        )
    return where
