"""Index benchmark: Redis (shared) vs in-memory (embedded), in the same run.

Prints, for each backend: lookup latency p50/p99 for 1K/8K/32K-token prompts, round trips per
lookup (Redis: counted by the client and checked against the server's commandstats), ingest rate
in blocks/s (one KV-event batch per apply, as the indexer does), and memory per indexed block
(Redis ``used_memory`` delta; in-memory: tracemalloc delta).

    .venv/bin/python benchmarks/bench_index.py [--blocks 200000] [--lookups 300]

Needs ``redis-server`` on PATH (a private one is started on a free port).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from litellm_kv.index.base import BlockOp, KVIndex, Tier
from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.index.redis import RedisIndex
from tools.harness.redis_server import RedisServer

GROUP = "bench/model"
BLOCK = 16  # tokens per block (vLLM's GPU default)
REPLICAS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
BATCH_BLOCKS = 32  # blocks per BlockStored event batch (a 512-token prefill step)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def apply(index: KVIndex, replica: str, hashes: list[int], seq: int) -> None:
    """One event batch; ``seq`` < 0 applies without the HA dedupe (set-up, not measured)."""
    op = BlockOp(tuple(hashes), Tier.GPU, +1)
    if isinstance(index, RedisIndex):
        await index.apply_batch(GROUP, replica, [op], stream=f"{replica}#0", seq=seq, ts=float(seq))
    else:
        await index.apply(GROUP, replica, [op])


async def ingest(index: KVIndex, n_blocks: int, rng: random.Random) -> tuple[float, int]:
    """Distinct blocks spread over the replicas, one batch of BATCH_BLOCKS per call."""
    seqs = dict.fromkeys(REPLICAS, 0)
    t0 = time.perf_counter()
    done = 0
    while done < n_blocks:
        replica = REPLICAS[(done // BATCH_BLOCKS) % len(REPLICAS)]
        hashes = [rng.getrandbits(64) for _ in range(BATCH_BLOCKS)]
        await apply(index, replica, hashes, seqs[replica])
        seqs[replica] += 1
        done += BATCH_BLOCKS
    return done / (time.perf_counter() - t0), done


async def lookups(index: KVIndex, tokens: int, n: int, rng: random.Random) -> dict[str, float]:
    """A prompt of ``tokens`` fully cached on one replica, half on another; ``n`` timed lookups."""
    chain = [rng.getrandbits(64) for _ in range(tokens // BLOCK)]
    await apply(index, REPLICAS[0], chain, -1)
    await apply(index, REPLICAS[1], chain[: len(chain) // 2], -1)
    got = await index.lookup(GROUP, chain)
    assert got[REPLICAS[0]].blocks == len(chain) and got[REPLICAS[1]].blocks == len(chain) // 2, got
    times = []
    rt0 = getattr(index, "round_trips", 0)
    for _ in range(n):
        t = time.perf_counter()
        await index.lookup(GROUP, chain)
        times.append(time.perf_counter() - t)
    rts = (getattr(index, "round_trips", 0) - rt0) / n
    return {"p50_ms": pct(times, 0.5) * 1e3, "p99_ms": pct(times, 0.99) * 1e3, "round_trips": rts}


async def run_backend(
    name: str, index: KVIndex, args: argparse.Namespace, server: RedisServer | None
) -> dict[str, Any]:
    rng = random.Random(42)
    out: dict[str, Any] = {"backend": name}
    # Memory per block: ingest into an empty index and measure the growth.
    gc.collect()
    if server is not None:
        server.client().flushall()
        before = server.client().info("memory")["used_memory"]
    else:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    rate, _ = await ingest(index, args.blocks, rng)
    size = await index.size(GROUP)
    if server is not None:
        after = server.client().info("memory")["used_memory"]
    else:
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    out["ingest_blocks_per_s"] = rate
    out["entries"] = size
    out["bytes_per_block"] = (after - before) / max(size, 1)
    # Ingest of blocks every replica already shares (a second replica caching a hot prefix).
    shared = [rng.getrandbits(64) for _ in range(args.blocks // 8)]
    for i in range(0, len(shared), BATCH_BLOCKS):
        await apply(index, REPLICAS[0], shared[i : i + BATCH_BLOCKS], -1)
    if server is not None:
        m0 = server.client().info("memory")["used_memory"]
        for i in range(0, len(shared), BATCH_BLOCKS):
            await apply(index, REPLICAS[2], shared[i : i + BATCH_BLOCKS], -1)
        out["bytes_per_extra_replica_on_shared_block"] = (
            server.client().info("memory")["used_memory"] - m0
        ) / len(shared)
    for tokens in (1024, 8192, 32768):
        if server is not None:
            server.client().config_resetstat()
        res = await lookups(index, tokens, args.lookups, rng)
        if server is not None:
            calls = server.client().info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
            res["server_evalsha_per_lookup"] = calls / (args.lookups + 1)  # + the checking lookup
        out[f"lookup_{tokens // 1024}k"] = res
    return out


def show(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'':34}" + "".join(f"{r['backend']:>16}" for r in rows))

    def line(label: str, get: Any, fmt: str) -> None:
        vals = []
        for r in rows:
            try:
                vals.append(format(get(r), fmt))
            except (KeyError, TypeError):
                vals.append("-")
        print(f"{label:34}" + "".join(f"{v:>16}" for v in vals))

    for k in (1, 8, 32):
        line(f"lookup {k}K tokens p50 (ms)", lambda r, k=k: r[f"lookup_{k}k"]["p50_ms"], ".3f")
        line(f"lookup {k}K tokens p99 (ms)", lambda r, k=k: r[f"lookup_{k}k"]["p99_ms"], ".3f")
        line(f"round trips / lookup ({k}K)", lambda r, k=k: r[f"lookup_{k}k"]["round_trips"], ".2f")
    line("server EVALSHA / lookup (32K)", lambda r: r["lookup_32k"]["server_evalsha_per_lookup"], ".2f")
    line("ingest (blocks/s)", lambda r: r["ingest_blocks_per_s"], ",.0f")
    line("entries indexed", lambda r: r["entries"], ",d")
    line("bytes per (replica, block) entry", lambda r: r["bytes_per_block"], ".1f")
    line("bytes per 2nd replica on a block", lambda r: r["bytes_per_extra_replica_on_shared_block"], ".1f")
    if len(rows) == 2:
        red, mem = rows
        print("\nratios redis / in-memory:")
        for k in (1, 8, 32):
            print(f"  lookup {k}K p50: {red[f'lookup_{k}k']['p50_ms'] / mem[f'lookup_{k}k']['p50_ms']:.1f}x")
        print(f"  ingest rate: {red['ingest_blocks_per_s'] / mem['ingest_blocks_per_s']:.2f}x")
        print(f"  bytes per block: {red['bytes_per_block'] / mem['bytes_per_block']:.2f}x")


async def main_async(args: argparse.Namespace) -> None:
    server = RedisServer(name="bench-redis")
    try:
        redis_index = RedisIndex(server.url)
        rows = [await run_backend("redis", redis_index, args, server)]
        await redis_index.close()
        rows.append(await run_backend("in-memory", InMemoryIndex(), args, None))
    finally:
        server.stop()
    print(f"block size {BLOCK} tokens, {len(REPLICAS)} replicas, {BATCH_BLOCKS} blocks per event batch, "
          f"{args.lookups} lookups per prompt size; prompt cached fully on one replica, half on another")
    show(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=200_000, help="blocks ingested for the memory figure")
    ap.add_argument("--lookups", type=int, default=300, help="timed lookups per prompt size")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
