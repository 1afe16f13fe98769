"""The main job: does KV-aware routing buy time? Two real vLLM CPU replicas shaped like GPU serving (the
``ttft`` model: prefilling 1,024 uncached tokens costs several decode steps, as on a GPU), one real LiteLLM
proxy routing the same replicas three ways (LiteLLM ``simple-shuffle``, LiteLLM ``least-busy``,
litellm-kv with its defaults), and the same open-loop streamed workload through each.

The workload is llm-d's shape scaled down (``tools/harness/field.py`` ``chat``): groups of users share a
~2.5K-token system prompt, multi-turn, Poisson arrivals. At each load level every routing runs twice in
A-B-C-C-B-A order, each run from empty prefix caches; the table pools both. Load levels are set from
the fleet's measured speed at start-up (a fraction of what it serves without any cache hit), so "light"
and "past the knee" mean the same on a fast or a busy machine. Printed per level: TTFT mean/p50/p95
(time to the first streamed content chunk), end-to-end latency, output tokens/s, cached-token ratio,
and litellm-kv's prediction checks; at the end a PNG of TTFT against load (``--plot``).

Run through ``bash scripts/demo.sh`` (which sets everything up first), or directly:
``.venv/bin/python -m tools.demo [--loads 0.5,1.0] [--plot docs/img/demo-ttft.png]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher
from litellm_kv.vllm.tokenization import LocalChatTokenizer
from tools.harness import field
from tools.harness.testbed import (
    KV,
    LABELS,
    ROUTINGS,
    Comparison,
    abc_cba,
    fleet_speed,
    format_abs_error,
    format_comparison,
    start_testbed,
)

# Sized with the testbed's 16 MiB caches (512 blocks of 32 tokens per replica): ~770 distinct blocks, more
# than one replica holds, less than two (the 8 system prompts alone need ~630: shuffled, every replica
# cycles through all of them; kept apart, each holds its half); 32 requests per run keep the demo short.
DEMO_CHAT = {"groups": 8, "users_per_group": 2, "turns": 2, "system_tokens": 2500, "user_tokens": 120,
             "reply_tokens": 40}


def plot(points: list[tuple[float, dict[str, tuple[float, float]]]], path: Path, title: str,
         xlabel: str = "offered load (requests/s)") -> None:
    """TTFT mean and p95 (ms) against offered load, one line per routing; ``points``: (load, {routing: (mean,
    p95)}) per load level (also used by benchmarks/bench_ttft.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    styles = {"ttft-shuffle": ("tab:gray", "s"), "ttft-least-busy": ("tab:blue", "^"), "ttft-kv": ("tab:red", "o")}
    xs = [rate for rate, _ in points]
    for g in ROUTINGS:
        color, marker = styles[g]
        for k, ax in enumerate(axes):
            ax.plot(xs, [row[g][k] for _, row in points], marker=marker, color=color, label=LABELS[g])
    for ax, what in zip(axes, ("TTFT mean (ms)", "TTFT p95 (ms)"), strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(what)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main_async(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    print(f"[demo] starting {args.replicas} vLLM CPU replicas (the ttft model, KV cache {args.kv_cache} each) "
          "and a LiteLLM proxy with three routings over them", flush=True)
    bed = start_testbed(args.replicas, kv_cache=args.kv_cache, name="demo")
    try:
        async with EngineClient(bed.replicas[0].url) as client:
            info = await client.metrics()
        bs, blocks = int(info.block_size or 0), int(info.num_gpu_blocks or 0)
        sizes = dict(DEMO_CHAT)
        tok = LocalChatTokenizer(bed.replicas[0].model_dir)
        wl0 = field.chat_workload(rate=1.0, seed=args.seed, **sizes)
        need, mean_len, max_len = field.distinct_blocks(wl0, tok.chat_tokens, BlockHasher("sha256", bs, hash_seed="0"))
        print(f"[demo] workload {wl0.describe}: {len(wl0.requests)} requests, prompts {mean_len} tokens on average "
              f"(max {max_len}), {need} distinct blocks; KV cache per replica {blocks} blocks of {bs} tokens -> "
              f"overflows one replica: {'yes' if need > blocks else 'NO'}, fits the fleet: "
              f"{'yes' if need <= blocks * args.replicas else 'NO'}", flush=True)
        unit = await fleet_speed(bed)
        capacity = args.replicas / unit
        rates = [round(f * capacity, 2) for f in args.loads]
        print(f"[demo] one uncached request takes {1000 * unit:.0f} ms on an idle replica -> the fleet serves "
              f"~{capacity:.2f} req/s without cache hits; load levels {rates} req/s "
              f"({', '.join(f'{f:.2f}x' for f in args.loads)})", flush=True)
        comps: list[Comparison] = []
        for rate in rates:
            def make(i: int, r: float = rate) -> field.Workload:
                return field.chat_workload(rate=r, seed=field.draw_seed(args.seed, i), **sizes)

            comp = await abc_cba(bed, make, rate, runs=2, max_tokens=args.max_tokens)
            comps.append(comp)
            checks = comp.checks
            print(f"\n{wl0.name} at {rate:.2f} req/s, both runs of each routing pooled "
                  f"({len(comp.pooled(KV).outcomes)} requests each, A-B-C-C-B-A):")
            print(format_comparison(comp))
            total = sum(checks.values())
            print(f"litellm-kv prediction checks (predicted vs engine-reported cached tokens): "
                  f"{checks.get('exact', 0)}/{total} exact {dict(sorted(checks.items()))}", flush=True)
            print(format_abs_error(comp))
            print(flush=True)
        health = bed.proxy.kv_health(KV)
        if "cost_model" in health:
            print(f"[demo] litellm-kv cost model: {health['cost_model']}; learned per replica: "
                  f"{json.dumps(health.get('rates'))}")
        if args.plot:
            points = [(c.rate, {g: (1000 * c.pooled(g).ttft(), 1000 * c.pooled(g).ttft(0.95)) for g in ROUTINGS})
                      for c in comps]
            plot(points, Path(args.plot), f"{wl0.describe}\n{args.replicas} vLLM CPU replicas, ttft model; "
                 "each point pools 2 runs (A-B-C-C-B-A)")
            print(f"[demo] plot: {args.plot}")
        if args.json:
            Path(args.json).write_text(json.dumps(
                [{"rate": c.rate, "checks": c.checks, **{g: c.pooled(g).summary() for g in ROUTINGS}} for c in comps],
                indent=1))
        print(f"[demo] done in {time.monotonic() - t_start:.0f} s (other work on this machine adds noise to every "
              "routing alike: the runs interleave)")
        failed = sum(c.pooled(g).failures for c in comps for g in ROUTINGS)
        return 0 if failed == 0 else 1
    finally:
        bed.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--kv-cache", default="16M", help="KV cache bytes per replica (512 blocks of 32 tokens)")
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 1.0],
                    help="load levels as fractions of what the fleet serves without cache hits")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=5,
                    help="the workload's seed in the first round (A-B-C); the second round (C-B-A) draws new "
                         "arrivals and prompts from another seed, the same for all three routings")
    ap.add_argument("--plot", default="demo-ttft.png", help="PNG path ('' for none)")
    ap.add_argument("--json", default="", help="write the pooled figures here")
    args = ap.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())

