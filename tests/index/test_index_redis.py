"""Redis backend of the KV index, against a real ``redis-server``: refcounts, one-round-trip
lookups, HA dedupe of event batches, several batches per script call, hash tags, heartbeats, auth and
database from the URL."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis.crc import key_slot

from litellm_kv.index.base import BlockOp, ReplicaMatch, Tier
from litellm_kv.index.redis import (
    CLEAR,
    LOST,
    SKIPPED,
    ApplyOp,
    ApplyStatus,
    BatchOps,
    RedisIndex,
    RootStored,
    group_key_prefix,
    group_tag,
)
from tools.harness.procs import ManagedProcess, free_port
from tools.harness.redis_server import RedisServer

pytestmark = pytest.mark.redis

G = "llama/3.1-8b"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-index-test")
    yield srv
    srv.stop()


@pytest.fixture
async def index(server: RedisServer) -> AsyncIterator[RedisIndex]:
    server.client().flushall()
    idx = RedisIndex(server.url)
    yield idx
    await idx.close()


def stored(*hashes: int, tier: Tier = Tier.GPU) -> BlockOp:
    return BlockOp(tuple(hashes), tier, +1)


def removed(*hashes: int, tier: Tier = Tier.GPU) -> BlockOp:
    return BlockOp(tuple(hashes), tier, -1)


async def test_refcount_per_copy(index: RedisIndex) -> None:
    # vLLM can hold two physical copies of one hash; each is evicted on its own.
    await index.apply(G, "a", [stored(1, 2, 3), stored(3)])
    await index.apply(G, "a", [removed(3)])
    assert await index.lookup(G, [1, 2, 3]) == {"a": ReplicaMatch(gpu=3)}
    await index.apply(G, "a", [removed(3), removed(3), removed(99)])  # extra removals: no-ops
    assert await index.lookup(G, [1, 2, 3]) == {"a": ReplicaMatch(gpu=2)}
    await index.apply(G, "a", [stored(3)])
    assert await index.lookup(G, [1, 2, 3]) == {"a": ReplicaMatch(gpu=3)}
    assert await index.size(G) == 3


async def test_root_store_of_a_held_chain_is_a_reannouncement(index: RedisIndex) -> None:
    """kv_cache_report_mode=full: a hit re-emits BlockStored(parent None, from block 0). Counting
    it would keep blocks alive in the index after the engine evicted its only copy."""
    res = await index.apply_batch(G, "a", [RootStored(stored(1, 2, 3))], stream="a#0", seq=0, ts=1.0)
    assert (res.touched, res.reannounced) == (3, 0)  # a fresh chain from block 0: real store
    # The engine hits blocks 1, 2 (re-announced) and stores 4 after them, in one batch.
    res = await index.apply_batch(G, "a", [RootStored(stored(1, 2)), stored(4)], stream="a#0", seq=1, ts=2.0)
    assert (res.touched, res.reannounced) == (1, 1)
    # Evicting the single copy of 2 must end the match at block 1.
    await index.apply_batch(G, "a", [removed(2)], stream="a#0", seq=2, ts=3.0)
    assert await index.lookup(G, [1, 2, 3, 4]) == {"a": ReplicaMatch(gpu=1)}
    # A root store of a chain only partly held is a real store (2 recomputed): every hash counts.
    res = await index.apply_batch(G, "a", [RootStored(stored(1, 2))], stream="a#0", seq=3, ts=4.0)
    assert (res.touched, res.reannounced) == (2, 0)
    await index.apply_batch(G, "a", [removed(1)], stream="a#0", seq=4, ts=5.0)
    assert await index.lookup(G, [1, 2]) == {"a": ReplicaMatch(gpu=2)}  # 1 was stored twice
    # Earlier ops of the same batch count: stored then re-announced in one batch is one copy.
    await index.apply_batch(G, "a", [stored(7, 8), RootStored(stored(7, 8))], stream="a#0", seq=5, ts=6.0)
    await index.apply_batch(G, "a", [removed(8)], stream="a#0", seq=6, ts=7.0)
    assert await index.lookup(G, [7, 8]) == {"a": ReplicaMatch(gpu=1)}


async def test_root_store_checks_the_replica_and_tier(index: RedisIndex) -> None:
    await index.apply(G, "b", [stored(1, 2)])  # another replica's blocks do not make it a repeat
    await index.apply(G, "a", [stored(1, 2, tier=Tier.CPU)])
    # A GPU root store while the chain is only on CPU (e.g. loaded back from the offload tier) is
    # a new GPU copy.
    res = await index.apply_batch(G, "a", [RootStored(stored(1, 2))])
    assert (res.touched, res.reannounced) == (2, 0)
    res = await index.apply_batch(G, "a", [RootStored(stored(1, 2))])
    assert (res.touched, res.reannounced) == (0, 1)
    # A duplicate batch (HA) changes nothing and reports nothing.
    await index.apply_batch(G, "a", [stored(5)], stream="a#0", seq=0, ts=1.0)
    dup = await index.apply_batch(G, "a", [RootStored(stored(9))], stream="a#0", seq=0, ts=1.0)
    assert (dup.status, dup.touched, dup.reannounced) == (ApplyStatus.DUPLICATE, 0, 0)
    with pytest.raises(ValueError):
        await index.apply_batch(G, "a", [RootStored(removed(1))])


async def test_lookup_walks_chain_per_replica_and_splits_tiers(index: RedisIndex) -> None:
    await index.apply(G, "a", [stored(1, 2, 3, 4)])
    await index.apply(G, "b", [stored(1, 2), stored(2, 3, tier=Tier.CPU), stored(5)])
    await index.apply(G, "c", [stored(2, 3, 4)])  # no block 0: no match
    got = await index.lookup(G, [1, 2, 3, 4, 5])
    assert got["a"] == ReplicaMatch(gpu=4)
    assert got["b"] == ReplicaMatch(gpu=2, cpu=1)  # block 2 on GPU and CPU counts as GPU
    assert "c" not in got or got["c"].blocks == 0
    assert await index.lookup(G, [1, 2, 3], replicas=["b"]) == {"b": ReplicaMatch(gpu=2, cpu=1)}
    assert await index.lookup(G, [1, 2], replicas=["nobody"]) == {}
    assert await index.lookup("other", [1, 2]) == {}


async def test_lookup_long_prompt_crosses_chunks_and_stops_at_miss(index: RedisIndex) -> None:
    rng = random.Random(7)
    chain = [rng.getrandbits(64) for _ in range(1000)]
    await index.apply(G, "a", [stored(*chain)])
    await index.apply(G, "b", [stored(*chain[:130]), stored(*chain[131:])])  # hole at 130
    got = await index.lookup(G, chain)
    assert got == {"a": ReplicaMatch(gpu=1000), "b": ReplicaMatch(gpu=130)}


async def test_lookup_is_one_round_trip(index: RedisIndex, server: RedisServer) -> None:
    rng = random.Random(1)
    chain = [rng.getrandbits(64) for _ in range(256)]
    await index.apply(G, "a", [stored(*chain)])
    await index.lookup(G, chain)  # script cached on the server
    r = server.client()
    r.config_resetstat()
    before = index.round_trips
    assert await index.lookup(G, chain) == {"a": ReplicaMatch(gpu=256)}
    stats = r.info("commandstats")
    assert index.round_trips - before == 1
    client_calls = {k: v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")}
    assert client_calls == {"cmdstat_evalsha": 1}


async def test_purge_in_one_step_and_size(index: RedisIndex) -> None:
    await index.apply(G, "a", [stored(1, 2, 3), stored(3, tier=Tier.CPU)])
    await index.apply(G, "b", [stored(1, 2)])
    assert await index.size(G) == 5
    assert await index.purge_replica(G, "a") == 3
    assert await index.lookup(G, [1, 2, 3]) == {"b": ReplicaMatch(gpu=2)}
    assert await index.size(G) == 2
    assert await index.replicas(G) == ["b"]
    assert await index.purge_replica(G, "unknown") == 0


async def test_purge_retires_at_once_and_sweeps_in_small_steps(server: RedisServer) -> None:
    """A purge must not block Redis for the replica's whole cache: it retires the replica's id in
    O(1) (lookups ignore it at once, the replica's next write gets a fresh id) and the entries are
    stripped in bounded steps. The monolithic strip (the old purge) is timed on an identical
    population in the same run for comparison."""
    server.client().flushall()
    index = RedisIndex(server.url, auto_sweep=False)
    raw = server.client()
    n = 100_000
    rng = random.Random(5)
    chains = {name: [rng.getrandbits(64) for _ in range(n)] for name in ("a", "c")}
    try:
        for name, chain in chains.items():
            for i in range(0, n, 20_000):
                await index.apply(G, name, [stored(*chain[i:i + 20_000])])
        await index.apply(G, "b", [stored(*chains["a"][:10])])
        blocks = f"lkv:{{{group_tag(G)}}}:blocks"
        retired = f"lkv:{{{group_tag(G)}}}:retired"
        before = await index.lookup(G, chains["a"][:10])
        assert before == {"a": ReplicaMatch(gpu=10), "b": ReplicaMatch(gpu=10)}

        t0 = asyncio.get_running_loop().time()
        assert await index.purge_replica(G, "a") == n
        retire_s = asyncio.get_running_loop().time() - t0
        # Entries still there, already invisible; the name lives on under a fresh id.
        assert raw.hlen(blocks) == 2 * n and raw.scard(retired) == 1
        assert await index.lookup(G, chains["a"][:10]) == {"b": ReplicaMatch(gpu=10)}
        assert await index.size(G) == n + 10 and await index.replicas(G) == ["b", "c"]
        await index.apply(G, "a", [stored(*chains["a"][:3])])
        assert (await index.lookup(G, chains["a"][:10]))["a"] == ReplicaMatch(gpu=3)

        # The server's own time per script (how long it blocks others); the threshold leaves out the
        # scripts' inner commands (microseconds each), which Redis 7 logs too.
        raw.config_set("slowlog-log-slower-than", 300)
        raw.config_set("slowlog-max-len", 1000)
        raw.slowlog_reset()
        while True:
            done, left = await index.sweep_once(G, 1000)
            assert done <= 1000
            if not left:
                break
        steps = [e["duration"] / 1e6 for e in raw.slowlog_get(1000) if e["command"].startswith(b"EVALSHA")]
        assert raw.hlen(blocks) == n + 10 and raw.scard(retired) == 0  # c's chain, and a/b's 10 blocks
        assert await index.lookup(G, chains["a"][:10]) == {"a": ReplicaMatch(gpu=3), "b": ReplicaMatch(gpu=10)}

        # The old purge's cost: strip a whole replica in one script.
        assert await index.purge_replica(G, "c") == n
        raw.slowlog_reset()
        assert await index.sweep_once(G, n) == (n, 0)
        whole_s = max(e["duration"] for e in raw.slowlog_get(10) if e["command"].startswith(b"EVALSHA")) / 1e6
        raw.config_set("slowlog-log-slower-than", 10_000)
        median = sorted(steps)[len(steps) // 2]
        print(f"\n[purge {n} entries] retire {retire_s * 1e3:.2f} ms (client-side, incl. the round trip); "
              f"sweep in {len(steps)} steps of 1000 entries, Redis busy median {median * 1e3:.1f} ms, longest "
              f"{max(steps) * 1e3:.1f} ms; one-script strip (old purge) {whole_s * 1e3:.0f} ms = "
              f"{whole_s / max(steps):.0f}x the longest step")
        assert len(steps) >= n // 2000 and max(steps) < whole_s / 10
    finally:
        await index.close()


async def test_purges_are_swept_in_the_background(index: RedisIndex, server: RedisServer) -> None:
    await index.apply_batch(G, "a", [stored(*range(1, 2001))], stream="a#0", seq=0, ts=1.0)
    await index.apply(G, "b", [stored(*range(1, 6))])
    await index.purge_replica(G, "b")
    await index.apply_batch(G, "a", [CLEAR, stored(7)], stream="a#0", seq=1, ts=2.0)  # purge mid-batch
    await index.wait_sweeps()
    raw = server.client()
    assert raw.scard(f"lkv:{{{group_tag(G)}}}:retired") == 0
    assert raw.hkeys(f"lkv:{{{group_tag(G)}}}:blocks") == [(7).to_bytes(8, "big")]
    assert await index.lookup(G, [7]) == {"a": ReplicaMatch(gpu=1)}


async def test_heartbeat_expiry_purges(index: RedisIndex) -> None:
    await index.apply(G, "a", [stored(1)])
    await index.apply(G, "b", [stored(1)])
    await index.heartbeat(G, "a", 0.2)
    await index.heartbeat(G, "b", 30)
    await index.heartbeat(G, "idle", 30)
    assert await index.replicas(G) == ["a", "b", "idle"]
    assert await index.expire() == []
    await asyncio.sleep(0.3)
    assert await index.expire() == [(G, "a")]
    assert await index.lookup(G, [1]) == {"b": ReplicaMatch(gpu=1)}
    assert await index.replicas(G) == ["b", "idle"]


async def test_two_writers_apply_each_batch_once(server: RedisServer) -> None:
    """Two indexers receive the same stream; each batch must count once, whatever the order."""
    server.client().flushall()
    one, two = RedisIndex(server.url), RedisIndex(server.url)
    try:
        batches = [
            (0, 10.0, [stored(1, 2)]),
            (1, 10.1, [stored(2)]),  # second copy of 2
            (2, 10.2, [removed(2)]),
            (3, 10.3, [stored(3)]),
        ]
        for seq, ts, ops in batches:
            first, second = (one, two) if seq % 2 else (two, one)
            r1 = await first.apply_batch(G, "a", ops, stream="a#0", seq=seq, ts=ts)
            r2 = await second.apply_batch(G, "a", ops, stream="a#0", seq=seq, ts=ts)
            assert (r1.status, r2.status) == (ApplyStatus.APPLIED, ApplyStatus.DUPLICATE)
        assert await one.lookup(G, [1, 2, 3]) == {"a": ReplicaMatch(gpu=3)}
        await one.apply_batch(G, "a", [removed(2)], stream="a#0", seq=4, ts=10.4)
        # Both copies of 2 are gone now; had batches been applied twice, 2 would still count.
        assert await two.lookup(G, [1, 2, 3]) == {"a": ReplicaMatch(gpu=1)}
        # A batch ahead of Redis is a gap: nothing applied, replay from last + 1.
        gap = await two.apply_batch(G, "a", [stored(9)], stream="a#0", seq=7, ts=10.7)
        assert (gap.status, gap.last_seq) == (ApplyStatus.GAP, 4)
        assert await two.stream_state(G, "a#0") == (4, 10.4)
    finally:
        await one.close()
        await two.close()


async def test_a_stream_is_whole_only_while_followed_from_the_engines_first_batch(index: RedisIndex) -> None:
    """The apply script marks a stream whole (the proxies then stop asking the engines to re-announce their hits)
    from the engine's first batch or an AllBlocksCleared, and unmarks it at anything that may leave a held block
    out of the index: lost batches, a lost batch's events, a skipped store."""
    async def whole() -> dict[str, bool]:
        return await index.whole_streams(G)

    await index.apply_batch(G, "a", [stored(1)], stream="a#0", seq=0, ts=1.0)
    await index.apply_batch(G, "a", [stored(2)], stream="a#0", seq=1, ts=1.1)
    assert await whole() == {"a#0": True}
    assert await index.stream_state(G, "a#0") == (1, 1.1)  # the mark does not disturb the position
    dup = await index.apply_batch(G, "a", [stored(2)], stream="a#0", seq=1, ts=1.1)
    assert dup.status is ApplyStatus.DUPLICATE and await whole() == {"a#0": True}
    await index.apply_batch(G, "a", [stored(3), SKIPPED], stream="a#0", seq=2, ts=1.2)
    assert await whole() == {"a#0": False}
    await index.apply_batch(G, "a", [CLEAR, stored(4)], stream="a#0", seq=3, ts=1.3)
    assert await whole() == {"a#0": True}  # the engine holds nothing from before the clear
    await index.apply_batch(G, "a", [LOST], stream="a#0", seq=4, ts=1.4)
    assert await whole() == {"a#0": False}
    assert await index.lookup(G, [4]) == {}  # LOST purges, as CLEAR does
    # An engine restart: its first batch again.
    restart = await index.apply_batch(G, "a", [stored(5)], stream="a#0", seq=0, ts=2.0)
    assert restart.status is ApplyStatus.RESTART and await whole() == {"a#0": True}
    # Batches lost for good: applied with force, the replica re-learnt from there, and not whole.
    await index.apply_batch(G, "a", [stored(6)], stream="a#0", seq=9, ts=2.9, force=True)
    assert await whole() == {"a#0": False}
    # A stream first heard after its start (the replay no longer reaches back) is not whole.
    await index.apply_batch(G, "b", [stored(7)], stream="b#0", seq=3, ts=3.0, force=True)
    assert (await whole())["b#0"] is False
    assert await index.stream_state(G, "b#0") == (3, 3.0)


def _random_ops(rng: random.Random, universe: list[int]) -> list[ApplyOp]:
    """1-6 ops touching few hashes (so ops of one batch and of one call meet): stores with repeated hashes,
    removals of held and absent hashes, root stores, tiers, now and then an AllBlocksCleared."""
    ops: list[ApplyOp] = []
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        tier = rng.choice([Tier.GPU, Tier.GPU, Tier.GPU, Tier.CPU, Tier.STORAGE])
        hashes = tuple(rng.choices(universe, k=rng.randint(1, 5)))
        if roll < 0.02:
            ops.append(CLEAR)
        elif roll < 0.45:
            ops.append(BlockOp(hashes, tier, 1))
        elif roll < 0.6:
            ops.append(RootStored(BlockOp(hashes, tier, 1)))
        else:
            ops.append(BlockOp(hashes, tier, -1))
    return ops


def _model_apply(ref: dict[tuple[int, Tier], int], ops: list[ApplyOp]) -> None:
    """The index rules for one replica, one op and one hash at a time (base.py, RootStored)."""
    for item in ops:
        if isinstance(item, str):
            ref.clear()
            continue
        if isinstance(item, RootStored):
            op = item.op
            if all(ref.get((h, op.tier), 0) > 0 for h in op.hashes):
                continue  # a re-announcement of a chain held on that tier
        else:
            op = item
        for h in op.hashes:
            ref[(h, op.tier)] = max(ref.get((h, op.tier), 0) + op.delta, 0)


def _group_state(server: RedisServer, group: str) -> dict[str, object]:
    """Everything a group holds in Redis, replica ids resolved to names (two groups compare equal when they
    hold the same facts), checking that each replica's reverse set is exactly the hashes it has entries for."""
    c = server.client()
    base = group_key_prefix(group)
    names = {k.decode(): v.decode() for k, v in c.hgetall(base + "names").items() if k != b"#next"}
    held: dict[str, dict[bytes, dict[int, int]]] = {}
    for field, value in c.hgetall(base + "blocks").items():
        for entry in value.decode().split(";")[1:]:
            code, count = map(int, entry.split(":"))
            rid = str(code // 4)
            held.setdefault(rid, {}).setdefault(field, {})[code % 4] = count
    for rid, name in names.items():
        assert c.smembers(f"{base}rev:{rid}") == set(held.get(rid, {})), name
    retired = {m.decode() for m in c.smembers(base + "retired")}
    return {
        "live": {names[rid]: entries for rid, entries in held.items() if rid in names},
        "retired_entries": sum(len(e) for rid, e in held.items() if rid in retired),
        "streams": c.hgetall(base + "streams"),
    }


async def test_gathered_writes_agree_with_a_reference_model(index: RedisIndex, server: RedisServer) -> None:
    """Several batches per script call, ops of a batch touching the same hashes: each hash's count is what
    applying the ops one hash at a time gives, and the reverse set stays exact."""
    rng = random.Random(5)
    universe = list(range(1, 25))
    ref: dict[tuple[int, Tier], int] = {}
    seq = 0
    for _ in range(40):
        specs = []
        for _ in range(rng.randint(1, 8)):
            ops = _random_ops(rng, universe)
            _model_apply(ref, ops)
            specs.append(BatchOps(ops, "a#0", seq, float(seq)))
            seq += 1
        results = await index.apply_batches(G, "a", specs, max_blocks=rng.choice([4, 16, 1024]))
        assert [r.status for r in results] == [ApplyStatus.APPLIED] * len(specs)
        assert results[-1].last_seq == seq - 1
        chain = rng.sample(universe, 6)
        want = [0, 0, 0]
        for h in chain:
            tiers = [t for t in Tier if ref.get((h, t), 0) > 0]
            if not tiers:
                break
            want[min(tiers)] += 1
        assert (await index.lookup(G, chain)).get("a", ReplicaMatch()) == ReplicaMatch(*want)
    await index.wait_sweeps()
    state = _group_state(server, G)
    want_entries = {h.to_bytes(8, "big"): {} for (h, _t), n in ref.items() if n > 0}
    for (h, t), n in ref.items():
        if n > 0:
            want_entries[h.to_bytes(8, "big")][int(t)] = n
    assert state["live"] == ({"a": want_entries} if want_entries else {})
    assert state["retired_entries"] == 0


async def test_batches_in_one_call_do_what_one_call_each_does(server: RedisServer) -> None:
    """The same stream of batches (duplicates, gaps, an engine restart, forced resyncs, AllBlocksCleared)
    applied in a few calls and in one call per batch: the same results and the same contents in Redis."""
    server.client().flushall()
    rng = random.Random(9)
    universe = list(range(1, 20))
    specs: list[BatchOps] = []
    seq, ts = 0, 100.0
    for _ in range(120):
        roll = rng.random()
        ops = _random_ops(rng, universe)
        if roll < 0.08 and specs:
            specs.append(rng.choice(specs))  # a duplicate (another indexer was faster)
            continue
        if roll < 0.12:
            seq += 2  # a gap
        elif roll < 0.14:
            seq = rng.randint(0, 3)  # a new engine lifetime: lower seq, later time
        ts += 1.0
        specs.append(BatchOps(ops, "a#0", seq, ts, force=rng.random() < 0.05))
        seq += 1
    gathered, single = RedisIndex(server.url, auto_sweep=False), RedisIndex(server.url, auto_sweep=False)
    try:
        got = await gathered.apply_batches("g1", "a", specs, max_blocks=64)
        want = [await single.apply_batch("g2", "a", b.ops, stream=b.stream, seq=b.seq, ts=b.ts, force=b.force)
                for b in specs]
        assert got == want
        assert {r.status for r in want} >= {ApplyStatus.APPLIED, ApplyStatus.DUPLICATE, ApplyStatus.GAP,
                                            ApplyStatus.RESTART}
        assert gathered.round_trips < single.round_trips / 4
        assert _group_state(server, "g1") == _group_state(server, "g2")
    finally:
        await gathered.close()
        await single.close()


async def test_two_writers_sending_overlapping_calls_apply_each_batch_once(server: RedisServer) -> None:
    """Two indexers, each sending the batches it has in calls of its own size, overlapping: every batch
    counts once (the contents equal one writer's), the other's copies come back as duplicates."""
    server.client().flushall()
    rng = random.Random(3)
    universe = list(range(1, 20))
    specs = [BatchOps(_random_ops(rng, universe), "a#0", seq, 10.0 + seq) for seq in range(30)]
    one, two, ref = (RedisIndex(server.url, auto_sweep=False) for _ in range(3))
    try:
        first = await one.apply_batches("g1", "a", specs[:10])
        second = await two.apply_batches("g1", "a", specs[:20], max_blocks=8)
        third = await one.apply_batches("g1", "a", specs[5:])
        assert [r.status for r in first] == [ApplyStatus.APPLIED] * 10
        assert [r.status for r in second] == [ApplyStatus.DUPLICATE] * 10 + [ApplyStatus.APPLIED] * 10
        assert [r.status for r in third] == [ApplyStatus.DUPLICATE] * 15 + [ApplyStatus.APPLIED] * 10
        await ref.apply_batches("g2", "a", specs)
        assert _group_state(server, "g1") == _group_state(server, "g2")
    finally:
        for idx in (one, two, ref):
            await idx.close()


async def test_engine_restart_detected_by_seq_and_time(index: RedisIndex) -> None:
    await index.apply_batch(G, "a", [stored(1, 2)], stream="a#0", seq=0, ts=100.0)
    await index.apply_batch(G, "a", [stored(3)], stream="a#0", seq=1, ts=100.5)
    # Same seq again but later: a new engine lifetime; the old blocks are gone.
    res = await index.apply_batch(G, "a", [stored(7)], stream="a#0", seq=0, ts=200.0)
    assert res.status is ApplyStatus.RESTART and res.purged == 3
    assert await index.lookup(G, [1, 2]) == {}
    assert await index.lookup(G, [7]) == {"a": ReplicaMatch(gpu=1)}
    for seq in range(1, 10):
        await index.apply_batch(G, "a", [stored(7)], stream="a#0", seq=seq, ts=200.0 + seq)
    # Another lifetime, first seen at seq 5 (< 9, later ts): purge and ask for replay from 0.
    res = await index.apply_batch(G, "a", [stored(8)], stream="a#0", seq=5, ts=300.0)
    assert (res.status, res.last_seq, res.purged) == (ApplyStatus.GAP, -1, 1)
    assert await index.lookup(G, [7]) == {}
    ok = await index.apply_batch(G, "a", [stored(7)], stream="a#0", seq=0, ts=299.0)
    assert ok.status is ApplyStatus.APPLIED
    assert await index.lookup(G, [7]) == {"a": ReplicaMatch(gpu=1)}


async def test_forced_resync_after_lost_batches_purges_first(index: RedisIndex) -> None:
    await index.apply_batch(G, "a", [stored(1, 2)], stream="a#0", seq=0, ts=1.0)
    res = await index.apply_batch(G, "a", [stored(5)], stream="a#0", seq=9, ts=9.0, force=True)
    assert res.status is ApplyStatus.RESTART and res.last_seq == 9
    assert await index.lookup(G, [1]) == {} and await index.lookup(G, [5]) == {"a": ReplicaMatch(gpu=1)}
    # AllBlocksCleared inside a batch purges at that point of the batch.
    await index.apply_batch(G, "a", [stored(6), CLEAR, stored(1)], stream="a#0", seq=10, ts=10.0)
    assert await index.lookup(G, [6]) == {} and await index.lookup(G, [1]) == {"a": ReplicaMatch(gpu=1)}


async def test_fresh_stream_must_start_at_zero_unless_forced(index: RedisIndex) -> None:
    res = await index.apply_batch(G, "a", [stored(1)], stream="a#0", seq=3, ts=1.0)
    assert (res.status, res.last_seq) == (ApplyStatus.GAP, -1)
    assert await index.size(G) == 0


async def test_keys_share_the_group_hash_tag(index: RedisIndex, server: RedisServer) -> None:
    group = "team{x}/model"
    await index.apply_batch(group, "a", [stored(1, 2)], stream="a#0", seq=0, ts=1.0)
    await index.heartbeat(group, "a", 10)
    keys = [k.decode() if isinstance(k, bytes) else str(k) for k in server.client().keys("lkv:{*")]
    assert len(keys) >= 5
    assert all(f"{{{group_tag(group)}}}" in k for k in keys)
    assert len({key_slot(k.encode()) for k in keys}) == 1


async def test_readers_in_other_processes_see_the_same_view(server: RedisServer) -> None:
    server.client().flushall()
    writer, reader1, reader2 = RedisIndex(server.url), RedisIndex(server.url), RedisIndex(server.url)
    try:
        rng = random.Random(3)
        chain = [rng.getrandbits(64) for _ in range(50)]
        await writer.apply(G, "a", [stored(*chain[:40])])
        await writer.apply(G, "b", [stored(*chain[:10], tier=Tier.CPU)])
        a = await reader1.lookup(G, chain)
        b = await reader2.lookup(G, chain)
        assert a == b == {"a": ReplicaMatch(gpu=40), "b": ReplicaMatch(cpu=10)}
    finally:
        for idx in (writer, reader1, reader2):
            await idx.close()


async def test_password_and_database_from_url() -> None:
    exe = shutil.which("redis-server")
    assert exe is not None
    port = free_port()
    proc = ManagedProcess(
        "redis-auth-test",
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", tempfile.mkdtemp(prefix="litellm-kv-redis-"), "--requirepass", "s3cret"],
    )
    try:
        proc.wait_until(lambda: bool(redis.Redis(port=port, password="s3cret").ping()), 20, "redis ping")
        idx = RedisIndex(f"redis://:s3cret@127.0.0.1:{port}/5")
        await idx.apply(G, "a", [stored(1)])
        assert await idx.lookup(G, [1]) == {"a": ReplicaMatch(gpu=1)}
        await idx.close()
        raw = redis.Redis(port=port, password="s3cret", db=5)
        assert raw.exists(f"lkv:{{{group_tag(G)}}}:blocks")
        assert not redis.Redis(port=port, password="s3cret", db=0).keys("lkv:*")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, password="wrong").ping()
    finally:
        proc.stop()


def test_pack_is_big_endian_u64_on_both_paths() -> None:
    """The fields the Lua scripts read: 8 big-endian bytes per hash (the C path), and the same bytes
    from the mod-2^64 fallback for values outside 0..2^64-1."""
    from litellm_kv.index.redis import _pack

    edge = [0, 1, 255, 256, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 0x0102030405060708]
    assert _pack(edge) == b"".join(h.to_bytes(8, "big") for h in edge)
    assert _pack([]) == b""
    assert _pack([-1, 1 << 64, 5]) == b"\xff" * 8 + b"\x00" * 8 + (5).to_bytes(8, "big")
