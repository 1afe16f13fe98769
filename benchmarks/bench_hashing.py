"""Throughput of litellm_kv.vllm.hashing and litellm_kv.vllm.events, with a naive baseline in the same run.

    .venv/bin/python benchmarks/bench_hashing.py [--quick]

Hashing: tokens/s per algorithm for 8K- and 32K-token prompts (block size 16, the finest vLLM
uses on GPU) for (a) a first call with a cold memo, (b) a growing conversation (+200 tokens per
turn, the memo holding the previous turn), against the naive per-block loop vLLM itself runs
(tuple, serialise, digest for every block on every call).
Decoding: events/s and blocks/s of decode_event_batch (+ to_block_ops) on engine-shaped
batches, against msgpack.unpackb alone (the floor: no typing or validation).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from functools import partial

import msgpack

from litellm_kv.vllm.events import decode_event_batch, to_block_ops
from litellm_kv.vllm.hashing import HASH_ALGOS, BlockHasher, hash_object

BLOCK = 16
GROWTH = 200


def naive_chain(algo: str, none_hash: bytes, tokens: list[int]) -> list[bytes]:
    """What a router without a memo does on every request (and what vLLM does per request)."""
    out: list[bytes] = []
    parent = none_hash
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        parent = hash_object(algo, (parent, tuple(tokens[start : start + BLOCK]), None))
        out.append(parent)
    return out


def first_call(algo: str, seed: str | None, tokens: list[int]) -> None:
    BlockHasher(algo, BLOCK, seed).block_hashes(tokens)  # a new hasher: cold memo


def grow_memo(algo: str, seed: str | None, tokens: list[int], lengths: list[int]) -> float:
    """Turns 1.. of a growing conversation; turn 0 primes the memo and is not timed."""
    h = BlockHasher(algo, BLOCK, seed)
    h.block_hashes(tokens[: lengths[0]])
    t0 = time.perf_counter()
    for n in lengths[1:]:
        h.block_hashes(tokens[:n])
    return time.perf_counter() - t0


def grow_naive(algo: str, none_hash: bytes, tokens: list[int], lengths: list[int]) -> float:
    t0 = time.perf_counter()
    for n in lengths[1:]:
        naive_chain(algo, none_hash, tokens[:n])
    return time.perf_counter() - t0


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` runs; a float returned by ``fn`` is its own timing of the part
    that counts (setup excluded)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        timed = fn()
        elapsed = time.perf_counter() - t0
        best = min(best, timed if isinstance(timed, float) else elapsed)
    return best


def bench_hashing(quick: bool) -> None:
    rng = random.Random(0)
    turns = 5 if quick else 20
    print(f"Hashing, block size {BLOCK}; growing conversation = +{GROWTH} tokens/turn, {turns} turns")
    print(
        f"{'algo':12} {'prompt':>7} {'naive tok/s':>13} {'first tok/s':>13} {'grow tok/s':>13} "
        f"{'naive grow':>13} {'grow speedup':>12}"
    )
    for algo in HASH_ALGOS:
        seed = "0" if algo.startswith("xxhash") else None  # xxhash needs a pinned seed to be exact
        for size in (8192, 32768):
            tokens = [rng.randrange(150000) for _ in range(size)]
            probe = BlockHasher(algo, BLOCK, seed)
            assert naive_chain(algo, probe.none_hash, tokens) == probe.block_hashes(tokens)
            t_naive = best_of(partial(naive_chain, algo, probe.none_hash, tokens), 3)
            t_first = best_of(partial(first_call, algo, seed, tokens), 3)
            # Turn k sends the first size - (turns - k) * GROWTH tokens: the previous turn is
            # in the memo, as when a chat grows. Time per turn, averaged.
            lengths = [size - (turns - k) * GROWTH for k in range(turns + 1)]
            t_grow = best_of(partial(grow_memo, algo, seed, tokens, lengths), 3) / turns
            t_naive_grow = best_of(partial(grow_naive, algo, probe.none_hash, tokens, lengths), 3) / turns
            mean_len = sum(lengths[1:]) / turns  # tokens/s of a turn counts the whole prompt
            print(
                f"{algo:12} {size:>7} {size / t_naive:>13,.0f} {size / t_first:>13,.0f} {mean_len / t_grow:>13,.0f} "
                f"{mean_len / t_naive_grow:>13,.0f} {t_naive_grow / t_grow:>11.1f}x"
            )


def engine_batch(rng: random.Random, n_events: int) -> bytes:
    """A batch shaped like the engine's: BlockStored of 1-8 blocks and single-hash BlockRemoved."""
    events = []
    for _ in range(n_events):
        if rng.random() < 0.6:
            n = rng.randrange(1, 9)
            events.append(
                {
                    "type": "BlockStored",
                    "block_hashes": [rng.getrandbits(64) for _ in range(n)],
                    "parent_block_hash": rng.getrandbits(64),
                    "token_ids": [rng.randrange(150000) for _ in range(n * BLOCK)],
                    "block_size": BLOCK,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None] * n,
                    "group_idx": 0,
                    "kv_cache_spec_kind": "full_attention",
                }
            )
        else:
            events.append(
                {"type": "BlockRemoved", "block_hashes": [rng.getrandbits(64)], "medium": "GPU", "group_idx": 0}
            )
    return msgpack.packb([time.time(), events, 0])


def bench_decoding(quick: bool) -> None:
    rng = random.Random(1)
    payloads = [engine_batch(rng, 64) for _ in range(20 if quick else 100)]
    n_events = sum(len(decode_event_batch(p).events) for p in payloads)
    n_blocks = sum(len(op.hashes) for p in payloads for e in decode_event_batch(p).events for op in to_block_ops(e))

    def ours() -> None:
        for p in payloads:
            for e in decode_event_batch(p).events:
                to_block_ops(e)

    def floor() -> None:
        for p in payloads:
            msgpack.unpackb(p, raw=False, use_list=False)

    repeat = 3 if quick else 5
    t_ours = best_of(ours, repeat)
    t_floor = best_of(floor, repeat)
    print(f"\nDecoding {len(payloads)} batches, {n_events} events, {n_blocks} block hashes")
    for label, t in (("decode_event_batch + to_block_ops", t_ours), ("msgpack.unpackb only (floor)", t_floor)):
        print(f"  {label:34} {n_events / t:>12,.0f} events/s {n_blocks / t:>12,.0f} blocks/s")
    print(f"  typed + validated decode costs {t_ours / t_floor:.2f}x the bare unpack")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer turns and repeats (CI smoke run)")
    args = parser.parse_args()
    bench_hashing(args.quick)
    bench_decoding(args.quick)


if __name__ == "__main__":
    main()
