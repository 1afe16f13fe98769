"""What a Redis says of its eviction (``INFO``), read from real redis-servers: one server, a Redis Cluster and a
Sentinel-managed master, with their policies set at run time (``CONFIG SET``) and evictions forced by filling
the server past ``maxmemory``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from litellm_kv.redis_client import RedisUse, connect
from litellm_kv.redis_eviction import Eviction, EvictionWatch, _worst, read_eviction
from tools.harness.redis_cluster import RedisClusterServers, RedisSentinelServers
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.redis]


def fill_until_evicted(r: redis.Redis, *, ttl: bool, limit_writes: int = 5000, prefix: str = "filler") -> int:
    """Write 16 KiB values until the server has evicted a key (bounded); returns evicted_keys then (the server
    may go on evicting after it)."""
    value = b"x" * 16384
    for i in range(limit_writes):
        r.set(f"{prefix}:{i}", value, ex=3600 if ttl else None)
        if i % 50 == 49 and int(r.info("stats")["evicted_keys"]) > 0:
            break
    evicted = int(r.info("stats")["evicted_keys"])
    assert evicted > 0, "the server never evicted: maxmemory not reached"
    return evicted


def cap_memory(r: redis.Redis, policy: str, headroom: int = 2 << 20) -> None:
    """``maxmemory`` a little above what the server holds now, with ``policy``."""
    r.config_set("maxmemory", str(int(r.info("memory")["used_memory"]) + headroom))
    r.config_set("maxmemory-policy", policy)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-eviction")
    try:
        yield srv
    finally:
        srv.stop()


def _read(target: object) -> Eviction:
    async def go() -> Eviction:
        client = connect(target, RedisUse.INDEX)  # type: ignore[arg-type]
        try:
            return await read_eviction(client)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_a_fresh_server_never_deletes_keys(server: RedisServer) -> None:
    e = _read(server.url)
    assert (e.maxmemory, e.policy, e.evicted_keys) == (0, "noeviction", 0)
    assert not any(e.may_evict(u.value) for u in RedisUse)


def test_volatile_policies_put_budgets_load_and_pins_at_risk_and_allkeys_the_index_too(server: RedisServer) -> None:
    r = server.client()
    cap_memory(r, "volatile-lru")
    e = _read(server.url)
    assert e.maxmemory > 0 and e.policy == "volatile-lru"
    assert {u.value for u in RedisUse if e.may_evict(u.value)} == {"budgets", "load", "pins"}
    r.config_set("maxmemory-policy", "allkeys-lfu")
    assert all(_read(server.url).may_evict(u.value) for u in RedisUse)
    r.config_set("maxmemory-policy", "noeviction")
    assert not any(_read(server.url).may_evict(u.value) for u in RedisUse)
    r.config_set("maxmemory", "0")
    r.config_set("maxmemory-policy", "allkeys-lru")  # no maxmemory: Redis never evicts
    assert not any(_read(server.url).may_evict(u.value) for u in RedisUse)


def test_a_watch_names_the_problem_once_keys_were_evicted_and_drops_it_when_the_policy_is_fixed(
    server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    r = server.client()
    cap_memory(r, "volatile-lru")
    w = EvictionWatch(server.url, {"budgets", "index"})
    asyncio.run(w.refresh())
    assert w.problem("budgets") == "" and w.status()["may_evict"] == ["budgets"]  # a risk, nothing lost yet
    assert [rec.levelname for rec in caplog.records] == ["WARNING"]
    evicted = fill_until_evicted(r, ttl=True)
    asyncio.run(w.refresh())
    fill_until_evicted(r, ttl=True, prefix="more")
    asyncio.run(w.refresh())  # more evictions: not said again
    assert [rec.levelname for rec in caplog.records] == ["WARNING", "ERROR"]
    assert "once full it deletes keys of budgets" in caplog.records[-1].getMessage()
    why = w.problem("budgets")
    assert "maxmemory-policy volatile-lru" in why and "has evicted keys" in why, why
    assert w.status()["evicted_keys"] >= evicted
    assert "noeviction" in why and "litellm_kv.budgets.redis" in why
    assert w.problem("index") == ""  # volatile-lru never deletes the index's keys (they have no TTL)
    r.config_set("maxmemory-policy", "noeviction")
    asyncio.run(w.refresh())
    assert w.problem("budgets") == "" and w.status()["problems"] == {}


def test_an_unreachable_redis_keeps_the_last_reading_and_says_why(server: RedisServer) -> None:
    w = EvictionWatch(server.url, {"budgets"})
    asyncio.run(w.refresh())
    server.stop()
    asyncio.run(w.refresh())
    assert w.last is not None and w.last.policy == "noeviction"
    assert w.status()["error"]


def test_a_cluster_is_read_on_every_master_and_its_worst_policy_kept() -> None:
    cluster = RedisClusterServers(masters=3, replicas=0, name="redis-cluster-eviction")
    try:
        assert _read(cluster.settings()) == Eviction(0, "noeviction", 0)
        node = cluster.master_for("{filler}")
        one = node.client()
        cap_memory(one, "volatile-ttl")
        evicted = fill_until_evicted(one, ttl=True, prefix="{filler}")  # one hash tag: that master's slot
        e = _read(cluster.settings())
        assert e.policy == "volatile-ttl" and e.maxmemory > 0 and e.evicted_keys >= evicted
    finally:
        cluster.stop()


def test_a_sentinel_master_is_read_through_the_sentinels() -> None:
    sentinel = RedisSentinelServers(name="redis-sentinel-eviction")
    try:
        cap_memory(sentinel.data[0].client(), "allkeys-lru")
        e = _read(sentinel.settings())
        assert e.policy == "allkeys-lru" and e.may_evict("index")
    finally:
        sentinel.stop()


def test_the_worst_policy_of_several_masters_is_kept() -> None:
    quiet = ({"maxmemory": 0, "maxmemory_policy": "noeviction"}, {"evicted_keys": 0})
    volatile = ({"maxmemory": 100, "maxmemory_policy": "volatile-lru"}, {"evicted_keys": 3})
    allkeys = ({"maxmemory": 100, "maxmemory_policy": "allkeys-random"}, {"evicted_keys": 4})
    assert _worst([quiet, volatile]) == Eviction(100, "volatile-lru", 3)
    assert _worst([volatile, allkeys, quiet]) == Eviction(100, "allkeys-random", 7)
    assert _worst([quiet]) == Eviction(0, "noeviction", 0)
