"""The KVIndex contract, run against every backend (fixture ``index`` is parametrised).

A backend joins by adding a ``pytest.param`` to ``BACKENDS`` whose factory (given the test's request, for
session fixtures) yields a fresh, empty index. Redis runs as one server, as a Redis Cluster (3 masters + 3
replicas) and as a Sentinel-managed master, all real servers. Each test states one rule of
``litellm_kv/index/base.py`` a router relies on.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from litellm_kv.index.base import BlockOp, KVIndex, ReplicaMatch, Tier
from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.index.redis import RedisIndex
from tools.harness.redis_cluster import RedisClusterServers, RedisSentinelServers
from tools.harness.redis_server import RedisServer

G = "llama/3.1-8b"


@asynccontextmanager
async def memory_backend(request: pytest.FixtureRequest) -> AsyncIterator[KVIndex]:
    yield InMemoryIndex()


_redis_server: list[RedisServer] = []  # one real redis-server for the module, started on first use


@asynccontextmanager
async def redis_backend(request: pytest.FixtureRequest) -> AsyncIterator[KVIndex]:
    if not _redis_server:
        _redis_server.append(RedisServer(name="redis-contract"))
    srv = _redis_server[0]
    srv.client().flushall()
    idx = RedisIndex(srv.url)
    try:
        yield idx
    finally:
        await idx.close()


@asynccontextmanager
async def cluster_backend(request: pytest.FixtureRequest) -> AsyncIterator[KVIndex]:
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    cluster.flushall()
    idx = RedisIndex(cluster.settings())
    try:
        yield idx
    finally:
        await idx.close()


@asynccontextmanager
async def sentinel_backend(request: pytest.FixtureRequest) -> AsyncIterator[KVIndex]:
    setup: RedisSentinelServers = request.getfixturevalue("redis_sentinel")
    setup.flushall()
    idx = RedisIndex(setup.settings())
    try:
        yield idx
    finally:
        await idx.close()


@pytest.fixture(scope="module", autouse=True)
def _stop_redis() -> Iterator[None]:
    yield
    while _redis_server:
        _redis_server.pop().stop()


BACKENDS: list[object] = [
    pytest.param(memory_backend, id="memory"),
    pytest.param(redis_backend, id="redis", marks=pytest.mark.redis),
    pytest.param(cluster_backend, id="cluster", marks=pytest.mark.redis),
    pytest.param(sentinel_backend, id="sentinel", marks=pytest.mark.redis),
]


@pytest.fixture(params=BACKENDS)
async def index(request: pytest.FixtureRequest) -> AsyncIterator[KVIndex]:
    factory: Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[KVIndex]] = request.param
    async with factory(request) as idx:
        yield idx


def stored(*hashes: int, tier: Tier = Tier.GPU) -> BlockOp:
    return BlockOp(tuple(hashes), tier, +1)


def removed(*hashes: int, tier: Tier = Tier.GPU) -> BlockOp:
    return BlockOp(tuple(hashes), tier, -1)


async def test_implements_protocol(index: KVIndex) -> None:
    assert isinstance(index, KVIndex)


async def test_same_hash_stored_twice_needs_two_removes(index: KVIndex) -> None:
    # vllm-contract.md §9: two physical copies of one hash, each evicted on its own.
    await index.apply(G, "a", [stored(1, 2, 3), stored(3)])
    await index.apply(G, "a", [removed(3)])
    assert await index.lookup(G, [1, 2, 3]) == {"a": ReplicaMatch(gpu=3)}
    await index.apply(G, "a", [removed(3)])
    assert await index.lookup(G, [1, 2, 3]) == {"a": ReplicaMatch(gpu=2)}


async def test_removing_absent_hash_is_a_noop(index: KVIndex) -> None:
    await index.apply(G, "a", [stored(1, 2)])
    await index.apply(G, "a", [removed(2), removed(2), removed(77)])
    await index.apply(G, "a", [stored(2)])
    assert await index.lookup(G, [1, 2]) == {"a": ReplicaMatch(gpu=2)}


async def test_lookup_stops_at_first_miss_per_replica(index: KVIndex) -> None:
    await index.apply(G, "a", [stored(1, 2, 4)])  # 3 missing: 4 must not count
    await index.apply(G, "b", [stored(1, 2, 3, 4)])
    await index.apply(G, "c", [stored(2, 3)])  # no first block: no match at all
    got = await index.lookup(G, [1, 2, 3, 4])
    assert got["a"] == ReplicaMatch(gpu=2)
    assert got["b"] == ReplicaMatch(gpu=4)
    assert got.get("c", ReplicaMatch()).blocks == 0


async def test_long_chains_with_runs_of_equal_holders(index: KVIndex) -> None:
    """Long runs of blocks with the same holders (the Redis lookup reuses the previous block's answer
    when the stored value is the same), broken by a tier change, a hole and a replica dropping out."""
    chain = list(range(1000, 1200))
    await index.apply(G, "a", [stored(*chain)])
    await index.apply(G, "b", [stored(*chain[:50]), stored(*chain[50:80], tier=Tier.CPU), stored(*chain[80:])])
    await index.apply(G, "c", [stored(*chain[:10]), stored(*chain[11:])])  # a hole at block 10
    got = await index.lookup(G, chain)
    assert got["a"] == ReplicaMatch(gpu=200)
    assert got["b"] == ReplicaMatch(gpu=50 + 120, cpu=30)
    assert got["c"] == ReplicaMatch(gpu=10)
    assert (await index.lookup(G, chain[11:]))["c"] == ReplicaMatch(gpu=189)


async def test_tiers_counted_by_fastest_holder(index: KVIndex) -> None:
    await index.apply(G, "a", [stored(1, 2), stored(2, 3, tier=Tier.CPU), stored(4, tier=Tier.STORAGE)])
    assert await index.lookup(G, [1, 2, 3, 4]) == {"a": ReplicaMatch(gpu=2, cpu=1, storage=1)}
    # Evicting the GPU copy of 2 leaves the CPU copy: still matched, on CPU now.
    await index.apply(G, "a", [removed(2)])
    assert await index.lookup(G, [1, 2, 3, 4]) == {"a": ReplicaMatch(gpu=1, cpu=2, storage=1)}
    # A removal on one tier does not touch another tier's count.
    await index.apply(G, "a", [removed(4, tier=Tier.GPU)])
    assert (await index.lookup(G, [1, 2, 3, 4]))["a"].storage == 1


async def test_purge_drops_one_replica_only(index: KVIndex) -> None:
    await index.apply(G, "a", [stored(*range(1, 51))])
    await index.apply(G, "b", [stored(*range(1, 11))])
    await index.apply("other", "a", [stored(1, 2)])
    assert await index.purge_replica(G, "a") == 50
    assert await index.lookup(G, list(range(1, 51))) == {"b": ReplicaMatch(gpu=10)}
    assert await index.lookup("other", [1, 2]) == {"a": ReplicaMatch(gpu=2)}
    assert await index.purge_replica(G, "a") == 0
    assert await index.size(G) == 10


async def test_groups_are_isolated_and_replica_filter(index: KVIndex) -> None:
    await index.apply(G, "a", [stored(1, 2)])
    await index.apply(G, "b", [stored(1)])
    await index.apply("g2", "z", [stored(1, 2)])
    assert set(await index.lookup(G, [1, 2])) == {"a", "b"}
    assert await index.lookup(G, [1, 2], replicas=["b", "nope"]) == {"b": ReplicaMatch(gpu=1)}
    assert await index.size() == 5
    assert await index.size("g2") == 2
    assert await index.replicas(G) == ["a", "b"]


async def test_heartbeat_expiry_purges(index: KVIndex) -> None:
    await index.apply(G, "a", [stored(1, 2)])
    await index.apply(G, "b", [stored(1, 2)])
    await index.heartbeat(G, "a", ttl_s=0.2)
    await index.heartbeat(G, "b", ttl_s=30)
    await index.heartbeat(G, "idle", ttl_s=30)  # alive without entries: still listed
    assert await index.replicas(G) == ["a", "b", "idle"]
    await asyncio.sleep(0.3)
    assert await index.expire() == [(G, "a")]
    assert await index.lookup(G, [1, 2]) == {"b": ReplicaMatch(gpu=2)}
    assert await index.replicas(G) == ["b", "idle"]


async def test_random_ops_agree_with_reference_model(index: KVIndex) -> None:
    """Random stores/removes/purges on 3 replicas vs. a dict-of-Counters reference."""
    rng = random.Random(7)
    ref: dict[str, dict[tuple[int, Tier], int]] = {r: {} for r in "abc"}
    universe = list(range(1, 40))
    for _ in range(400):
        r = rng.choice("abc")
        roll = rng.random()
        if roll < 0.01:
            await index.purge_replica(G, r)
            ref[r].clear()
            continue
        hashes = rng.sample(universe, rng.randint(1, 5))
        tier = rng.choice([Tier.GPU, Tier.GPU, Tier.CPU, Tier.STORAGE])
        delta = 1 if roll < 0.6 else -1
        await index.apply(G, r, [BlockOp(tuple(hashes), tier, delta)])
        for h in hashes:
            n = ref[r].get((h, tier), 0) + delta
            ref[r][(h, tier)] = max(n, 0)
        if rng.random() < 0.2:
            chain = rng.sample(universe, 8)
            got = await index.lookup(G, chain)
            for rep in "abc":
                want = [0, 0, 0]
                for h in chain:
                    tiers = [t for t in Tier if ref[rep].get((h, t), 0) > 0]
                    if not tiers:
                        break
                    want[min(tiers)] += 1
                assert got.get(rep, ReplicaMatch()) == ReplicaMatch(*want) or (
                    sum(want) == 0 and rep not in got
                )
