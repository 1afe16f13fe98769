"""A burst of concurrent requests on a nearly spent reasoning budget, through a real ``litellm`` proxy and a
healthy real redis-server, with the budget store's default settings (``litellm_kv.budgets``: 150 ms deadline,
``on_store_error: fail_open``).

Each round sets the key's day budget to ``--left`` tokens left, sends ``--burst`` requests at once and waits
until every hold is settled; it prints how many reasoning tokens the answers carried beyond what was left
(``overshoot``, which the budget must keep at or under 0 here: the upstream, like vLLM, stops thinking at
``thinking_token_budget``), how far the budget's counter went past the limit (``charged_over``: below the
overshoot when charges were lost), how many budget calls
failed open (``litellm_kv_budget_store_errors_total``), how many missed the deadline
(``litellm_kv_redis_call_failures_total{use="budgets"}``) and the requests' latency.

With ``--paused`` Redis does not answer during the burst (redis-server stopped with SIGSTOP just before
it, resumed once every answer is in): one probe request first lets the proxy see the budget (it asks for
a thinking budget of 1 token), so the burst shows what failing open grants on a budget the proxy knows.

The upstream is the local fake (``tests/support/fake_upstream.py``) standing in for a reasoning engine:
no reasoning model can be driven tens of times in parallel on a CPU test machine.

    .venv/bin/python -m benchmarks.bench_budget_burst --burst 20 --rounds 5 [--paused]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import time
from datetime import datetime, timezone
from typing import Any

import httpx
from litellm.proxy._types import UserAPIKeyAuth

from litellm_kv.governance.budgets import Period
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import Proxy, start_proxy
from tools.harness.redis_server import RedisServer

LIMIT = 100_000
KEY = "sk-burst"


def _usage_key(api_key: str = KEY) -> str:
    token = UserAPIKeyAuth(api_key=api_key, token=f"hashed-{api_key}").token
    return f"litellm_kv:budget:{{key:{token}}}:reasoning_tokens:day:{Period.DAY.window_id(datetime.now(timezone.utc))}"


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _counts(proxy: Proxy) -> tuple[float, float]:
    text = httpx.get(proxy.url + "/litellm-kv/metrics", headers=proxy.headers(), timeout=30).text
    return (_metric(text, "litellm_kv_budget_store_errors_total", outcome="fail_open"),
            _metric(text, "litellm_kv_redis_call_failures_total", use="budgets"))


async def _burst(proxy: Proxy, n: int, api_key: str) -> list[tuple[float, int, int]]:
    payload = {"model": "qwen", "messages": [{"role": "user", "content": "think hard"}]}

    async def one(client: httpx.AsyncClient) -> tuple[float, int, int]:
        t = time.perf_counter()
        r = await client.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(api_key))
        used = 0
        if r.status_code == 200:
            details = (r.json().get("usage") or {}).get("completion_tokens_details") or {}
            used = int(details.get("reasoning_tokens") or 0)
        return time.perf_counter() - t, r.status_code, used

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n + 4)) as client:
        return list(await asyncio.gather(*[one(client) for _ in range(n)]))


def _probe(proxy: Proxy, api_key: str) -> None:
    """One request thinking at most 1 token: the proxy reads the budget's usage from Redis (and charges 1)."""
    payload = {"model": "qwen", "messages": [{"role": "user", "content": "probe"}], "thinking_token_budget": 1}
    resp = httpx.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(api_key), timeout=60)
    resp.raise_for_status()


def run_round(proxy: Proxy, srv: RedisServer, n: int, left: int, *, paused: bool = False,
              api_key: str = KEY) -> dict[str, Any]:
    """One burst on ``api_key`` (a key of its own per paused round: what a proxy knows of a budget it could
    not settle stays with it, and the next round's reset of the counter would meet it)."""
    r = srv.client()
    key = _usage_key(api_key)
    r.delete(key, key + ":holds", key + ":hold_until")
    r.set(key, LIMIT - left - (1 if paused else 0), ex=3 * 86400)
    if paused:
        _probe(proxy, api_key)
        for _ in range(80):  # its hold settled: the proxy saw the usage the burst starts from
            if r.hlen(key + ":holds") == 0:
                break
            time.sleep(0.05)
        left = LIMIT - int(r.get(key) or 0)
    fails_before, misses_before = _counts(proxy)
    if paused:
        assert srv.proc is not None
        srv.proc.signal(signal.SIGSTOP)
    try:
        results = asyncio.run(_burst(proxy, n, api_key))
    finally:
        if paused:
            assert srv.proc is not None
            srv.proc.signal(signal.SIGCONT)
    for _ in range(80):
        if r.hlen(key + ":holds") == 0:
            break
        time.sleep(0.25)
    fails_after, misses_after = _counts(proxy)
    lat = sorted(t for t, _, _ in results)
    served = sum(u for _, _, u in results)
    return {
        # What the burst thought beyond what was left (from the answers), and what the counter shows.
        "overshoot": served - left,
        "charged_over": int(r.get(key) or 0) - LIMIT,
        "ok": sum(1 for _, s, _ in results if s == 200),
        "refused": sum(1 for _, s, _ in results if s == 429),
        "fail_open": int(fails_after - fails_before),
        "deadline_misses": int(misses_after - misses_before),
        "p50_ms": round(statistics.median(lat) * 1000),
        "max_ms": round(lat[-1] * 1000),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--left", type=int, default=50, help="tokens left of the day budget before each burst")
    ap.add_argument("--label", default="", help="printed with every line (which code ran)")
    ap.add_argument("--paused", action="store_true", help="Redis paused (SIGSTOP) during each burst")
    args = ap.parse_args()
    srv = RedisServer(name="redis-bench-burst")
    upstream, url = start_fake_upstream("burst-reasoner", "--reasoning-words", "40", "--report-reasoning-tokens",
                                        "--count-reasoning-in-completion", "--delay-ms", "300")
    config = {
        "model_list": [{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                 "api_base": url + "/v1"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"redis_url": srv.url, "model_groups": {"qwen": {"reasoning": {"style": "vllm"}}}},
    }
    limits = {"metadata": {"litellm_kv": {"reasoning": {"tokens_per_day": LIMIT}}}}
    round_keys = [f"{KEY}-{i}" if args.paused else KEY for i in range(args.rounds)]
    keys = {k: {"key_alias": k.removeprefix("sk-"), **limits} for k in {KEY, *round_keys}}
    proxy: Proxy | None = None
    try:
        proxy = start_proxy(config, name="litellm-bench-burst", keys=keys,
                            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        run_round(proxy, srv, 2, LIMIT)  # warm-up: first-request imports and connections
        rounds = [run_round(proxy, srv, args.burst, args.left, paused=args.paused, api_key=k) for k in round_keys]
        for i, row in enumerate(rounds):
            print(f"{args.label} round {i}: " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        over = [row["overshoot"] for row in rounds]
        print(f"{args.label} burst={args.burst} left={args.left} paused={args.paused}: overshoot max {max(over)} "
              f"(rounds over the limit: {sum(1 for o in over if o > 0)}/{len(over)}); fail_open total "
              f"{sum(row['fail_open'] for row in rounds)}; p50 {statistics.median(r['p50_ms'] for r in rounds)} ms; "
              f"max {max(r['max_ms'] for r in rounds)} ms", flush=True)
    finally:
        # Everything this run started goes, also when the proxy never came up.
        if proxy is not None:
            proxy.stop()
        upstream.stop()
        srv.stop()


if __name__ == "__main__":
    main()
