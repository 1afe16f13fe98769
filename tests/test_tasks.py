"""Stopping background tasks: a cancellation that the task loses is sent again, and a task that will not end
does not stall whoever stops it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys

import pytest
import redis.asyncio as aredis

from litellm_kv.tasks import cancel_and_wait
from tools.harness.redis_server import RedisServer


async def _wait_for_loop(futures: list[asyncio.Future[int]]) -> None:
    """A loop around ``asyncio.wait_for``, as redis-py's reads are."""
    loop = asyncio.get_running_loop()
    while True:
        fut: asyncio.Future[int] = loop.create_future()
        futures.append(fut)
        await asyncio.wait_for(fut, 10)


async def test_a_cancellation_lost_in_wait_for_is_sent_again() -> None:
    futures: list[asyncio.Future[int]] = []
    task = asyncio.get_running_loop().create_task(_wait_for_loop(futures))
    await asyncio.sleep(0)
    # The awaited call completes as the cancellation arrives.
    futures[-1].set_result(1)
    task.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    if sys.version_info < (3, 12):
        # Python 3.11's wait_for returns the result and the loop goes on: the cancellation is lost.
        assert not task.done() and len(futures) == 2
    # The same moment again, stopped by cancel_and_wait: its cancellation is lost too, and sent again.
    futures[-1].set_result(1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with asyncio.timeout(5):
        assert await cancel_and_wait(task, resend_s=0.05, give_up_s=2.0)
    assert task.cancelled() and loop.time() - t0 < 1.0


async def test_a_task_that_will_not_end_is_left_after_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    ended = asyncio.Event()

    async def stubborn() -> None:
        while not ended.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # a task that swallows every cancellation
                await asyncio.sleep(10)

    task = asyncio.get_running_loop().create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    t0 = asyncio.get_running_loop().time()
    with caplog.at_level(logging.WARNING, logger="litellm_kv"):
        async with asyncio.timeout(5):
            assert not await cancel_and_wait(task, resend_s=0.05, give_up_s=0.3)
    took = asyncio.get_running_loop().time() - t0
    assert 0.3 <= took < 1.0, took
    assert "stubborn did not end within 0.3s" in caplog.text
    ended.set()
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.done()


async def test_quiet_exceptions_are_swallowed_others_propagate() -> None:
    async def fails(exc: BaseException) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise exc from None

    loop = asyncio.get_running_loop()
    quiet = loop.create_task(fails(OSError("gone")))
    loud = loop.create_task(fails(ValueError("bug")))
    await asyncio.sleep(0)
    assert await cancel_and_wait(quiet, OSError)
    with pytest.raises(ValueError, match="bug"):
        await cancel_and_wait(loud, OSError)
    assert await cancel_and_wait(None)


async def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # a cleanup that takes a while
            raise

    loop = asyncio.get_running_loop()
    inner = loop.create_task(slow_to_stop())
    await asyncio.sleep(0)
    outer = loop.create_task(cancel_and_wait(inner, resend_s=5.0))
    await asyncio.sleep(0.05)
    outer.cancel()
    await asyncio.wait({outer}, timeout=1)
    assert outer.cancelled()
    inner.cancel()
    await asyncio.wait({inner}, timeout=2)


@pytest.mark.redis
async def test_loops_of_real_redis_calls_stop_every_time() -> None:
    """The case that stalled an indexer's shutdown: a loop of Redis calls, cancelled at random moments. A single
    cancel() loses some of them (Python 3.11); cancel_and_wait ends every one."""
    srv = RedisServer(name="redis-tasks")
    client = aredis.Redis.from_url(srv.url)
    try:
        async def calls() -> None:
            while True:
                await asyncio.sleep(0.001)
                await client.set("k", 1)

        loop = asyncio.get_running_loop()
        rng = random.Random(7)
        lost = 0
        for _ in range(60):
            task = loop.create_task(calls())
            await asyncio.sleep(rng.random() * 0.01)
            task.cancel()
            await asyncio.wait({task}, timeout=0.2)
            lost += not task.done()
            t0 = loop.time()
            async with asyncio.timeout(10):
                assert await cancel_and_wait(task, resend_s=0.05, give_up_s=5.0)
            assert loop.time() - t0 < 1.0
        if sys.version_info < (3, 12):
            assert lost > 0, "no cancellation was lost: the case this guards against did not arise"
    finally:
        await client.aclose()
        srv.stop()
