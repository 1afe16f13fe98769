"""What one very long prompt costs the other requests a proxy serves: litellm-kv's group against LiteLLM's own.

One real ``litellm`` proxy serves two groups over the same two real vLLM CPU replicas (the tiny model with 10,240
positions, as ``bench_proxy_overhead.py`` starts them): ``tiny-kv`` (``routing: kv``) and ``tiny-default``
(LiteLLM's ``simple-shuffle``). A client sends a small chat to ``tiny-default`` every 25 ms. Part-way, one chat with
a prompt of ``--sizes`` characters goes to one of the two groups (the engines refuse it as longer than they accept:
the proxy's work on it is what is measured). Printed per size and group, over ``--repeat`` runs in alternating
order: how long the long request took to be answered, and the small requests' worst latency while it was in the
proxy against their median before it (the time the proxy's event loop was held shows there).

    .venv/bin/python benchmarks/bench_long_prompt.py [--sizes 300000,1000000,4000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_proxy_overhead as bpo

from tools.harness.engines import stop_replicas
from tools.harness.proxy import Proxy, start_proxy

WORDS = "routing cache alpha beta "
TICK_S = 0.025


def long_messages(size: int, shape: str) -> list[dict[str, str]]:
    """One message of ``size`` characters, or ``size`` short messages (user and assistant in turn)."""
    if shape == "messages":
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(size - 1 | 1)]
    return [{"role": "user", "content": WORDS * (size // len(WORDS))}]


async def one_run(proxy: Proxy, group: str, chars: int, shape: str = "text") -> tuple[float, float, float, int]:
    """(long request's latency, small requests' median before it, their worst while it was in the proxy; ms) and
    the long request's status."""
    lat: list[tuple[float, float]] = []  # (start, latency)
    done = asyncio.Event()
    async with httpx.AsyncClient(timeout=300) as client:
        async def ticker() -> None:
            while not done.is_set():
                t = time.perf_counter()
                await client.post(proxy.url + "/v1/chat/completions", headers=bpo.HEADERS, json={
                    "model": bpo.DEFAULT, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
                lat.append((t, time.perf_counter() - t))
                await asyncio.sleep(TICK_S)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(1.5)
        messages = long_messages(chars, shape)
        t0 = time.perf_counter()
        r = await client.post(proxy.url + "/v1/chat/completions", headers=bpo.HEADERS, json={
            "model": group, "max_tokens": 1, "messages": messages})
        t1 = time.perf_counter()
        await asyncio.sleep(0.3)
        done.set()
        await task
    before = [d for s, d in lat if s + d < t0]
    during = [d for s, d in lat if s < t1 and s + d > t0]
    return (t1 - t0) * 1000, statistics.median(before) * 1000, max(during, default=0.0) * 1000, r.status_code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="300000,1000000,4000000",
                    help="long prompts' lengths in characters (--shape messages: in messages)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shape", choices=["text", "messages"], default="text",
                    help="text: one message of SIZE characters; messages: SIZE short messages")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    engines = bpo.start_engines("96M")
    proxy: Proxy | None = None
    rows: dict[tuple[int, str], list[tuple[float, float, float, int]]] = {}
    try:
        model_dir = str(engines[0].model_dir)
        proxy = start_proxy(bpo.proxy_config(engines, model_dir, "embedded", None), name="bench-long-prompt")
        bpo.wait_exact(proxy, "auto")
        for chars in sizes:
            for rep in range(args.repeat):
                order = (bpo.DEFAULT, bpo.KV) if rep % 2 == 0 else (bpo.KV, bpo.DEFAULT)
                for group in order:
                    res = asyncio.run(one_run(proxy, group, chars, args.shape))
                    rows.setdefault((chars, group), []).append(res)
                    print(f"  {chars:>9} chars  {group:<12} rep {rep}: long {res[0]:7.0f} ms ({res[3]}), small "
                          f"p50 before {res[1]:5.1f} ms, worst during {res[2]:6.0f} ms", flush=True)
    finally:
        if proxy is not None:
            proxy.stop()
        stop_replicas(engines)
    print("\nMedian over repeats (min-max); the small requests' worst latency while the long prompt was in the proxy:")
    print(f"{'chars':>9}  {'group':<12} {'long request ms':>22} {'small worst ms':>22} {'status':>7}")
    for (chars, group), res in rows.items():
        longs, worsts = [r[0] for r in res], [r[2] for r in res]
        print(f"{chars:>9}  {group:<12} {statistics.median(longs):8.0f} ({min(longs):5.0f}-{max(longs):5.0f}) "
              f"{statistics.median(worsts):8.0f} ({min(worsts):5.0f}-{max(worsts):5.0f}) "
              f"{'/'.join(sorted({str(r[3]) for r in res})):>7}")
    for chars in sizes:
        kv = statistics.median(r[2] for r in rows[(chars, bpo.KV)])
        dflt = statistics.median(r[2] for r in rows[(chars, bpo.DEFAULT)])
        print(f"{chars:>9} chars: small requests' worst latency, litellm-kv's group / LiteLLM's: {kv / dflt:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
