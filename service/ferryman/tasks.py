"""Background tasks of long-lived parts (elections, reloaders, samplers, sinks)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["awaiting", "cancel", "wait_event"]


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait for ``event`` at most ``seconds``; whether it is set. Unlike
    ``asyncio.wait_for`` on Python 3.11, a cancellation that comes as the event is set is
    never lost: a loop that lost one could not be stopped."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has stopped; None is nothing to stop. A
    cancellation of the caller itself while it waits is passed on, not taken for the
    task's."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


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
        if step is not None and frame is not None and not _steps(step):
            # An async generator's step (a context manager's exit, say) does not name its
            # generator: the generator that frame drives does.
            driven = getattr(frame.f_locals.get("self"), "gen", None)
            if driven is not None and _steps(driven):
                step = driven
    return where


def _steps(step: Any) -> bool:
    return any(hasattr(step, name) for name in ("cr_frame", "ag_frame", "gi_frame"))
