"""What litellm-kv costs the proxy in CPU: seconds of the proxy process's CPU per streamed request.

One real vLLM CPU replica (the TTFT testbed's model, ``OMP_NUM_THREADS=1``) behind one real ``litellm`` proxy
(LiteLLM 1.110.2) at a time, in three configurations over the same replica:

* ``litellm``: LiteLLM alone (no litellm-kv callback);
* ``callback``: litellm-kv's callback loaded, the group not KV-routed (every request still passes its hooks:
  governance, charging, metrics);
* ``kv``: the group KV-routed (embedded mode: local tokenization, block hashes, the index, and the replica's KV
  events decoded and applied in the proxy).

Each configuration gets its own proxy process, a warm-up of a few requests, then ``--requests`` streamed requests
of new ``--tokens``-token prompts (nothing cached: every request's blocks are new, the events' worst case) sent
open loop at ``--rate`` with ``--max-tokens`` output tokens. The proxy's CPU (user + system, every thread, read
from ``/proc``) over those requests, divided by their count, is the figure. The three run in A-B-C-C-B-A order
``--repeat`` times (each repeat a fresh proxy per configuration); printed per configuration: the median over the
runs (min-max), and the median of the per-block differences from ``litellm``.

    .venv/bin/python benchmarks/bench_proxy_cpu.py [--requests 30] [--repeat 2] [--tokens 2500] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.harness import field
from tools.harness.engines import EngineReplica, start_replicas
from tools.harness.procs import group_cpu_seconds
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy
from tools.harness.testbed import ENGINE_ENV, MAX_MODEL_LEN, abc_order

ARMS = ("litellm", "callback", "kv")
GROUP = "g"


def proxy_config(replica: EngineReplica, arm: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_list": [{"model_name": GROUP, "model_info": {"id": f"{GROUP}-r0"},
                        "litellm_params": {"model": "hosted_vllm/tiny", "api_base": replica.api_base,
                                           "api_key": "none"}}],
        "router_settings": {"routing_strategy": "simple-shuffle"},
        "litellm_settings": {"request_timeout": 300},
    }
    if arm != "litellm":
        cfg["litellm_settings"]["callbacks"] = ["litellm_kv.integration.callback.proxy_handler"]
        groups = {GROUP: {"routing": "kv", "kv": {"tokenizer_path": str(replica.model_dir)}}} if arm == "kv" else {}
        cfg["litellm_kv"] = {"mode": "embedded", "model_groups": groups}
    return cfg


def proxy_cpu_s(proxy: Proxy) -> float:
    groups = group_cpu_seconds([proxy.proc.pid])
    if groups is None:
        raise SystemExit("bench_proxy_cpu reads /proc: Linux only")
    return sum(groups[proxy.proc.pid].values())


def workload(n: int, tokens: int, rate: float, seed: int) -> field.Workload:
    return field.unique_workload(n=n, prompt_tokens=tokens, rate=rate, seed=seed)


async def one_arm(replica: EngineReplica, arm: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    proxy = await asyncio.to_thread(start_proxy, proxy_config(replica, arm), name=f"cpu-{arm}", timeout=300)
    try:
        await field.run_open_loop(proxy.url, MASTER_KEY, GROUP, workload(args.warmup, args.tokens, args.rate,
                                                                          seed + 1000), max_tokens=args.max_tokens)
        before = proxy_cpu_s(proxy)
        run = await field.run_open_loop(proxy.url, MASTER_KEY, GROUP, workload(args.requests, args.tokens,
                                                                                args.rate, seed),
                                        max_tokens=args.max_tokens)
        cpu = proxy_cpu_s(proxy) - before
    finally:
        await asyncio.to_thread(proxy.stop)
    ok = len(run.ok)
    return {"arm": arm, "requests": ok, "failures": run.failures, "cpu_ms_per_request": 1000 * cpu / max(1, ok),
            "ttft_mean_ms": 1000 * run.ttft(), "output_tokens": sum(o.output_tokens for o in run.ok)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    (replica,) = await asyncio.to_thread(start_replicas, 1, kv_cache_bytes="16M", model="ttft",
                                         max_model_len=MAX_MODEL_LEN, env=ENGINE_ENV, name_prefix="cpu")
    runs: list[dict[str, Any]] = []
    try:
        for i, arm in enumerate(abc_order(ARMS, 2 * args.repeat)):
            r = await one_arm(replica, arm, args, seed=100 + i)
            r["block"] = i // len(ARMS)
            runs.append(r)
            print(f"  run {i + 1}/{2 * args.repeat * len(ARMS)} {arm:<9} proxy CPU {r['cpu_ms_per_request']:6.1f} ms "
                  f"per request ({r['requests']} requests, {r['failures']} failed, TTFT mean "
                  f"{r['ttft_mean_ms']:.0f} ms)", flush=True)
    finally:
        await asyncio.to_thread(replica.stop)
    return {"args": vars(args), "runs": runs, "summary": summarise(runs)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: median (min-max) of the per-run CPU per request; per arm but ``litellm``: the median of its
    difference from the ``litellm`` run of the same block."""
    out: dict[str, Any] = {}
    base = {r["block"]: r["cpu_ms_per_request"] for r in runs if r["arm"] == "litellm"}
    for arm in ARMS:
        xs = [r["cpu_ms_per_request"] for r in runs if r["arm"] == arm]
        s: dict[str, Any] = {"median_ms": round(statistics.median(xs), 2), "min_ms": round(min(xs), 2),
                             "max_ms": round(max(xs), 2), "runs": len(xs)}
        if arm != "litellm":
            ds = [r["cpu_ms_per_request"] - base[r["block"]] for r in runs if r["arm"] == arm and r["block"] in base]
            s["minus_litellm_ms"] = round(statistics.median(ds), 2)
            s["minus_litellm_min_max_ms"] = [round(min(ds), 2), round(max(ds), 2)]
            s["ratio"] = round(s["median_ms"] / out["litellm"]["median_ms"], 3)
        out[arm] = s
    return out


def report(summary: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"Proxy CPU per streamed request ({args.tokens}-token prompts never seen, {args.max_tokens} output "
             f"tokens, {args.rate} req/s), median over runs (min-max):", ""]
    for arm in ARMS:
        s = summary[arm]
        extra = ""
        if arm != "litellm":
            lo, hi = s["minus_litellm_min_max_ms"]
            extra = (f"  {s['ratio']:.2f}x; minus litellm, same block: {s['minus_litellm_ms']:+.1f} ms "
                     f"({lo:+.1f} to {hi:+.1f})")
        lines.append(f"  {arm:<9} {s['median_ms']:6.1f} ms ({s['min_ms']:.1f}-{s['max_ms']:.1f}, "
                     f"{s['runs']} runs){extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2, help="A-B-C-C-B-A blocks: each arm runs 2 x this many times")
    ap.add_argument("--tokens", type=int, default=2500)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second, open loop (Poisson)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.repeat < 1 or args.rate <= 0:
        ap.error("--requests and --repeat must be >= 1, --rate > 0")
    results = asyncio.run(main_async(args))
    print("\n" + report(results["summary"], args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
