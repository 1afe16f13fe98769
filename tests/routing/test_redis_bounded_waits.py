"""Bounded waits on the routing path, against a real ``redis-server`` paused with SIGSTOP (it keeps
accepting connections but never answers, the case a socket timeout alone turns into a long wait) and
stopped: the index lookup (with the shared load riding in it), the load store and the pin store give up
within ``redis_routing.deadline_ms``, and after ``breaker_failures`` failures in a row they skip Redis
without waiting until a probe after ``breaker_cooldown_s`` finds it back.

The breaker's state machine is also driven alone with an injected clock (its transitions need minutes of
wall time otherwise); every other test here talks to the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aredis

from litellm_kv.config import RedisRoutingSettings, Settings, parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.index.base import BlockOp, Tier
from litellm_kv.index.redis import RedisIndex
from litellm_kv.redis_client import RedisDeadlineExceeded, RedisGuard, RedisSkipped, RedisUse, guard_status
from litellm_kv.routing.affinity import Candidates, RedisPinStore
from litellm_kv.routing.cost import CostModel
from litellm_kv.routing.load import RedisLoadTracker, TrackedLoad
from litellm_kv.routing.router import KVRouter, RoutingRequest
from litellm_kv.routing.siblings import SiblingIndex
from litellm_kv.vllm.hashing import BlockHasher
from tools.harness.redis_server import RedisServer

pytestmark = pytest.mark.redis

# Headroom over the deadline for a machine whose cores are shared: still far below the socket timeouts
# (5 s for the index and load, 0.25-2 s for pins) that bounded these waits before.
SLACK_S = 0.4
TOKENS = list(range(320))
REPLICAS = ["a", "b"]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-bounded-waits")
    yield srv
    srv.stop()


@contextlib.contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    """Redis frozen (SIGSTOP): connections are accepted by the kernel, commands are never answered."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def limits(cooldown_s: float = 60.0) -> RedisRoutingSettings:
    return RedisRoutingSettings(deadline_ms=50.0, breaker_failures=3, breaker_cooldown_s=cooldown_s)


class Routing:
    """One shared-mode group's routing parts (index + riding load), each store behind its own guard."""

    def __init__(self, url: str, cooldown_s: float) -> None:
        self.index_guard = RedisGuard(RedisUse.INDEX, limits(cooldown_s))
        self.load_guard = RedisGuard(RedisUse.LOAD, limits(cooldown_s), scope="g")
        self.index = RedisIndex(url, guard=self.index_guard)
        self.client = aredis.from_url(url)
        self.load = RedisLoadTracker(self.client, proxy_id="me", guard=self.load_guard)
        self.hasher = BlockHasher("sha256", 16)
        self.router = KVRouter("g", self.index, CostModel(seed=1), SiblingIndex(), backend="redis")

    async def learn(self) -> None:
        """Replica a holds the prompt: routing that reaches Redis sends it to a, exactly."""
        hashes = self.hasher.wire_hashes(TOKENS, None, (), None)
        await self.index.apply("g", "a", [BlockOp(tuple(hashes), Tier.GPU, +1)])

    async def decide(self) -> tuple[float, str, str]:
        """(seconds, chosen replica, fallback reason) of one decision."""

        async def no_separate_read() -> dict[str, TrackedLoad]:
            raise AssertionError("the load rides in the lookup")

        t0 = time.perf_counter()
        res = await self.router.decide(RoutingRequest(TOKENS), self.hasher, REPLICAS, no_separate_read, {},
                                       load_rider=self.load.snapshot_rider("g", REPLICAS))
        return time.perf_counter() - t0, res.replica, res.fallback_why

    async def close(self) -> None:
        await self.load.close()
        await self.index.close()
        await self.client.aclose()


@pytest.fixture
async def routing(server: RedisServer) -> AsyncIterator[Routing]:
    server.start()
    server.client().flushall()
    r = Routing(server.url, cooldown_s=0.5)
    await r.learn()
    yield r
    await r.close()


async def test_routing_deadline_bounds_each_lookup_on_a_paused_redis(server: RedisServer, routing: Routing) -> None:
    elapsed, replica, why = await routing.decide()
    assert (replica, why) == ("a", "")  # reached Redis: the cached replica, exactly
    with paused(server):
        for _ in range(3):
            elapsed, _replica, why = await routing.decide()
            assert why == "index_unavailable"
            assert elapsed < 0.05 + SLACK_S, f"a decision waited {elapsed:.3f}s on a paused Redis"
    assert routing.index_guard.deadline_exceeded == 3


async def test_routing_breaker_skips_a_sick_redis_and_probes_after_the_cooldown(
    server: RedisServer, routing: Routing,
) -> None:
    with paused(server):
        for _ in range(3):  # breaker_failures late answers open the breaker
            await routing.decide()
        assert routing.index_guard.state == "open"
        skipped = []
        for _ in range(20):
            elapsed, _replica, why = await routing.decide()
            skipped.append(elapsed)
            assert why == "index_unavailable"
        # Open: Redis is not asked at all, so a decision costs what a load-only decision costs.
        assert routing.index_guard.skipped == 20 and routing.index_guard.deadline_exceeded == 3
        assert max(skipped) < SLACK_S
        await asyncio.sleep(0.6)
        await routing.decide()  # the cool-down passed: one probe, still paused, opens it again
        assert routing.index_guard.state == "open" and routing.index_guard.opens == 2
    await asyncio.sleep(0.6)
    _elapsed, replica, why = await routing.decide()  # the probe finds Redis back
    assert (replica, why) == ("a", "")
    assert routing.index_guard.state == "closed"
    assert routing.index_guard.status() in guard_status()  # what /litellm-kv/health shows


async def test_routing_deadline_bounds_a_stopped_redis_and_recovers_after_restart(
    server: RedisServer, routing: Routing,
) -> None:
    await routing.decide()
    server.stop()
    try:
        for _ in range(5):
            elapsed, _replica, why = await routing.decide()
            assert why == "index_unavailable" and elapsed < 0.05 + SLACK_S
        assert routing.index_guard.state == "open"
    finally:
        server.start()
    await asyncio.sleep(0.6)
    await routing.learn()  # a restarted Redis has no data (no persistence here)
    _elapsed, replica, why = await routing.decide()
    assert (replica, why) == ("a", "") and routing.index_guard.state == "closed"


async def test_load_store_deadline_bounds_reads_and_writes_on_a_paused_redis(
    server: RedisServer, routing: Routing,
) -> None:
    await routing.load.begin("g", "b", "r1", 1000)
    await routing.load.flush()
    with paused(server):
        t0 = time.perf_counter()
        with pytest.raises(RedisDeadlineExceeded):
            await routing.load.snapshot("g", REPLICAS)
        assert time.perf_counter() - t0 < 0.05 + SLACK_S
        # Counted here at once; the background write gives up at the deadline and is retried.
        await routing.load.begin("g", "a", "r2", 500)
        t0 = time.perf_counter()
        await routing.load.flush()
        assert time.perf_counter() - t0 < 0.05 + SLACK_S
        assert routing.load.write_errors >= 1
    assert routing.load.local_snapshot("g", ["a"])["a"].prefill_tokens == 500


async def test_pin_resolve_deadline_and_breaker_on_a_paused_redis(server: RedisServer) -> None:
    server.start()
    server.client().flushall()
    guard = RedisGuard(RedisUse.PINS, limits(cooldown_s=60.0))
    store = RedisPinStore(server.url, timeout=2.0, guard=guard)  # a socket timeout far above the deadline
    ttl = {"a": 60_000, "b": 60_000}
    try:
        assert (await store.resolve(["k"], Candidates(ttl, "a"))).deployment == "a"
        with paused(server):
            for _ in range(3):
                t0 = time.perf_counter()
                with pytest.raises(RedisDeadlineExceeded):
                    await store.resolve(["k"], Candidates(ttl, "b"))
                assert time.perf_counter() - t0 < 0.05 + SLACK_S
            t0 = time.perf_counter()
            with pytest.raises(RedisSkipped, match="breaker_failures=3"):
                await store.resolve(["k"], Candidates(ttl, "b"))
            assert time.perf_counter() - t0 < 0.01 + SLACK_S
    finally:
        await store.close()


async def test_breaker_transitions_with_an_injected_clock() -> None:
    now = [0.0]
    guard = RedisGuard(RedisUse.INDEX, limits(cooldown_s=2.0), clock=lambda: now[0])

    async def fails() -> None:
        raise ConnectionError("refused")

    async def answers() -> str:
        return "ok"

    for _ in range(2):
        with pytest.raises(ConnectionError):
            await guard.run(fails)
    assert guard.state == "closed"
    assert await guard.run(answers) == "ok"  # a success resets the count of failures in a row
    for _ in range(3):
        with pytest.raises(ConnectionError):
            await guard.run(fails)
    assert guard.state == "open"
    now[0] = 1.9
    with pytest.raises(RedisSkipped):
        await guard.run(answers)
    now[0] = 2.0
    gate = asyncio.Event()

    async def slow_probe() -> str:
        await gate.wait()
        return "ok"

    probe = asyncio.create_task(guard.run(slow_probe))
    await asyncio.sleep(0)
    assert guard.state == "half_open"
    with pytest.raises(RedisSkipped):  # one probe at a time
        await guard.run(answers)
    gate.set()
    assert await probe == "ok" and guard.state == "closed"


def test_redis_routing_settings_are_validated() -> None:
    assert parse_section(Settings, {}, "litellm_kv").redis_routing.deadline_ms == 50.0
    for bad in ({"deadline_ms": 0}, {"breaker_failures": 0}, {"breaker_cooldown_s": -1}):
        with pytest.raises(ConfigError, match="redis_routing"):
            parse_section(Settings, {"redis_routing": bad}, "litellm_kv")
