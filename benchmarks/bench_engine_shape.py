"""The cost shape of one real vLLM CPU replica: what prefilling uncached prompt tokens costs, in
single-sequence decode steps.

Routing by KV cache can only shorten time to first token when a cache hit saves more than the
queueing it may cause. On a GPU serving an 8B model, prefilling 1,024 tokens costs about six decode
steps (the simulator's H100 timing model: ~41 ms vs ~7 ms). This script measures the same ratio on
the engine the TTFT testbed serves (``--model ttft``: ``tools/engine/build_model.py --variant ttft``),
directly against the engine's ``/v1/completions`` (token-id prompts, streamed, no proxy):

* **prefill cost of N tokens** = the engine's prefill time (``vllm:request_prefill_time_seconds``) of a
  prompt whose N leading tokens are uncached minus that of the same-length prompt whose N leading tokens
  are cached (both end in 64 fresh tokens): exactly what a cache hit of N tokens saves;
* **decode step** = the engine's mean inter-token latency (``vllm:inter_token_latency_seconds``) of one
  sequence generating 65 tokens with ``ignore_eos`` (after a short prompt, and after a 4K-token one);
* **floor** = the prefill time of a request whose prompt is all cached but its last 64 tokens.

Engine-side timings (histogram sums read before and after each request) are used because a client
starved of CPU by other work sees streamed tokens arrive in bursts; the client-side TTFT saving is
printed beside them.

Each figure is the median of ``--repeats`` samples (spread: min-max). One replica with the testbed's
engine settings (one compute thread), nothing else sent to it; other work on the machine adds noise
(the load average is printed), so run it a few times.

    .venv/bin/python benchmarks/bench_engine_shape.py [--model ttft] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
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


_METRICS = {"prefill": "vllm:request_prefill_time_seconds", "itl": "vllm:inter_token_latency_seconds",
            "ttft": "vllm:time_to_first_token_seconds"}


class Probe:
    """Streamed token-id completions against one engine; fresh prompts never share a block. Each timing is
    the engine's own (its histograms' sums before and after the request), so a client starved of CPU by
    other work on the machine does not distort it; the client's TTFT is kept beside it."""

    def __init__(self, url: str, seed: int) -> None:
        self.base = url
        self.url = url + "/v1/completions"
        self.rng = random.Random(seed)

    def fresh(self, n: int) -> list[int]:
        # Ordinary BPE ids (above the special and added tokens, below the vocabulary's end).
        return [self.rng.randrange(16, 4000) for _ in range(n)]

    async def sums(self, client: httpx.AsyncClient) -> dict[str, tuple[float, float]]:
        text = (await client.get(self.base + "/metrics")).text
        out = {}
        for key, name in _METRICS.items():
            vals = []
            for suffix in ("_sum", "_count"):
                m = re.search(rf"^{re.escape(name + suffix)}{{[^}}]*}} ([0-9.eE+-]+)$", text, re.M)
                vals.append(float(m.group(1)) if m else 0.0)
            out[key] = (vals[0], vals[1])
        return out

    async def timed(self, client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> dict[str, float]:
        """Engine prefill seconds, engine mean inter-token seconds and client TTFT of one streamed request."""
        body: dict[str, Any] = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens,
                                "temperature": 0, "ignore_eos": True, "stream": True}
        before = await self.sums(client)
        t0 = time.perf_counter()
        first = 0.0
        async with client.stream("POST", self.url, json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if (first == 0.0 and line.startswith("data: ") and line.strip() != "data: [DONE]"
                        and any(c.get("text") for c in json.loads(line[6:]).get("choices") or [])):
                    first = time.perf_counter() - t0
        after = await self.sums(client)
        d = {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in _METRICS}
        return {"prefill": d["prefill"][0], "itl": d["itl"][0] / d["itl"][1] if d["itl"][1] else math.nan,
                "engine_ttft": d["ttft"][0], "client_ttft": first}


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
            floor.append((await p.timed(c, ctx + p.fresh(SUFFIX), 1))["prefill"])
            steps.append((await p.timed(c, p.fresh(SUFFIX), 65))["itl"])
            steps_long.append((await p.timed(c, p.fresh(4096), 65))["itl"])
        out["floor"] = spread(floor)
        out["decode_step"] = spread(steps)
        out["decode_step_after_4k"] = spread(steps_long)
        step = statistics.median(steps)
        for n_tok in lengths:
            saved, cold_all, client_saved = [], [], []
            for _ in range(repeats):
                ctx = p.fresh(n_tok)
                cold = await p.timed(c, ctx + p.fresh(SUFFIX), 1)
                warm = await p.timed(c, ctx + p.fresh(SUFFIX), 1)
                saved.append(cold["prefill"] - warm["prefill"])
                cold_all.append(cold["prefill"])
                client_saved.append(cold["client_ttft"] - warm["client_ttft"])
            out["prefill"][str(n_tok)] = {"saved_by_hit": spread(saved), "prefill_uncached": spread(cold_all),
                                          "client_ttft_saved": spread(client_saved)}
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
    print(f"{'uncached tokens':>15} {'prefill ms':>11} {'saved by a hit ms':>24} {'= decode steps':>15} "
          f"{'client TTFT saved ms':>21}")
    for n, row in res["prefill"].items():
        s, u, cl = row["saved_by_hit"], row["prefill_uncached"], row["client_ttft_saved"]
        print(f"{n:>15} {u['median_ms']:>11.1f} {s['median_ms']:>9.1f} ({s['min_ms']:>5.0f}-{s['max_ms']:<5.0f})"
              f" {res['ratio'][n]:>15.1f} {cl['median_ms']:>21.1f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
