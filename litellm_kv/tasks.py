"""Stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None, *quiet: type[BaseException]) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has ended. Its cancellation, and any
    of the ``quiet`` exceptions it ends with, are swallowed; anything else propagates."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, *quiet):
        await task
