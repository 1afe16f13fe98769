"""Router-tracked load: in-process tracker, and the Redis tracker shared by proxies (real redis-server; the
shared tests run over one server, a Redis Cluster of 3 masters + 3 replicas, and a Sentinel-managed master)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aredis

from litellm_kv.config import RedisSettings
from litellm_kv.redis_client import RedisClient, RedisUse, connect
from litellm_kv.routing.load import InMemoryLoadTracker, LoadSettings, RedisLoadTracker, TrackedLoad
from tools.harness.redis_server import RedisServer

Target = str | RedisSettings


async def test_in_memory_lifecycle_and_recent_decay() -> None:
    now = [0.0]
    t = InMemoryLoadTracker(LoadSettings(recent_half_life_s=10.0), clock=lambda: now[0])
    await t.begin("g", "a", "r1", 1000)
    await t.begin("g", "a", "r2", 500)
    s = await t.snapshot("g", ["a", "b"])
    assert (s["a"].prefill_tokens, s["a"].prefill_requests, s["a"].decode) == (1500, 2, 0)
    assert (s["b"].prefill_tokens, s["b"].prefill_requests) == (0, 0)
    await t.first_token("r1")
    await t.first_token("r1")  # idempotent
    s = await t.snapshot("g", ["a"])
    assert (s["a"].prefill_tokens, s["a"].prefill_requests, s["a"].decode) == (500, 1, 1)
    await t.end("r1")
    await t.end("r2")
    await t.end("unknown")
    s = await t.snapshot("g", ["a"])
    assert (s["a"].prefill_tokens, s["a"].prefill_requests, s["a"].decode) == (0, 0, 0)
    # Nothing in flight, but the work sent is remembered, halving every 10 s.
    assert s["a"].recent_tokens == pytest.approx(1500)
    now[0] = 10.0
    assert (await t.snapshot("g", ["a"]))["a"].recent_tokens == pytest.approx(750)


@pytest.fixture(scope="module")
def _single_redis() -> Iterator[str]:
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=[pytest.param("single", marks=pytest.mark.redis),
                        pytest.param("cluster", marks=pytest.mark.redis),
                        pytest.param("sentinel", marks=pytest.mark.redis)])
def redis_url(request: pytest.FixtureRequest) -> Target:
    """Where the shared tests' Redis is: a URL (one server) or cluster / sentinel settings."""
    if request.param == "single":
        return str(request.getfixturevalue("_single_redis"))
    setup = request.getfixturevalue("redis_cluster" if request.param == "cluster" else "redis_sentinel")
    setup.flushall()
    return setup.settings()  # type: ignore[no-any-return]


def _client(target: Target) -> RedisClient:
    return connect(target, RedisUse.LOAD)


async def test_redis_tracker_shares_counts_between_proxies(redis_url: Target) -> None:
    c1 = _client(redis_url)
    c2 = _client(redis_url)
    p1 = RedisLoadTracker(c1, proxy_id="p1")
    p2 = RedisLoadTracker(c2, proxy_id="p2")
    try:
        await c1.flushall()
        await p1.begin("grp", "a", "x", 1000)
        await p2.begin("grp", "a", "y", 300)
        await p2.begin("grp", "b", "z", 50)
        # A proxy's own requests count at once, before anything reached Redis.
        s = await p1.snapshot("grp", ["a", "b"])
        assert (s["a"].prefill_tokens, s["b"].prefill_tokens) == (1000, 0)
        await p1.flush()
        await p2.flush()
        s = await p1.snapshot("grp", ["a", "b", "c"])
        assert (s["a"].prefill_tokens, s["b"].prefill_tokens, s["c"].prefill_tokens) == (1300, 50, 0)
        assert (s["a"].prefill_requests, s["b"].prefill_requests, s["c"].prefill_requests) == (2, 1, 0)
        assert s["a"].recent_tokens == pytest.approx(1300, rel=0.01)
        await p2.first_token("y")
        await p2.flush()
        s = await p1.snapshot("grp", ["a"])
        assert (s["a"].prefill_tokens, s["a"].prefill_requests, s["a"].decode) == (1000, 1, 1)
        await p2.end("y")
        await p1.end("x")
        await p1.flush()
        s = await p2.snapshot("grp", ["a"])
        assert (s["a"].prefill_tokens, s["a"].decode) == (0, 0)
        # Keys of one group carry the index's hash tag (one Redis Cluster slot, and the snapshot can ride
        # along with the index lookup).
        keys = sorted(k.decode() for k in await c1.keys("*"))
        assert keys == ["lkv:{grp}:load", "lkv:{grp}:proxies"]
    finally:
        await p1.close()
        await p2.close()
        await c1.aclose()
        await c2.aclose()


async def test_writes_are_off_the_request_path_and_coalesced(redis_url: Target) -> None:
    """begin/first_token/end never wait for Redis; a burst is published as a few writes of the latest
    absolute values, and a reader sees exactly the sums once they landed."""
    client = _client(redis_url)
    writer = RedisLoadTracker(client, proxy_id="w")
    reader = RedisLoadTracker(client, proxy_id="r")
    sent = 0
    real = writer._write_script

    async def counting(*args: object, **kwargs: object) -> object:
        nonlocal sent
        sent += 1
        return await real(*args, **kwargs)

    writer._write_script = counting  # type: ignore[assignment]
    try:
        await client.flushall()
        for i in range(200):
            await writer.begin("g", "ab"[i % 2], f"q{i}", 10)
        for i in range(0, 200, 4):
            await writer.first_token(f"q{i}")
        for i in range(0, 200, 8):
            await writer.end(f"q{i}")
        assert sent <= 1  # nothing awaited Redis: at most the first write was started
        await writer.flush()
        assert sent <= 4
        s = await reader.snapshot("g", ["a", "b"])
        # q0, q4, ... decode (every 4th, all on "a"); every 8th of those ended.
        assert (s["a"].prefill_tokens, s["a"].decode) == (50 * 10, 25)
        assert (s["b"].prefill_tokens, s["b"].decode) == (100 * 10, 0)
    finally:
        await writer.close()
        await reader.close()
        await client.aclose()


async def test_snapshot_rides_along_with_the_index_lookup(redis_url: Target) -> None:
    from litellm_kv.index.base import BlockOp, Tier
    from litellm_kv.index.redis import RedisIndex

    index = RedisIndex(redis_url)
    client = _client(redis_url)
    mine = RedisLoadTracker(client, proxy_id="mine")
    other = RedisLoadTracker(client, proxy_id="other")
    try:
        await client.flushall()
        await index.apply("g", "a", [BlockOp((1, 2, 3), Tier.GPU, +1)])
        await other.begin("g", "b", "o1", 700)
        await other.flush()
        await mine.begin("g", "a", "m1", 40)
        before = index.round_trips
        matches, loads = await index.lookup_riding("g", [1, 2, 3, 4], ["a", "b"], mine.snapshot_rider("g", ["a", "b"]))
        assert index.round_trips == before + 1
        assert matches["a"].blocks == 3 and "b" not in matches
        assert (loads["a"].prefill_tokens, loads["b"].prefill_tokens) == (40, 700)
        # The same answer as the lookup and the snapshot separately.
        assert matches == await index.lookup("g", [1, 2, 3, 4], ["a", "b"])
        alone = await mine.snapshot("g", ["a", "b"])
        for r in ("a", "b"):
            assert (loads[r].prefill_tokens, loads[r].decode) == (alone[r].prefill_tokens, alone[r].decode)
            assert loads[r].recent_tokens == pytest.approx(alone[r].recent_tokens, rel=1e-3)
    finally:
        await mine.close()
        await other.close()
        await index.close()
        await client.aclose()


async def test_counts_recover_after_redis_returns() -> None:
    """Writes that fail while Redis is down are retried with the values of then: no count is lost or
    doubled, and the proxy's own counts stay exact meanwhile."""
    server = RedisServer()
    client = aredis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)
    errors: list[BaseException] = []
    t = RedisLoadTracker(client, proxy_id="p", retry_s=0.1, on_error=errors.append)
    other = RedisLoadTracker(aredis.from_url(server.url), proxy_id="o")
    try:
        await t.begin("g", "a", "r1", 100)
        await t.flush()
        server.stop()
        await t.begin("g", "a", "r2", 200)
        await t.first_token("r1")
        await t.flush()
        assert errors and t.write_errors >= 1
        assert t.local_snapshot("g", ["a"])["a"].prefill_tokens == 200
        server.start()
        await client.ping()
        await t.flush()
        s = await other.snapshot("g", ["a"])
        assert (s["a"].prefill_tokens, s["a"].decode) == (200, 1)
    finally:
        await t.close()
        await other.close()
        await client.aclose()
        server.stop()


async def test_dead_proxy_counts_fade(redis_url: Target) -> None:
    client = _client(redis_url)
    dead = RedisLoadTracker(client, LoadSettings(ttl_s=0.5), proxy_id="dead")
    alive = RedisLoadTracker(client, LoadSettings(ttl_s=30.0), proxy_id="alive")
    try:
        await client.flushall()
        await dead.begin("g", "a", "r1", 4000)  # never ended: the proxy "crashes"
        await alive.begin("g", "a", "r2", 100)
        await dead.flush()
        await alive.flush()
        assert (await alive.snapshot("g", ["a"]))["a"].prefill_tokens == 4100
        await dead.close()
        await asyncio.sleep(0.7)
        await alive.heartbeat(["g"])
        assert (await alive.snapshot("g", ["a"]))["a"].prefill_tokens == 100
        # The dead proxy's fields are gone from Redis, not only ignored.
        fields = [f.decode() for f in await client.hkeys("lkv:{g}:load")]
        assert not any(f.startswith("dead|") for f in fields)
    finally:
        await alive.close()
        await client.aclose()


async def test_a_proxy_declared_dead_publishes_its_counts_again(redis_url: Target) -> None:
    """A proxy whose liveness lapsed (a long pause) and whose fields a reader deleted republishes all of
    them on its next write, not only the replica that changed."""
    client = _client(redis_url)
    slow = RedisLoadTracker(client, LoadSettings(ttl_s=0.3), proxy_id="slow")
    reader = RedisLoadTracker(client, proxy_id="reader")
    try:
        await client.flushall()
        await slow.begin("g", "a", "r1", 500)
        await slow.flush()
        await asyncio.sleep(0.5)
        assert (await reader.snapshot("g", ["a"]))["a"].prefill_tokens == 0  # expired and deleted
        await slow.begin("g", "b", "r2", 60)  # a change on another replica
        await slow.flush()
        s = await reader.snapshot("g", ["a", "b"])
        assert (s["a"].prefill_tokens, s["b"].prefill_tokens) == (500, 60)
    finally:
        await slow.close()
        await reader.close()
        await client.aclose()


def test_load_config_rejects_non_positive_times() -> None:
    from litellm_kv.config import ConfigError, parse_section

    with pytest.raises(ConfigError, match="ttl_s must be positive"):
        parse_section(LoadSettings, {"ttl_s": 0}, "kv.load")
    with pytest.raises(ConfigError, match="recent_half_life_s must be positive"):
        parse_section(LoadSettings, {"recent_half_life_s": -1.0}, "kv.load")


async def no_separate_read() -> dict[str, TrackedLoad]:
    raise AssertionError("the load must come with the lookup")


@contextlib.asynccontextmanager
async def _two_proxies(target: Target) -> AsyncIterator[tuple[Any, RedisClient, RedisLoadTracker, RedisLoadTracker]]:
    """A Redis index and the load trackers of two proxies ("mine" and "other") on one emptied Redis."""
    from litellm_kv.index.redis import RedisIndex

    index = RedisIndex(target)
    client = _client(target)
    mine = RedisLoadTracker(client, proxy_id="mine")
    other = RedisLoadTracker(client, proxy_id="other")
    try:
        await client.flushall()
        yield index, client, mine, other
    finally:
        await mine.close()
        await other.close()
        await index.close()
        await client.aclose()


async def test_shared_decision_reads_index_and_load_in_one_round_trip(redis_url: Target) -> None:
    """KVRouter in shared mode: the load rides along with the lookup (one round trip, no separate
    snapshot), another proxy's load steers the choice, and with Redis unreachable the decision is
    load-only on this proxy's own counts."""
    from litellm_kv.index.redis import RedisIndex
    from litellm_kv.routing.cost import CostModel
    from litellm_kv.routing.router import KVRouter, RoutingRequest
    from litellm_kv.routing.siblings import SiblingIndex
    from litellm_kv.vllm.hashing import BlockHasher

    hasher = BlockHasher("sha256", 16)
    tokens = list(range(300))
    replicas = ["a", "b"]
    async with _two_proxies(redis_url) as (index, _, mine, other):
        await other.begin("g", "a", "o1", 50_000)
        await other.flush()
        router = KVRouter("g", index, CostModel(seed=1), SiblingIndex(), backend="redis")
        before = index.round_trips
        res = await router.decide(RoutingRequest(tokens), hasher, replicas, no_separate_read, {},
                                  load_rider=mine.snapshot_rider("g", replicas))
        assert index.round_trips == before + 1
        assert res.replica == "b" and res.exact

        await mine.begin("g", "b", "m1", 90_000)
        down = RedisIndex("redis://127.0.0.1:1/0", socket_timeout_s=1.0)
        router = KVRouter("g", down, CostModel(seed=1), SiblingIndex(), backend="redis")
        res = await router.decide(RoutingRequest(tokens), hasher, replicas, no_separate_read, {},
                                  load_rider=mine.snapshot_rider("g", replicas))
        assert res.fallback_why == "index_unavailable" and res.replica == "a"  # away from its own 90K
        await down.close()


async def test_a_shared_decision_takes_the_round_trip_made_before_the_hook(redis_url: Target) -> None:
    """The early lookup (:mod:`litellm_kv.routing.early_lookup`): the decision takes its index answer and the
    other proxies' load without a round trip of its own, yet counts what this proxy itself sent since; an answer
    for other hashing inputs or older than the max age is not taken (the decision looks up again)."""
    import dataclasses
    import time

    from litellm_kv.index.base import BlockOp, Tier
    from litellm_kv.routing.cost import CostModel
    from litellm_kv.routing.early_lookup import EARLY_LOOKUPS, EarlyAnswer
    from litellm_kv.routing.router import KVRouter, RoutingRequest
    from litellm_kv.routing.siblings import SiblingIndex
    from litellm_kv.vllm.hashing import BlockHasher

    hasher = BlockHasher("sha256", 16)
    tokens = list(range(300))
    hashes = hasher.wire_hashes(tokens)
    replicas = ["a", "b"]

    def outcomes() -> dict[str, float]:
        return {o: EARLY_LOOKUPS.labels("g", o)._value.get() for o in ("used", "stale", "tokens_only")}

    async with _two_proxies(redis_url) as (index, _, mine, other):
        await index.apply("g", "b", [BlockOp(tuple(hashes), Tier.GPU, +1)])
        await other.begin("g", "a", "o1", 2_000)
        await other.flush()
        router = KVRouter("g", index, CostModel(seed=1), SiblingIndex(), backend="redis")
        rider = dataclasses.replace(mine.snapshot_rider("g", ()), decode=lambda raw: raw)
        matches, reply = await router.look_up_early(hashes, rider)
        assert matches["b"].blocks == len(hashes)
        answer = EarlyAnswer(tokens, hasher, None, None, hashes, matches, reply, time.monotonic())

        # This proxy sends 90K tokens to b after the early round trip: the decision counts them, and goes to a.
        await mine.begin("g", "b", "m1", 90_000)
        seen, trips = outcomes(), index.round_trips
        res = await router.decide(RoutingRequest(tokens), hasher, replicas, no_separate_read, {},
                                  load_rider=mine.snapshot_rider("g", replicas), early=answer, early_max_age_s=5.0)
        assert index.round_trips == trips  # no round trip of its own
        assert outcomes()["used"] == seen["used"] + 1
        assert res.replica == "a" and res.hit_tokens == {"b": 288}  # b's hit seen; a's queue (2K) is shorter
        await mine.end("m1")

        # Other hashing inputs, or an answer older than the max age: looked up again.
        for req, age, outcome, hits in ((RoutingRequest(tokens, cache_salt="s"), 0.0, "tokens_only", {}),
                                        (RoutingRequest(tokens), 10.0, "stale", {"b": 288})):
            old = dataclasses.replace(answer, at=time.monotonic() - age)
            seen, trips = outcomes(), index.round_trips
            res = await router.decide(req, hasher, replicas, no_separate_read, {},
                                      load_rider=mine.snapshot_rider("g", replicas), early=old, early_max_age_s=5.0)
            assert index.round_trips == trips + 1
            assert outcomes()[outcome] == seen[outcome] + 1, outcome
            assert res.hit_tokens == hits  # a salted prompt's hashes are other ones: no hit
