"""The main job: real vLLM CPU replicas behind a real LiteLLM proxy with litellm-kv (embedded mode,
in-memory index, no Redis), the same workload routed by litellm-kv and by LiteLLM's default
``simple-shuffle``, and a table of what routing achieved.

Run through ``bash scripts/demo.sh`` (which sets everything up first), or directly:
``.venv/bin/python -m tools.demo [--replicas 2] [--groups 8] ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import httpx

from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher
from tools.harness.engines import reset_prefix_caches, start_replicas
from tools.harness.proxy import MASTER_KEY, start_proxy
from tools.harness.workload import COMPARISON, RunStats, format_table, make_workload, run_workload

KV_GROUP = "tiny-kv"
DEFAULT_GROUP = "tiny-default"


def proxy_config(replicas: list[Any], model_dir: str) -> dict[str, Any]:
    """Two model groups over the same replicas: one KV-routed, one with LiteLLM's default routing."""
    model_list = []
    for group in (KV_GROUP, DEFAULT_GROUP):
        for i, r in enumerate(replicas):
            model_list.append({
                "model_name": group,
                "litellm_params": {"model": "hosted_vllm/tiny", "api_base": f"{r.url}/v1", "api_key": "none"},
                "model_info": {"id": f"{group}-replica-{i}"},
            })
    return {
        "model_list": model_list,
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 1},
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"],
                             "request_timeout": 120},
        "litellm_kv": {
            "mode": "embedded",
            "model_groups": {KV_GROUP: {"routing": "kv", "kv": {"tokenizer": "auto", "tokenizer_path": model_dir}}},
        },
    }


async def engine_tokens(url: str, messages: list[dict[str, Any]]) -> list[int]:
    async with httpx.AsyncClient(timeout=30) as c:
        r = await c.post(f"{url}/tokenize", json={"model": "tiny", "messages": messages})
        r.raise_for_status()
        return list(r.json()["tokens"])


async def distinct_blocks(url: str, block_size: int, convs: list[Any]) -> int:
    """Distinct full blocks the workload's prompts need (exact: engine tokenizer + vLLM hashing)."""
    hasher = BlockHasher("sha256", block_size)
    seen: set[bytes] = set()
    for c in convs:
        hist: list[dict[str, Any]] = [{"role": "system", "content": c.system}]
        for u in c.user_turns:
            hist.append({"role": "user", "content": u})
            seen.update(hasher.block_hashes(await engine_tokens(url, hist)))
            hist.append({"role": "assistant", "content": "x " * 12})
    return len(seen)


async def main_async(args: argparse.Namespace) -> int:
    print(f"[demo] starting {args.replicas} vLLM CPU replicas (tiny local model, KV cache {args.kv_cache})",
          flush=True)
    # VLLM_SERVER_DEV_MODE exposes POST /reset_prefix_cache, used to start both runs cold.
    replicas = start_replicas(args.replicas, kv_cache_bytes=args.kv_cache, env={"VLLM_SERVER_DEV_MODE": "1"},
                              name_prefix="demo")
    proxy = None
    try:
        r0 = replicas[0]
        async with EngineClient(r0.url) as client:
            info = await client.metrics()
        bs, blocks = int(info.block_size or 0), int(info.num_gpu_blocks or 0)
        convs = make_workload(groups=args.groups, convs_per_group=args.convs, turns=args.turns,
                              system_words=args.system_words, user_words=args.user_words, seed=args.seed)
        need = await distinct_blocks(r0.url, bs, convs)
        fits_one = need <= blocks
        fits_fleet = need <= blocks * len(replicas)
        print(f"[demo] KV cache per replica: {blocks} blocks of {bs} tokens; workload needs {need} distinct blocks "
              f"-> overflows one replica: {'yes' if not fits_one else 'NO'}, fits the fleet: "
              f"{'yes' if fits_fleet else 'NO'}", flush=True)
        print("[demo] starting the LiteLLM proxy with litellm-kv (embedded mode)", flush=True)
        proxy = start_proxy(proxy_config(replicas, str(r0.model_dir)), name="demo-proxy")
        proxy.wait_kv_exact(KV_GROUP)
        names = {f"{g}-replica-{i}": f"r{i}" for g in (KV_GROUP, DEFAULT_GROUP) for i in range(len(replicas))}
        # Each routing runs twice, in A-B-B-A order, with the caches reset before every run: on this machine a
        # run's latency depends on its position (measured: simple-shuffle's mean was 240 ms run first and 568 ms
        # run second), so a single A-B pair can credit the order to the routing.
        labels = {DEFAULT_GROUP: "LiteLLM simple-shuffle", KV_GROUP: "litellm-kv (embedded)"}
        runs: dict[str, list[RunStats]] = {DEFAULT_GROUP: [], KV_GROUP: []}
        for n, group in enumerate((DEFAULT_GROUP, KV_GROUP, KV_GROUP, DEFAULT_GROUP), 1):
            reset_prefix_caches(replicas)
            print(f"[demo] run {n}/4: {len(convs) * args.turns} requests with {labels[group]}", flush=True)
            runs[group].append(await run_workload(proxy.url, MASTER_KEY, group, convs, label=labels[group],
                                                  concurrency=args.concurrency))
        base, kv = (runs[g][0] + runs[g][1] for g in (DEFAULT_GROUP, KV_GROUP))
        print(f"\nboth runs of each routing pooled ({len(base.results)} requests each; A-B-B-A order):")
        print(format_table([base, kv], names))
        ratio = kv.cached_ratio / base.cached_ratio if base.cached_ratio else float("inf")
        print(f"\ncached-token ratio: litellm-kv / simple-shuffle = {ratio:.2f}x; "
              f"mean latency {kv.mean_latency_ms:.0f} ms vs {base.mean_latency_ms:.0f} ms")
        async with httpx.AsyncClient(timeout=10) as c:
            m = await c.get(f"{proxy.url}/litellm-kv/metrics", headers={"Authorization": f"Bearer {MASTER_KEY}"})
        checks = [ln for ln in m.text.splitlines() if ln.startswith("litellm_kv_prediction_checks_total")]
        print("prediction checks (predicted vs engine-reported cached tokens):")
        for ln in checks:
            print("  " + ln)
        return 0 if kv.failures == 0 and base.failures == 0 else 1
    finally:
        if proxy is not None:
            proxy.stop()
        for r in replicas:
            r.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--kv-cache", default="8M", help="KV cache bytes per replica (small: forces eviction)")
    # Sized with the 8 MiB caches (256 blocks of 32) so the distinct prefixes overflow one replica's
    # cache but fit the fleet's: the regime where routing matters.
    ap.add_argument("--groups", type=int, default=COMPARISON["groups"], help="distinct system prompts")
    ap.add_argument("--convs", type=int, default=COMPARISON["convs_per_group"], help="conversations per system prompt")
    ap.add_argument("--turns", type=int, default=COMPARISON["turns"])
    ap.add_argument("--system-words", type=int, default=COMPARISON["system_words"])
    ap.add_argument("--user-words", type=int, default=COMPARISON["user_words"])
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
