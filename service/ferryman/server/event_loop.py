"""The event loop ``ferryman serve`` runs on (EVENT_LOOP, ``--event-loop``).

Under grpc.aio, uvloop (libuv) costs about 15% less CPU per request than asyncio's own loop,
so ``auto`` takes it whenever it is installed (a dependency everywhere but Windows) and
asyncio's loop otherwise; ``uvloop`` insists on it. The choice is made once, where
``ferryman serve`` starts its loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ferryman.errors import SettingsError

__all__ = ["factory", "name"]

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def factory(choice: str) -> LoopFactory | None:
    """The loop factory for ``choice`` (None: asyncio's default loop). Raises SettingsError
    when ``uvloop`` is asked for and cannot be imported."""
    if choice == "asyncio":
        return None
    if choice not in ("auto", "uvloop"):
        raise SettingsError(f"EVENT_LOOP={choice!r}: give auto, uvloop or asyncio")
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise SettingsError(
                f"EVENT_LOOP=uvloop (--event-loop uvloop) but uvloop cannot be imported ({exc}): "
                "pip install uvloop (not available on Windows), or use EVENT_LOOP=auto or asyncio"
            ) from None
        return None
    new_event_loop: LoopFactory = uvloop.new_event_loop
    return new_event_loop


def name(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """``uvloop`` or ``asyncio``: the implementation of ``loop`` (default: the running one)."""
    loop = asyncio.get_running_loop() if loop is None else loop
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"
