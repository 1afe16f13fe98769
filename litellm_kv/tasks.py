"""Starting and stopping background tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("litellm_kv")

# How long a stopping task has to end before its cancellation is sent again, and before it is left running.
RESEND_S = 0.5
GIVE_UP_S = 10.0


def spawn_held(held: set[asyncio.Task[Any]], work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
    """Run ``work`` as a task of the running loop, kept in ``held`` until it ends (the loop holds only a
    weak reference: a task nobody else references can be collected mid-flight)."""
    task = asyncio.get_running_loop().create_task(work)
    held.add(task)
    task.add_done_callback(held.discard)
    return task


async def cancel_and_wait(task: asyncio.Task[Any] | None, *quiet: type[BaseException],
                          resend_s: float = RESEND_S, give_up_s: float = GIVE_UP_S) -> bool:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended; True when it has. Its cancellation,
    and any of the ``quiet`` exceptions it ends with, are swallowed; anything else propagates.

    A cancellation can be lost: on Python 3.11 ``asyncio.wait_for`` (redis-py awaits every reply through it)
    returns the result of a call that completed as the cancellation arrived, and a loop around that call goes on
    as if it had not been cancelled. So the cancellation is sent again every ``resend_s`` while the task runs,
    and after ``give_up_s`` the task is left running, with a warning, rather than stall whoever stops it. The
    caller's own cancellation while it waits is not swallowed."""
    if task is None:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + give_up_s
    while not task.done():
        left = deadline - loop.time()
        if left <= 0:
            log.warning("litellm-kv: task %s did not end within %.1fs of its cancellation; left running",
                        task.get_name(), give_up_s)
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=min(resend_s, left))
    if not task.cancelled():
        exc = task.exception()
        if exc is not None and not isinstance(exc, quiet):
            raise exc
    return True
