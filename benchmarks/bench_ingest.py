"""Ingest and lookup speed of the in-memory index, against a naive baseline in the same run.

* ingest: decode vLLM-encoded KV-event batches (msgpack, map events, 64-bit int hashes) and
  apply them (``to_block_ops`` + ``InMemoryIndex.apply_sync``), in blocks/s;
* lookup: a 1000-block chain across 8 replicas (each holding a different prefix of it);
* memory per (replica, block), measured with tracemalloc (hash ints created as decoding does).

Baseline: ``dict[hash] -> dict[replica -> count]`` with a per-replica Python walk, the obvious
way to write it.

    .venv/bin/python benchmarks/bench_ingest.py [--batches 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Sequence

import msgpack

from litellm_kv.index.base import BlockOp, ReplicaMatch, Tier
from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.vllm.events import decode_event_batch, to_block_ops

BS = 32


class NaiveIndex:
    """Per-hash dict of replica -> refcount; lookup walks each replica in Python."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, int]] = {}

    def apply(self, replica: str, ops: Sequence[BlockOp]) -> None:
        for op in ops:
            for h in op.hashes:
                holders = self.blocks.setdefault(h, {})
                n = holders.get(replica, 0) + op.delta
                if n > 0:
                    holders[replica] = n
                else:
                    holders.pop(replica, None)

    def lookup(self, hashes: Sequence[int], replicas: Sequence[str]) -> dict[str, ReplicaMatch]:
        out = {}
        for r in replicas:
            n = 0
            for h in hashes:
                if r not in self.blocks.get(h, ()):
                    break
                n += 1
            if n:
                out[r] = ReplicaMatch(gpu=n)
        return out


def make_batches(rng: random.Random, n: int) -> tuple[list[bytes], int]:
    """Batches like a busy engine's: a 4-16-block BlockStored chain plus a few 1-hash removals."""
    payloads: list[bytes] = []
    live: list[int] = []
    blocks = 0
    for _ in range(n):
        events = []
        k = rng.randint(4, 16)
        hashes = [rng.getrandbits(64) for _ in range(k)]
        events.append({
            "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": rng.getrandbits(64),
            "token_ids": [rng.randrange(50_000) for _ in range(k * BS)], "block_size": BS, "lora_id": None,
            "medium": "GPU", "lora_name": None, "extra_keys": [None] * k, "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        })
        live.extend(hashes)
        blocks += k
        for _ in range(rng.randint(0, k)):
            if live:
                h = live.pop(rng.randrange(len(live)))
                events.append({"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0})
                blocks += 1
        payloads.append(bytes(msgpack.packb([time.time(), events, 0])))
    return payloads, blocks


def bench_ingest(payloads: list[bytes], blocks: int) -> None:
    decoded = [decode_event_batch(p) for p in payloads]
    ops = [[op for ev in b.events for op in to_block_ops(ev)] for b in decoded]

    t = time.perf_counter()
    for p in payloads:
        decode_event_batch(p)
    t_decode = time.perf_counter() - t

    idx = InMemoryIndex()
    t = time.perf_counter()
    for o in ops:
        idx.apply_sync("g", "r0", o)
    t_apply = time.perf_counter() - t

    naive = NaiveIndex()
    t = time.perf_counter()
    for o in ops:
        naive.apply("r0", o)
    t_naive = time.perf_counter() - t

    idx2 = InMemoryIndex()

    async def via_protocol() -> float:
        t0 = time.perf_counter()
        for p in payloads:
            batch = decode_event_batch(p)
            await idx2.apply("g", "r0", [op for ev in batch.events for op in to_block_ops(ev)])
        return time.perf_counter() - t0

    t_total = asyncio.run(via_protocol())
    print(f"ingest: {len(payloads)} batches, {blocks} block ops")
    print(f"  decode only              {blocks / t_decode:12,.0f} blocks/s")
    print(f"  apply only   (memory)    {blocks / t_apply:12,.0f} blocks/s")
    print(f"  apply only   (naive)     {blocks / t_naive:12,.0f} blocks/s   memory/naive = {t_naive / t_apply:.2f}x")
    print(f"  decode+apply (async API) {blocks / t_total:12,.0f} blocks/s")


def bench_lookup(rng: random.Random, replicas: int = 8, chain_len: int = 1000, noise: int = 20_000) -> None:
    chain = [rng.getrandbits(64) for _ in range(chain_len)]
    names = [f"r{i}" for i in range(replicas)]
    idx = InMemoryIndex()
    naive = NaiveIndex()
    for i, r in enumerate(names):
        held = chain[: chain_len * (i + 1) // replicas]
        other = [rng.getrandbits(64) for _ in range(noise)]
        for o in ([BlockOp(tuple(held), Tier.GPU, 1)], [BlockOp(tuple(other), Tier.GPU, 1)]):
            idx.apply_sync("g", r, o)
            naive.apply(r, o)
    assert idx.lookup_sync("g", chain) == naive.lookup(chain, names)

    def timed(fn: object, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            fn()  # type: ignore[operator]
            out.append((time.perf_counter() - t) * 1e6)
        return sorted(out)

    fast = timed(lambda: idx.lookup_sync("g", chain), 2000)
    slow = timed(lambda: naive.lookup(chain, names), 300)
    miss = [rng.getrandbits(64) for _ in range(chain_len)]
    cold = timed(lambda: idx.lookup_sync("g", miss), 2000)
    p = lambda xs, q: xs[int(q * (len(xs) - 1))]  # noqa: E731
    print(f"lookup: {chain_len}-block chain, {replicas} replicas holding 1/8..8/8 of it, {noise} other blocks each")
    print(f"  memory index  p50 {p(fast, .5):8.1f} us   p99 {p(fast, .99):8.1f} us")
    print(f"  naive         p50 {p(slow, .5):8.1f} us   p99 {p(slow, .99):8.1f} us   "
          f"naive/memory = {statistics.median(slow) / statistics.median(fast):.1f}x")
    print(f"  memory index, chain held nowhere: p50 {p(cold, .5):.1f} us")


def bench_memory(rng: random.Random, n: int = 200_000, replicas: int = 2) -> None:
    payload = bytes(msgpack.packb([[rng.getrandbits(64) for _ in range(n)]]))
    gc.collect()
    tracemalloc.start()
    hashes = msgpack.unpackb(payload)[0]  # fresh int objects, as decoding creates them
    base = tracemalloc.get_traced_memory()[0]
    idx = InMemoryIndex()
    for r in range(replicas):
        idx.apply_sync("g", f"r{r}", [BlockOp(tuple(hashes), Tier.GPU, 1)])
    del hashes
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    naive = NaiveIndex()
    hashes2 = msgpack.unpackb(payload)[0]
    base2 = tracemalloc.get_traced_memory()[0]
    for r in range(replicas):
        naive.apply(f"r{r}", [BlockOp(tuple(hashes2), Tier.GPU, 1)])
    del hashes2
    gc.collect()
    used2 = tracemalloc.get_traced_memory()[0] - base2
    tracemalloc.stop()
    entries = n * replicas
    print(f"memory: {n} distinct blocks on {replicas} replicas ({entries} entries)")
    print(f"  memory index {used / entries:6.1f} bytes per (replica, block)   "
          f"(hash object counted once, shared by replicas)")
    print(f"  naive        {used2 / entries:6.1f} bytes per (replica, block)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=3000)
    args = ap.parse_args()
    rng = random.Random(42)
    payloads, blocks = make_batches(rng, args.batches)
    bench_ingest(payloads, blocks)
    bench_lookup(rng)
    bench_memory(rng)


if __name__ == "__main__":
    main()
