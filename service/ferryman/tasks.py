"""Background tasks of long-lived parts (elections, reloaders, samplers, sinks)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel"]


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has stopped; None is nothing to stop."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
