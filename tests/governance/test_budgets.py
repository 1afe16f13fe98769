"""Period budgets: UTC windows, memory backend, and the Redis backend against a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from litellm_kv.governance.budgets import (
    BudgetStoreError,
    MemoryPeriodBudgets,
    Period,
    PeriodBudgets,
    RedisPeriodBudgets,
)
from tools.harness.redis_server import RedisServer

T0 = datetime(2025, 1, 31, 23, 59, 30, tzinfo=timezone.utc)  # a Friday, 30 s before midnight
# Redis expires counters a day after their window: Redis tests must use a time in the future.
TF = datetime(2099, 1, 30, 23, 59, 30, tzinfo=timezone.utc)


def test_windows_are_utc_calendar_periods() -> None:
    assert Period.DAY.window(T0) == (datetime(2025, 1, 31, tzinfo=timezone.utc),
                                     datetime(2025, 2, 1, tzinfo=timezone.utc))
    assert Period.WEEK.window(T0) == (datetime(2025, 1, 27, tzinfo=timezone.utc),
                                      datetime(2025, 2, 3, tzinfo=timezone.utc))
    assert Period.MONTH.window(T0) == (datetime(2025, 1, 1, tzinfo=timezone.utc),
                                       datetime(2025, 2, 1, tzinfo=timezone.utc))
    dec = datetime(2025, 12, 15, tzinfo=timezone.utc)
    assert Period.MONTH.window(dec)[1] == datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer()
    yield srv
    srv.stop()


async def _exercise(b: PeriodBudgets, t0: datetime = T0) -> None:
    st = await b.check("key:a", "reasoning_tokens", Period.DAY, 100, now=t0)
    assert (st.used, st.remaining, st.exhausted) == (0, 100, False)
    assert st.retry_after_seconds(t0) == 30
    assert await b.charge("key:a", "reasoning_tokens", Period.DAY, 60, now=t0) == 60
    assert await b.charge("key:a", "reasoning_tokens", Period.DAY, 50, now=t0) == 110
    st = await b.check("key:a", "reasoning_tokens", Period.DAY, 100, now=t0)
    assert st.exhausted and st.remaining == 0
    # Another scope or meter is a separate counter.
    assert (await b.check("team:t", "reasoning_tokens", Period.DAY, 100, now=t0)).used == 0
    assert (await b.check("key:a", "visual_tokens", Period.DAY, 100, now=t0)).used == 0
    # The next day starts from zero (no reset job).
    nxt = t0 + timedelta(seconds=31)
    assert (await b.check("key:a", "reasoning_tokens", Period.DAY, 100, now=nxt)).used == 0
    assert (await b.check("key:a", "reasoning_tokens", Period.WEEK, 100, now=nxt)).used == 0


async def test_memory_backend() -> None:
    await _exercise(MemoryPeriodBudgets())


@pytest.mark.redis
async def test_redis_backend_shared_and_atomic(redis_server: RedisServer) -> None:
    a = RedisPeriodBudgets(redis_server.url, prefix="t1")
    b = RedisPeriodBudgets(redis_server.url, prefix="t1")  # a second proxy
    await _exercise(a, TF)
    # Two "proxies" charging concurrently never lose an update.
    await asyncio.gather(*[x.charge("key:c", "reasoning_tokens", Period.MONTH, 3, now=TF)
                           for _ in range(50) for x in (a, b)])
    assert (await b.check("key:c", "reasoning_tokens", Period.MONTH, 10**6, now=TF)).used == 300
    key = a.key("key:c", "reasoning_tokens", Period.MONTH, TF)
    assert key == "t1:budget:{key:c}:reasoning_tokens:month:20990101"
    assert redis_server.client().ttl(key) > 0  # counters expire after their window
    await a.close()
    await b.close()


@pytest.mark.redis
async def test_redis_down_fail_open_and_closed() -> None:
    from tools.harness.procs import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens here
    open_ = RedisPeriodBudgets(url, fail_open=True, timeout_s=0.2)
    st = await open_.check("key:a", "reasoning_tokens", Period.DAY, 10, now=T0)
    assert st.used == 0 and not st.exhausted
    assert await open_.charge("key:a", "reasoning_tokens", Period.DAY, 5, now=T0) == 0
    closed = RedisPeriodBudgets(url, fail_open=False, timeout_s=0.2)
    with pytest.raises(BudgetStoreError):
        await closed.check("key:a", "reasoning_tokens", Period.DAY, 10, now=T0)
    await open_.close()
    await closed.close()
