"""The cost shape of one real vLLM CPU replica: what prefilling uncached prompt tokens costs, in
single-sequence decode steps.

Routing by KV cache can only shorten time to first token when a cache hit saves more than the
queueing it may cause. On a GPU serving an 8B model, prefilling 1,024 tokens costs about six decode
steps (the simulator's H100 timing model: ~41 ms vs ~7 ms). This script measures the same ratio on
the engine the TTFT testbed serves (``--model ttft``: ``tools/engine/build_model.py --variant ttft``),
directly against the engine's ``/v1/completions`` (token-id prompts, streamed, no proxy):

* **prefill cost of N tokens** = TTFT of a prompt whose N leading tokens are uncached minus TTFT of
  the same-length prompt whose N leading tokens are cached (both end in 64 fresh tokens): exactly what
  a cache hit of N tokens saves;
* **decode step** = (last token time - first token time) / (tokens - 1) of one sequence generating
  64 tokens with ``ignore_eos`` (after a short prompt, and after a 4K-token one);
* **floor** = TTFT of a request whose prompt is all cached but its last block.

Each figure is the median of ``--repeats`` samples (spread: min-max). One replica with the testbed's
engine settings (one compute thread), nothing else sent to it; other work on the machine adds noise
(the load average is printed), so run it a few times.

    .venv/bin/python benchmarks/bench_engine_shape.py [--model ttft] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.harness.engines import SERVED_NAME, start_replicas, stop_replicas
from tools.harness.testbed import ENGINE_ENV

SUFFIX = 64
LENGTHS = (1024, 2048, 4096, 8192)


class Probe:
    """Streamed token-id completions against one engine; fresh prompts never share a block."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url + "/v1/completions"
        self.rng = random.Random(seed)

    def fresh(self, n: int) -> list[int]:
        # Ordinary BPE ids (above the special and added tokens, below the vocabulary's end).
        return [self.rng.randrange(16, 4000) for _ in range(n)]

    async def timed(self, client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
        """(TTFT s, last-token time s, tokens) of one streamed request."""
        body: dict[str, Any] = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0, "ignore_eos": True, "stream": True}
        t0 = time.perf_counter()
        first = last = 0.0
        n = 0
        async with client.stream("POST", self.url, json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if any(c.get("text") for c in chunk.get("choices") or []):
                    now = time.perf_counter() - t0
                    first = first or now
                    last = now
                    n += 1
        return first, last, n


def spread(xs: list[float]) -> dict[str, float]:
    return {"median_ms": round(1000 * statistics.median(xs), 2), "min_ms": round(1000 * min(xs), 2),
            "max_ms": round(1000 * max(xs), 2)}


async def measure(url: str, repeats: int, lengths: tuple[int, ...], seed: int) -> dict[str, Any]:
    p = Probe(url, seed)
    out: dict[str, Any] = {"prefill": {}, "ratio": {}}
    async with httpx.AsyncClient(timeout=300) as c:
        for _ in range(2):  # warm-up: first requests pay one-off allocation costs
            await p.timed(c, p.fresh(512), 4)
        floor, steps, steps_long = [], [], []
        for _ in range(repeats):
            ctx = p.fresh(2048)
            await p.timed(c, ctx + p.fresh(SUFFIX), 1)
            floor.append((await p.timed(c, ctx + p.fresh(SUFFIX), 1))[0])
            t1, tn, n = await p.timed(c, p.fresh(SUFFIX), 65)
            steps.append((tn - t1) / max(1, n - 1))
            t1, tn, n = await p.timed(c, p.fresh(4096), 65)
            steps_long.append((tn - t1) / max(1, n - 1))
        out["floor"] = spread(floor)
        out["decode_step"] = spread(steps)
        out["decode_step_after_4k"] = spread(steps_long)
        step = statistics.median(steps)
        for n_tok in lengths:
            saved, cold_all = [], []
            for _ in range(repeats):
                ctx = p.fresh(n_tok)
                cold = (await p.timed(c, ctx + p.fresh(SUFFIX), 1))[0]
                warm = (await p.timed(c, ctx + p.fresh(SUFFIX), 1))[0]
                saved.append(cold - warm)
                cold_all.append(cold)
            out["prefill"][str(n_tok)] = {"saved_by_hit": spread(saved), "ttft_uncached": spread(cold_all)}
            out["ratio"][str(n_tok)] = round(statistics.median(saved) / step, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="ttft", choices=("tiny", "ttft"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    lengths = tuple(int(x) for x in args.lengths.split(","))
    mml = 16384 if args.model == "ttft" else 4096
    lengths = tuple(n for n in lengths if n + SUFFIX < mml)
    (rep,) = start_replicas(1, kv_cache_bytes="64M", model=args.model, max_model_len=mml, name_prefix="shape",
                             env=ENGINE_ENV)
    try:
        res = asyncio.run(measure(rep.url, args.repeats, lengths, args.seed))
    finally:
        stop_replicas([rep])
    res["model"] = args.model
    res["loadavg_1m"] = os.getloadavg()[0]
    print(f"model {args.model}: decode step {res['decode_step']['median_ms']} ms "
          f"({res['decode_step']['min_ms']}-{res['decode_step']['max_ms']}), after a 4K prompt "
          f"{res['decode_step_after_4k']['median_ms']} ms; floor (cached prompt) {res['floor']['median_ms']} ms")
    print(f"{'uncached tokens':>15} {'TTFT uncached ms':>17} {'saved by a hit ms':>18} {'= decode steps':>15}")
    for n, row in res["prefill"].items():
        s, u = row["saved_by_hit"], row["ttft_uncached"]
        print(f"{n:>15} {u['median_ms']:>17.1f} {s['median_ms']:>9.1f} ({s['min_ms']:.0f}-{s['max_ms']:.0f})"
              f" {res['ratio'][n]:>15.1f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
