"""Router-tracked load: in-process tracker, and the Redis tracker shared by proxies (real
redis-server)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio as aredis

from litellm_kv.routing.load import InMemoryLoadTracker, LoadConfig, RedisLoadTracker
from tests.support.redis_server import RedisServer


async def test_in_memory_lifecycle_and_recent_decay() -> None:
    now = [0.0]
    t = InMemoryLoadTracker(LoadConfig(recent_half_life_s=10.0), clock=lambda: now[0])
    await t.begin("g", "a", "r1", 1000)
    await t.begin("g", "a", "r2", 500)
    s = await t.snapshot("g", ["a", "b"])
    assert (s["a"].prefill_tokens, s["a"].decode) == (1500, 0)
    assert s["b"].prefill_tokens == 0
    await t.first_token("r1")
    await t.first_token("r1")  # idempotent
    s = await t.snapshot("g", ["a"])
    assert (s["a"].prefill_tokens, s["a"].decode) == (500, 1)
    await t.end("r1")
    await t.end("r2")
    await t.end("unknown")
    s = await t.snapshot("g", ["a"])
    assert (s["a"].prefill_tokens, s["a"].decode) == (0, 0)
    # Nothing in flight, but the work sent is remembered, halving every 10 s.
    assert s["a"].recent_tokens == pytest.approx(1500)
    now[0] = 10.0
    assert (await t.snapshot("g", ["a"]))["a"].recent_tokens == pytest.approx(750)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.stop()


async def test_redis_tracker_shares_counts_between_proxies(redis_url: str) -> None:
    c1 = aredis.from_url(redis_url)
    c2 = aredis.from_url(redis_url)
    try:
        await c1.flushall()
        p1 = RedisLoadTracker(c1, proxy_id="p1")
        p2 = RedisLoadTracker(c2, proxy_id="p2")
        await p1.begin("grp", "a", "x", 1000)
        await p2.begin("grp", "a", "y", 300)
        await p2.begin("grp", "b", "z", 50)
        s = await p1.snapshot("grp", ["a", "b", "c"])
        assert (s["a"].prefill_tokens, s["b"].prefill_tokens, s["c"].prefill_tokens) == (1300, 50, 0)
        assert s["a"].recent_tokens == pytest.approx(1300, rel=0.01)
        await p2.first_token("y")
        s = await p1.snapshot("grp", ["a"])
        assert (s["a"].prefill_tokens, s["a"].decode) == (1000, 1)
        await p2.end("y")
        await p1.end("x")
        s = await p2.snapshot("grp", ["a"])
        assert (s["a"].prefill_tokens, s["a"].decode) == (0, 0)
        # Keys of one group share a hash tag (one Redis Cluster slot).
        keys = sorted(k.decode() for k in await c1.keys("*"))
        assert keys == ["{lkv:grp}:load", "{lkv:grp}:proxies"]
    finally:
        await c1.aclose()
        await c2.aclose()


async def test_dead_proxy_counts_fade(redis_url: str) -> None:
    client = aredis.from_url(redis_url)
    try:
        await client.flushall()
        dead = RedisLoadTracker(client, LoadConfig(ttl_s=0.5), proxy_id="dead")
        alive = RedisLoadTracker(client, LoadConfig(ttl_s=30.0), proxy_id="alive")
        await dead.begin("g", "a", "r1", 4000)  # never ended: the proxy "crashes"
        await alive.begin("g", "a", "r2", 100)
        assert (await alive.snapshot("g", ["a"]))["a"].prefill_tokens == 4100
        await asyncio.sleep(0.7)
        await alive.heartbeat(["g"])
        assert (await alive.snapshot("g", ["a"]))["a"].prefill_tokens == 100
        # The dead proxy's fields are gone from Redis, not only ignored.
        fields = [f.decode() for f in await client.hkeys("{lkv:g}:load")]
        assert not any(f.startswith("dead|") for f in fields)
    finally:
        await client.aclose()
