"""Background-task helpers: stopping a task, waiting on an event with a limit, and where a
task waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from ferryman.tasks import awaiting, cancel, wait_event


def test_cancel_stops_the_task_and_passes_on_the_callers_own_cancellation() -> None:
    """cancel() waits for the task's end; when the caller is itself cancelled meanwhile,
    the caller ends cancelled rather than carrying on as if the task had stopped."""

    async def scenario() -> tuple[bool, bool]:
        async def slow_to_stop() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0.2)  # its clean-up outlasts the caller's patience

        async def stopper(task: asyncio.Task[None]) -> None:
            await cancel(task)

        first = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        await cancel(first)  # nobody cancels the caller: it returns once the task ended
        second = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        caller = asyncio.create_task(stopper(second))
        await asyncio.sleep(0.05)
        caller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        await asyncio.wait({second})
        return first.cancelled(), caller.cancelled()

    assert asyncio.run(scenario()) == (True, True)


def test_wait_event_says_whether_the_event_came_and_never_loses_a_cancellation() -> None:
    """wait_event is True once the event is set, False when the time runs out; a
    cancellation that comes as the event is set ends the loop waiting on it."""

    async def scenario() -> tuple[bool, bool, bool]:
        event = asyncio.Event()
        timed_out = await wait_event(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        came = await wait_event(event, 5)

        wake = asyncio.Event()

        async def loop_forever() -> None:
            while True:
                await wait_event(wake, 60)
                wake.clear()

        task = asyncio.create_task(loop_forever())
        await asyncio.sleep(0.01)
        wake.set()
        task.cancel()  # in the same turn as the wake-up
        async with asyncio.timeout(5):
            await asyncio.wait({task})
        return timed_out, came, task.cancelled()

    assert asyncio.run(scenario()) == (False, True, True)


def test_awaiting_names_the_chain_through_a_context_managers_exit() -> None:
    """awaiting() lists a waiting task's coroutines outermost first, following an async
    context manager's exit into its generator."""

    @contextlib.asynccontextmanager
    async def part() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await asyncio.Event().wait()  # a clean-up that never ends

    async def serve_then_stop() -> None:
        async with part():
            pass

    async def scenario() -> list[str]:
        task = asyncio.create_task(serve_then_stop())
        await asyncio.sleep(0.01)
        chain = awaiting(task)
        await cancel(task)
        return chain

    chain = asyncio.run(scenario())
    names = [line.rsplit(" in ", 1)[1] for line in chain]
    assert names[0] == "serve_then_stop"
    assert "part" in names and names.index("part") > names.index("__aexit__")
    assert names[-1] == "wait"


def test_no_module_waits_through_asyncio_wait_for() -> None:
    """Nothing in the service or its client waits through asyncio.wait_for, which on
    Python 3.11 can lose a cancellation that comes as what it waits on finishes."""
    service = Path(__file__).resolve().parents[1] / "service" / "ferryman"
    users = [
        str(path.relative_to(service))
        for path in sorted(service.rglob("*.py"))
        if "asyncio.wait_for(" in path.read_text("utf-8")
    ]
    assert users == []
