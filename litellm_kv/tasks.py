"""Starting and stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


def spawn_held(held: set[asyncio.Task[Any]], work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run ``work`` as a task of the running loop, kept in ``held`` until it ends (the loop holds only a
    weak reference: a task nobody else references can be collected mid-flight)."""
    task = asyncio.get_running_loop().create_task(work)
    held.add(task)
    task.add_done_callback(held.discard)
    return task


async def cancel_and_wait(task: asyncio.Task[Any] | None, *quiet: type[BaseException]) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended. Its cancellation, and any
    of the ``quiet`` exceptions it ends with, are swallowed; anything else propagates."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, *quiet):
        await task
