"""Period budgets: UTC windows, memory backend, and the Redis backend against a real redis-server.

The reservation contract (``PeriodBudgets.reserve`` / ``settle`` / ``release``) runs on every backend
(fixture ``budgets`` is parametrised, as ``tests/index/test_index_contract.py`` does for the index):
each test states one rule that keeps a period budget from being overspent.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from prometheus_client import REGISTRY

from litellm_kv.governance.budgets import (
    BudgetState,
    BudgetStoreError,
    Hold,
    MemoryPeriodBudgets,
    Period,
    PeriodBudgets,
    RedisPeriodBudgets,
)
from litellm_kv.redis_client import GuardSettings, RedisDeadlineExceeded, RedisGuard, RedisUse
from tools.harness.redis_cluster import RedisClusterServers, RedisSentinelServers
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


# -- the reservation contract, on every backend ------------------------------------------------------

@asynccontextmanager
async def _memory(request: pytest.FixtureRequest) -> AsyncIterator[PeriodBudgets]:
    yield MemoryPeriodBudgets(hold_ttl_s=60)


_contract_redis: list[RedisServer] = []  # one real redis-server for the contract, started on first use


@asynccontextmanager
async def _redis(request: pytest.FixtureRequest) -> AsyncIterator[PeriodBudgets]:
    if not _contract_redis:
        _contract_redis.append(RedisServer(name="redis-budgets-contract"))
    srv = _contract_redis[0]
    srv.client().flushall()
    store = RedisPeriodBudgets(srv.url, prefix="c", hold_ttl_s=60)
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def _cluster(request: pytest.FixtureRequest) -> AsyncIterator[PeriodBudgets]:
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    cluster.flushall()
    store = RedisPeriodBudgets(cluster.settings(), prefix="c", hold_ttl_s=60)
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def _sentinel(request: pytest.FixtureRequest) -> AsyncIterator[PeriodBudgets]:
    setup: RedisSentinelServers = request.getfixturevalue("redis_sentinel")
    setup.flushall()
    store = RedisPeriodBudgets(setup.settings(), prefix="c", hold_ttl_s=60)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(scope="module", autouse=True)
def _stop_contract_redis() -> Iterator[None]:
    yield
    while _contract_redis:
        _contract_redis.pop().stop()


@pytest.fixture(params=[pytest.param(_memory, id="memory"),
                        pytest.param(_redis, id="redis", marks=pytest.mark.redis),
                        pytest.param(_cluster, id="cluster", marks=pytest.mark.redis),
                        pytest.param(_sentinel, id="sentinel", marks=pytest.mark.redis)])
async def budgets(request: pytest.FixtureRequest) -> AsyncIterator[PeriodBudgets]:
    factory: Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[PeriodBudgets]] = request.param
    async with factory(request) as store:
        yield store


M = "reasoning_tokens"


async def test_reserve_grants_at_most_what_is_left(budgets: PeriodBudgets) -> None:
    await budgets.charge("key:a", M, Period.DAY, 70, now=TF)
    h = await budgets.reserve("key:a", M, Period.DAY, 100, 50, "h1", now=TF)
    assert h == Hold(30, BudgetState(70, 100, Period.DAY.window(TF)[1], 0))
    assert h.metered
    # The hold counts against the budget until it is settled.
    st = await budgets.check("key:a", M, Period.DAY, 100, now=TF)
    assert (st.used, st.held, st.remaining, st.exhausted) == (70, 30, 0, True)


async def test_unlimited_ask_holds_all_that_is_left(budgets: PeriodBudgets) -> None:
    await budgets.charge("key:a", M, Period.DAY, 40, now=TF)
    assert (await budgets.reserve("key:a", M, Period.DAY, 100, None, "h1", now=TF)).granted == 60


async def test_concurrent_holds_never_exceed_the_limit(budgets: PeriodBudgets) -> None:
    """The limit `tokens_per_day`: twenty requests racing for 50 tokens are granted 50 in all."""
    await budgets.charge("key:a", M, Period.DAY, 950, now=TF)
    holds = await asyncio.gather(*[budgets.reserve("key:a", M, Period.DAY, 1000, 40, f"h{i}", now=TF)
                                   for i in range(20)])
    assert sum(h.granted for h in holds) == 50
    assert (await budgets.check("key:a", M, Period.DAY, 1000, now=TF)).remaining == 0


async def test_settle_replaces_the_hold_with_what_was_used(budgets: PeriodBudgets) -> None:
    await budgets.reserve("key:a", M, Period.DAY, 100, 60, "h1", now=TF)
    assert await budgets.settle("key:a", M, Period.DAY, "h1", 25, now=TF) == 25
    st = await budgets.check("key:a", M, Period.DAY, 100, now=TF)
    assert (st.used, st.held, st.remaining) == (25, 0, 75)
    # An unknown (or expired) hold still charges what was used.
    assert await budgets.settle("key:a", M, Period.DAY, "gone", 5, now=TF) == 30


async def test_release_gives_the_hold_back(budgets: PeriodBudgets) -> None:
    await budgets.reserve("key:a", M, Period.DAY, 100, 60, "h1", now=TF)
    await budgets.release("key:a", M, Period.DAY, "h1", now=TF)
    st = await budgets.check("key:a", M, Period.DAY, 100, now=TF)
    assert (st.used, st.held) == (0, 0)
    await budgets.release("key:a", M, Period.DAY, "never-taken", now=TF)  # harmless


async def test_reserving_again_replaces_the_hold(budgets: PeriodBudgets) -> None:
    await budgets.reserve("key:a", M, Period.DAY, 100, 60, "h1", now=TF)
    assert (await budgets.reserve("key:a", M, Period.DAY, 100, 10, "h1", now=TF)).granted == 10
    assert (await budgets.check("key:a", M, Period.DAY, 100, now=TF)).held == 10


async def test_nothing_is_held_when_nothing_is_left(budgets: PeriodBudgets) -> None:
    await budgets.charge("key:a", M, Period.DAY, 100, now=TF)
    h = await budgets.reserve("key:a", M, Period.DAY, 100, 10, "h1", now=TF)
    assert h.granted == 0 and h.state.exhausted
    assert (await budgets.check("key:a", M, Period.DAY, 100, now=TF)).held == 0


async def test_holds_expire_so_a_dead_proxy_gives_them_back(budgets: PeriodBudgets) -> None:
    await budgets.reserve("key:a", M, Period.DAY, 100, 80, "h1", now=TF - timedelta(seconds=120))
    later = TF
    st = await budgets.check("key:a", M, Period.DAY, 100, now=later)
    assert (st.held, st.remaining) == (0, 100)
    assert (await budgets.reserve("key:a", M, Period.DAY, 100, 90, "h2", now=later)).granted == 90


async def test_holds_are_per_scope_meter_and_window(budgets: PeriodBudgets) -> None:
    await budgets.reserve("key:a", M, Period.DAY, 100, 100, "h1", now=TF)
    assert (await budgets.check("team:t", M, Period.DAY, 100, now=TF)).held == 0
    assert (await budgets.check("key:a", "visual_tokens", Period.DAY, 100, now=TF)).held == 0
    assert (await budgets.check("key:a", M, Period.DAY, 100, now=TF + timedelta(seconds=31))).held == 0


# -- bounded waits: a paused (SIGSTOP) redis-server --------------------------------------------------

async def _timed(call: Callable[[], Any]) -> float:
    t = time.perf_counter()
    with contextlib.suppress(BudgetStoreError):
        await call()
    return time.perf_counter() - t


@pytest.mark.redis
async def test_paused_redis_costs_one_deadline_then_nothing_while_the_breaker_is_open() -> None:
    """Bounded waits of the period budgets: each call gives up at its deadline, and after
    ``breaker_failures`` of them calls fail at once until the breaker lets a probe through."""
    srv = RedisServer(name="redis-budgets-paused")
    closed = RedisPeriodBudgets(srv.url, fail_open=False, prefix="p",
                                guard=RedisGuard(RedisUse.BUDGETS, GuardSettings(50, 2, 0.5)))
    open_ = RedisPeriodBudgets(srv.url, fail_open=True, prefix="p",
                               guard=RedisGuard(RedisUse.BUDGETS, GuardSettings(50, 2, 0.5)))
    try:
        assert (await closed.reserve("key:a", M, Period.DAY, 100, 10, "h0", now=TF)).granted == 10
        assert srv.proc is not None
        srv.proc.signal(signal.SIGSTOP)
        try:
            waits = [await _timed(lambda: closed.reserve("key:a", M, Period.DAY, 100, 10, "h1", now=TF))
                     for _ in range(4)]
            with pytest.raises(BudgetStoreError, match="fail_closed"):
                await closed.check("key:a", M, Period.DAY, 100, now=TF)
            # Failing open: the request goes on unmetered, as fast.
            held = await open_.reserve("key:a", M, Period.DAY, 100, 10, "h2", now=TF)
            assert (held.granted, held.metered) == (10, False)
        finally:
            srv.proc.signal(signal.SIGCONT)
        assert all(w < 0.25 for w in waits[:2]), waits  # the deadline, not the 0.5 s socket timeout
        assert all(w < 0.02 for w in waits[2:]), waits  # breaker open: Redis is not waited on
        await asyncio.sleep(0.6)  # the breakers let one probe through, which closes them
        with contextlib.suppress(BudgetStoreError):
            await closed.check("key:a", M, Period.DAY, 100, now=TF)
        await open_.check("key:a", M, Period.DAY, 100, now=TF)
        # Reservations sent while Redis was paused may run when it resumes: they are released again.
        assert await _held_once_answered(closed) == 10
    finally:
        await closed.close()
        await open_.close()
        srv.stop()


@pytest.mark.redis
async def test_failing_open_grants_only_what_this_proxy_knows_is_left() -> None:
    """The limit `tokens_per_day` under `on_store_error: fail_open`, against a client that can make Redis
    stop answering (or waits for it to): a budget this proxy saw spent is not handed out again. While
    Redis is paused a reservation gets at most the limit less the usage Redis last reported and the
    holds of this proxy's own requests in flight; what it grants it holds, so two requests cannot take
    the same remainder; a settle that fails keeps the call's tokens counted here."""
    srv = RedisServer(name="redis-budgets-fail-open-view")
    store = RedisPeriodBudgets(srv.url, fail_open=True, prefix="fov",
                               guard=RedisGuard(RedisUse.BUDGETS, GuardSettings(50, 2, 0.5)))
    try:
        await store.charge("key:a", M, Period.DAY, 950, now=TF)
        first = await store.reserve("key:a", M, Period.DAY, 1000, None, "h-first", now=TF)
        assert (first.granted, first.metered) == (50, True)
        assert srv.proc is not None
        srv.proc.signal(signal.SIGSTOP)
        try:
            spent = await store.reserve("key:a", M, Period.DAY, 1000, None, "h-2", now=TF)
            assert (spent.granted, spent.metered) == (0, False)
            assert spent.state.exhausted and (spent.state.used, spent.state.held) == (950, 50)
            # A key this proxy never saw: nothing is known, so the request is served as before.
            other = await store.reserve("key:b", M, Period.DAY, 1000, 30, "h-b", now=TF)
            assert (other.granted, other.metered) == (30, False)
            # The first request is given back (its release cannot reach Redis; here it is given back).
            await store.release("key:a", M, Period.DAY, "h-first", now=TF)
            second = await store.reserve("key:a", M, Period.DAY, 1000, None, "h-3", now=TF)
            third = await store.reserve("key:a", M, Period.DAY, 1000, None, "h-4", now=TF)
            assert (second.granted, third.granted) == (50, 0)
            # It used 40 and cannot settle: those 40 still count here, the unused 10 are free again.
            await store.settle("key:a", M, Period.DAY, "h-3", 40, now=TF)
            fourth = await store.reserve("key:a", M, Period.DAY, 1000, None, "h-5", now=TF)
            assert fourth.granted == 10
            # Giving back a hold granted here asks Redis nothing (it never held it).
            assert store.guard is not None
            asked = store.guard.calls + store.guard.skipped
            await store.release("key:a", M, Period.DAY, "h-5", now=TF)
            assert store.guard.calls + store.guard.skipped == asked
            await store.release("key:a", M, Period.DAY, "h-first", now=TF)  # a hold Redis granted: asked
            assert store.guard.calls + store.guard.skipped == asked + 1
            fourth = await store.reserve("key:a", M, Period.DAY, 1000, None, "h-5", now=TF)
            state = await store.check("key:a", M, Period.DAY, 1000, now=TF)
            assert (state.used, state.held, state.metered) == (950, 50, False)
            # A request that fails open on its first budget asks no more: the others come from here too.
            later = store.fail_open_hold("key:a", M, Period.WEEK, 5000, 100, "h-w", TF)
            assert (later.granted, later.metered) == (100, False)
        finally:
            srv.proc.signal(signal.SIGCONT)
        # The first request's hold, whose release could not reach Redis, is released once Redis answers.
        await asyncio.sleep(0.6)  # the breaker lets a probe through
        state = None
        for _ in range(60):
            state = await store.check("key:a", M, Period.DAY, 1000, now=TF)
            if state.metered and state.held == 0:
                break
            await asyncio.sleep(0.05)
        assert state is not None and (state.metered, state.used, state.held) == (True, 950, 0)
    finally:
        await store.close()
        srv.stop()


def test_the_local_view_forgets_expired_holds_and_old_budgets() -> None:
    """Memory stays bounded: holds leave with their TTL, and beyond ``capacity`` budgets the oldest go."""
    from litellm_kv.governance.budgets import LocalView

    clock = [1000.0]
    view = LocalView(10.0, clock=lambda: clock[0], capacity=3)
    view.saw_usage("a", 3)
    view.saw_usage("a", 5)  # the store's last word
    view.took("a", "h1", 7)
    assert (view.used("a"), view.held("a")) == (5, 7)
    clock[0] += 11
    assert view.held("a") == 0
    for k in ("b", "c", "d"):
        view.saw_usage(k, 1)
    assert list(view.budgets) == ["b", "c", "d"] and view.used("a") == 0
    view.took("d", "h", 0)  # nothing granted: nothing held
    assert view.held("d") == 0


# -- the budget thread: a deadline that measures Redis, not how busy the proxy is ---------------------

def _guard(deadline_ms: float = 50, *, second_look: bool = False) -> RedisGuard:
    return RedisGuard(RedisUse.BUDGETS, GuardSettings(deadline_ms, 3, 0.5), second_look=second_look)


async def test_second_look_takes_an_answer_that_arrived_with_the_deadline() -> None:
    """A thread that was not scheduled past the deadline wakes up to the answer and the deadline at once:
    asyncio runs the deadline first and the call is given up although Redis answered (the request then
    runs without its hold); a guard with ``second_look`` reads the answer first."""
    loop = asyncio.get_running_loop()

    async def call() -> str:
        answer: asyncio.Future[str] = loop.create_future()

        def starved() -> None:  # the thread off the CPU past the deadline; the answer lands meanwhile
            time.sleep(0.1)
            loop.call_soon(answer.set_result, "answer")

        loop.call_later(0.01, starved)
        return await answer

    with pytest.raises(RedisDeadlineExceeded):
        await _guard().run(call)
    looking = _guard(second_look=True)
    assert await looking.run(call) == "answer"
    assert looking.deadline_exceeded == 0

    async def never() -> str:
        await asyncio.Event().wait()
        return "never"

    t = time.perf_counter()
    with pytest.raises(RedisDeadlineExceeded):
        await looking.run(never)  # no answer: given up at the deadline, as without a second look
    assert time.perf_counter() - t < 0.25


async def test_a_stalled_loop_pushes_the_deadline_back_by_the_stall() -> None:
    """The store's thread not scheduled for 80 ms (the interpreter lock held by another thread, or no
    CPU) just before it sends the call: the answer comes 2 ms after the thread runs again, past the 50 ms
    deadline, so without counting the stall the call is given up although Redis answered at once (the
    second look does not wait for a round trip). The guard counts only the time its loop could run."""
    loop = asyncio.get_running_loop()

    async def call() -> str:
        answer: asyncio.Future[str] = loop.create_future()

        def starved() -> None:  # the thread off the CPU; the command goes out when it runs again
            time.sleep(0.08)
            loop.call_later(0.002, answer.set_result, "answer")

        loop.call_later(0.01, starved)
        return await answer

    plain = _guard()
    with pytest.raises(RedisDeadlineExceeded):
        await plain.run(call)
    looking = _guard(second_look=True)
    t = time.perf_counter()
    assert await looking.run(call) == "answer"
    assert (looking.deadline_exceeded, looking.stretched) == (0, 1)
    assert time.perf_counter() - t < 0.2
    assert looking.status()["deadlines_stretched"] == 1


async def test_a_running_loop_gives_a_silent_call_up_at_the_deadline() -> None:
    """A call nobody answers while the loop runs freely costs the deadline and no more: the usual
    wait for the interpreter lock is not counted as a stall (were each tick's 5 ms counted, the wait
    would double)."""
    looking = _guard(second_look=True)

    async def never() -> str:
        await asyncio.Event().wait()
        return "never"

    for _ in range(3):
        t = time.perf_counter()
        with pytest.raises(RedisDeadlineExceeded):
            await looking.run(never)
        assert 0.045 < time.perf_counter() - t < 0.09


async def test_a_loop_that_keeps_stalling_gives_up_after_the_stretch() -> None:
    """However long the loop stalls, a silent call is given up within ``STALL_STRETCH`` deadlines (and
    the stall that straddles the last of them)."""
    from litellm_kv.redis_client import STALL_STRETCH

    loop = asyncio.get_running_loop()
    stalling = True

    def stall() -> None:
        time.sleep(0.06)
        if stalling:
            loop.call_later(0.001, stall)

    async def never() -> str:
        await asyncio.Event().wait()
        return "never"

    looking = _guard(second_look=True)
    loop.call_soon(stall)
    t = time.perf_counter()
    try:
        with pytest.raises(RedisDeadlineExceeded):
            await looking.run(never)
    finally:
        stalling = False
    waited = time.perf_counter() - t
    assert STALL_STRETCH * 0.05 - 0.01 < waited < STALL_STRETCH * 0.05 + 0.1, waited
    assert looking.stretched == 1


async def test_an_idle_stall_clock_schedules_nothing() -> None:
    """The stall clock ticks only while calls are in flight, and counts only what is beyond its slack."""
    from litellm_kv.redis_client import StallClock

    loop = asyncio.get_running_loop()
    clock = StallClock(loop, tick_s=0.005)
    mark = clock.enter()
    time.sleep(0.05)  # the loop stalls 50 ms: 40 of them beyond the slack
    await asyncio.sleep(0)
    assert 0.035 < clock.lost_since(mark) < 0.2
    clock.leave()
    assert clock._handle is None
    before = clock.lost()
    time.sleep(0.03)
    await asyncio.sleep(0)
    assert clock.lost() == before  # idle: a stall then is no call's


@pytest.mark.redis
async def test_a_starved_budget_thread_does_not_make_a_healthy_redis_fail_open(redis_server: RedisServer) -> None:
    """The limit `tokens_per_day` (`on_store_error: fail_open`): the budget store's own thread starved
    (here: its loop blocked 200 ms, twice, as when the proxy's main thread holds the interpreter lock in
    a long C call) while a healthy Redis answers at once. The second block starts as the reservation
    does and outlasts the 150 ms deadline: the reservation is granted and metered, as the stall does not
    count. The starving ends well inside the stretch's bound (4 deadlines), however many passes of the
    loop the answer then needs."""
    from litellm_kv.redis_client import RedisLoop

    own = RedisPeriodBudgets(redis_server.url, prefix="starved", guard=_guard(150, second_look=True),
                             loop=RedisLoop("budgets-starved"))
    try:
        await own.check("key:warm", M, Period.DAY, 100, now=TF)  # connected: only the reservation is timed
        budget_loop = own.loop.loop() if own.loop else None
        assert budget_loop is not None
        for i in range(5):
            until = time.monotonic() + 0.3

            def starve(until: float = until) -> None:
                time.sleep(0.2)
                if time.monotonic() < until:
                    budget_loop.call_later(0.001, starve)

            budget_loop.call_soon_threadsafe(starve)
            held = await own.reserve("key:starved", M, Period.DAY, 100, 10, f"h{i}", now=TF)
            assert (held.granted, held.metered) == (10, True), i
        assert own.guard is not None and own.guard.deadline_exceeded == 0
    finally:
        await own.close()


async def _reserve_while_the_loop_is_busy(store: RedisPeriodBudgets, busy_s: float) -> Hold:
    """Reserve while this event loop is kept busy for ``busy_s``, as by a burst of requests: between
    any two steps of the reservation (connect, handshake, load the script, run it) the loop runs 60 ms
    of other work."""
    loop = asyncio.get_running_loop()
    until = time.monotonic() + busy_s

    def work() -> None:
        time.sleep(0.06)
        if time.monotonic() < until:
            loop.call_soon(work)

    loop.call_soon(work)
    return await store.reserve("key:busy", M, Period.DAY, 100, 10, f"h{time.time_ns()}", now=TF)


@pytest.mark.redis
async def test_a_busy_proxy_loop_does_not_make_a_healthy_redis_fail_open(redis_server: RedisServer) -> None:
    """The limit `tokens_per_day` (`on_store_error: fail_open`): a reservation Redis answered at once is not
    given up because the proxy's loop was busy past the 50 ms deadline; on the caller's own loop it was
    (the request then ran without a hold: the overshoot bound did not hold under a burst)."""
    from litellm_kv.redis_client import RedisLoop

    own = RedisPeriodBudgets(redis_server.url, prefix="busy", guard=_guard(second_look=True),
                             loop=RedisLoop("budgets-test"))
    shared = RedisPeriodBudgets(redis_server.url, prefix="busy-shared", guard=_guard())
    try:
        # Both stores are cold (no connection yet), as a pool growing for a burst's concurrent calls is.
        held = await _reserve_while_the_loop_is_busy(own, 0.5)
        assert (held.granted, held.metered) == (10, True)
        assert own.guard is not None and own.guard.deadline_exceeded == 0
        # The same call with the deadline on the busy loop itself: the answer is there, the deadline wins.
        late = await _reserve_while_the_loop_is_busy(shared, 0.5)
        assert late.metered is False
    finally:
        await own.close()
        await shared.close()


async def _held_once_answered(store: RedisPeriodBudgets, want: int = 10) -> int | None:
    """``key:a``'s held tokens once they reach ``want`` (the reservations a paused Redis ran late are released
    in their own time), asked for up to ~2 s; a call that misses its deadline on a loaded test machine is
    asked again. None when Redis never answered."""
    held = None
    for _ in range(40):
        with contextlib.suppress(BudgetStoreError):
            held = (await store.check("key:a", M, Period.DAY, 100, now=TF)).held
        if held == want:
            break
        await asyncio.sleep(0.05)
    return held


@pytest.mark.redis
async def test_budget_thread_still_gives_up_on_a_paused_redis_within_the_deadline() -> None:
    """Bounded waits of the period budgets when their calls run on a loop of their own: a paused Redis
    costs one deadline per call, then nothing while the breaker is open; a call paused mid-way is
    released once Redis answers again."""
    from litellm_kv.redis_client import RedisLoop

    srv = RedisServer(name="redis-budgets-thread-paused")
    store = RedisPeriodBudgets(srv.url, fail_open=False, prefix="tp", guard=_guard(second_look=True),
                               loop=RedisLoop("budgets-t"))
    try:
        for _ in range(40):  # connect and load the script (a loaded test machine may miss the deadline once)
            with contextlib.suppress(BudgetStoreError):
                assert (await store.reserve("key:a", M, Period.DAY, 100, 10, "h0", now=TF)).granted == 10
                break
            await asyncio.sleep(0.2)
        assert srv.proc is not None
        srv.proc.signal(signal.SIGSTOP)
        try:
            waits = [await _timed(lambda: store.reserve("key:a", M, Period.DAY, 100, 10, "h1", now=TF))
                     for _ in range(5)]
        finally:
            srv.proc.signal(signal.SIGCONT)
        assert all(w < 0.25 for w in waits[:3]), waits  # one deadline each, not the 0.5 s socket timeout
        assert all(w < 0.02 for w in waits[3:]), waits  # breaker open: Redis is not waited on
        await asyncio.sleep(0.6)
        assert await _held_once_answered(store) == 10
    finally:
        await store.close()
        srv.stop()


@pytest.mark.redis
async def test_counters_a_restarted_redis_lost_are_raised_back_to_what_the_proxies_saw() -> None:
    """A Redis without persistence restarts empty: each proxy raises the counters it has seen back to the usage it
    last saw, before granting anything from them (the larger of two proxies' views, not their sum)."""
    srv = RedisServer(name="redis-budget-restart")
    a = RedisPeriodBudgets(srv.url, prefix="rs")
    b = RedisPeriodBudgets(srv.url, prefix="rs")
    try:
        await a.charge("key:k", "reasoning_tokens", Period.DAY, 100, now=TF)
        assert (await b.check("key:k", "reasoning_tokens", Period.DAY, 150, now=TF)).used == 100
        await a.charge("key:k", "reasoning_tokens", Period.DAY, 20, now=TF)  # b last saw 100, a 120
        srv.restart()
        restored = REGISTRY.get_sample_value("litellm_kv_budget_usage_restored_total") or 0.0
        # b comes first: the counter is raised to what b saw; a's larger view then wins, not the sum.
        assert (await b.check("key:k", "reasoning_tokens", Period.DAY, 150, now=TF)).used == 100
        held = await a.reserve("key:k", "reasoning_tokens", Period.DAY, 150, None, "h1", now=TF)
        assert (held.state.used, held.granted) == (120, 30)
        assert (REGISTRY.get_sample_value("litellm_kv_budget_usage_restored_total") or 0.0) - restored == 120
        # A budget neither proxy saw starts from nothing, as before.
        assert (await a.check("key:other", "reasoning_tokens", Period.DAY, 150, now=TF)).used == 0
    finally:
        await a.close()
        await b.close()
        srv.stop()


@pytest.mark.redis
async def test_a_counter_lowered_by_hand_is_believed(redis_server: RedisServer) -> None:
    """An operator who lowers or deletes a counter leaves the scope's epoch: that is a decision, not a loss."""
    a = RedisPeriodBudgets(redis_server.url, prefix="hand")
    try:
        await a.charge("key:h", "reasoning_tokens", Period.DAY, 80, now=TF)
        assert (await a.check("key:h", "reasoning_tokens", Period.DAY, 100, now=TF)).used == 80
        redis_server.client().delete(a.key("key:h", "reasoning_tokens", Period.DAY, TF))
        assert (await a.check("key:h", "reasoning_tokens", Period.DAY, 100, now=TF)).used == 0
        # Deleting the epoch as well (a flush) reads as a loss: the counter comes back.
        await a.charge("key:h", "reasoning_tokens", Period.DAY, 30, now=TF)
        redis_server.client().flushdb()
        assert (await a.check("key:h", "reasoning_tokens", Period.DAY, 100, now=TF)).used == 30
    finally:
        await a.close()
