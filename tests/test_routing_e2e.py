"""KV-aware routing end to end: a real ``litellm`` proxy with litellm-kv (embedded mode) in front of two
real vLLM CPU replicas, compared with LiteLLM's ``simple-shuffle`` over the same replicas in the same run.

The replicas' KV caches (session fixture: 256 blocks of 32 tokens each) are smaller than the workload's
distinct prefixes but the fleet's caches are not: the regime where routing matters. The test asserts and
prints that sizing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from litellm_kv.engine import EngineClient
from litellm_kv.hashing import BlockHasher
from tests.support.engines import EngineReplica
from tests.support.proxy import MASTER_KEY, Proxy, start_proxy
from tests.support.workload import format_table, make_workload, run_workload

pytestmark = [pytest.mark.engine, pytest.mark.proxy]

KV = "tiny-kv"
DEFAULT = "tiny-default"
HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}


def _config(engines: list[EngineReplica], model_dir: str, extra_kv: dict[str, Any] | None = None) -> dict[str, Any]:
    model_list = []
    for group in (KV, DEFAULT):
        for i, r in enumerate(engines):
            model_list.append({
                "model_name": group,
                "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base, "api_key": "none"},
                "model_info": {"id": f"{group}-{i}"},
            })
    return {
        "model_list": model_list,
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 2, "allowed_fails": 1,
                            "cooldown_time": 5},
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"], "request_timeout": 60},
        "litellm_kv": {"mode": "embedded", "model_groups": {
            KV: {"routing": "kv", "kv": {"tokenizer_path": model_dir, "scrape_interval_s": 0.5,
                                         "discovery_interval_s": 1.0, **(extra_kv or {})}},
        }},
    }


def _health(proxy: Proxy) -> dict[str, Any]:
    r = httpx.get(f"{proxy.url}/litellm-kv/health", headers=HEADERS, timeout=10)
    r.raise_for_status()
    return dict(r.json())


def _wait_exact(proxy: Proxy, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = _health(proxy)["routing"]["groups"][KV]
        if last["exact"] and all(r["ready"] for r in last["replicas"]):
            return last
        time.sleep(0.5)
    raise AssertionError(f"routing never became exact: {last}")


def _metric(proxy: Proxy, prefix: str) -> dict[str, float]:
    text = httpx.get(f"{proxy.url}/litellm-kv/metrics", headers=HEADERS, timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _reset(engines: list[EngineReplica]) -> None:
    for r in engines:
        httpx.post(f"{r.url}/reset_prefix_cache", timeout=30).raise_for_status()
    time.sleep(0.5)


@pytest.fixture(scope="module")
def proxy(engines: list[EngineReplica], engine_model: Any) -> Iterator[Proxy]:
    p = start_proxy(_config(engines, str(engine_model)), name="routing-e2e")
    try:
        _wait_exact(p)
        yield p
    finally:
        p.stop()


async def _distinct_blocks(url: str, convs: list[Any], block_size: int) -> int:
    hasher = BlockHasher("sha256", block_size)
    seen: set[bytes] = set()
    async with EngineClient(url) as c:
        for conv in convs:
            hist: list[dict[str, Any]] = [{"role": "system", "content": conv.system}]
            for u in conv.user_turns:
                hist.append({"role": "user", "content": u})
                seen.update(hasher.block_hashes(await c.tokenize_chat(hist)))
                hist.append({"role": "assistant", "content": "x " * 10})
    return len(seen)


def test_kv_routing_beats_simple_shuffle(proxy: Proxy, engines: list[EngineReplica]) -> None:
    convs = make_workload(groups=14, convs_per_group=1, turns=6, system_words=150, user_words=25, seed=5)

    async def run() -> tuple[Any, Any, int, int, int]:
        async with EngineClient(engines[0].url) as c:
            m = await c.metrics()
        bs, blocks = int(m.block_size or 0), int(m.num_gpu_blocks or 0)
        need = await _distinct_blocks(engines[0].url, convs, bs)
        _reset(engines)
        base = await run_workload(proxy.url, MASTER_KEY, DEFAULT, convs, label="LiteLLM simple-shuffle",
                                  concurrency=3)
        _reset(engines)
        kv = await run_workload(proxy.url, MASTER_KEY, KV, convs, label="litellm-kv", concurrency=3)
        return base, kv, need, blocks, bs

    before = _metric(proxy, "litellm_kv_prediction_checks_total")
    base, kv, need, blocks, bs = asyncio.run(run())
    print(f"\nKV cache per replica: {blocks} blocks of {bs}; workload needs {need} distinct blocks")
    print(format_table([base, kv]))
    assert need > blocks, "workload must overflow one replica's cache"
    assert need <= 2 * blocks, "workload must fit the fleet's caches"
    assert base.failures == 0 and kv.failures == 0
    ratio = kv.cached_ratio / max(base.cached_ratio, 1e-9)
    print(f"cached-token ratio litellm-kv / simple-shuffle = {ratio:.2f}x")
    assert kv.cached_ratio >= 1.5 * base.cached_ratio
    after = _metric(proxy, "litellm_kv_prediction_checks_total")
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    exact = sum(v for k, v in delta.items() if 'outcome="exact"' in k)
    total = sum(v for k, v in delta.items() if 'outcome="fallback"' not in k)
    print(f"predictions: {exact:.0f}/{total:.0f} exact ({delta})")
    assert total >= len(kv.results)
    assert exact / total >= 0.8, delta


def test_streaming_with_tools(proxy: Proxy, engines: list[EngineReplica]) -> None:
    convs = make_workload(groups=3, convs_per_group=2, turns=3, system_words=200, seed=21)
    before = _metric(proxy, "litellm_kv_prediction_checks_total")
    stats = asyncio.run(run_workload(proxy.url, MASTER_KEY, KV, convs, label="litellm-kv stream+tools",
                                     concurrency=2, stream=True, tools=True))
    print("\n" + format_table([stats]))
    assert stats.failures == 0
    assert stats.cached_ratio > 0.3
    after = _metric(proxy, "litellm_kv_prediction_checks_total")
    checked = sum(after.get(k, 0) - before.get(k, 0) for k in after)
    assert checked >= len(stats.results), "streamed usage must reach the verification"


def test_hot_prefix_spreads_under_load(proxy: Proxy) -> None:
    """One hot prefix at high concurrency: once the holder is loaded, the other replica gets work."""
    system = "You are the hot assistant. " + " ".join(f"rule{i} must be followed carefully" for i in range(120))

    async def run() -> dict[str, int]:
        counts: dict[str, int] = {}
        async with httpx.AsyncClient(timeout=120) as c:
            async def one(i: int) -> None:
                body = {"model": KV, "max_tokens": 24, "temperature": 0, "messages": [
                    {"role": "system", "content": system}, {"role": "user", "content": f"question {i} " * 20}]}
                r = await c.post(f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS)
                assert r.status_code == 200, r.text
                dep = r.headers.get("x-litellm-model-id", "")
                counts[dep] = counts.get(dep, 0) + 1

            await asyncio.gather(*(one(i) for i in range(24)))
        return counts

    counts = asyncio.run(run())
    print(f"\nhot prefix, 24 concurrent requests: {counts}")
    assert len(counts) == 2 and min(counts.values()) >= 3, counts


def test_replica_killed_then_restarted(proxy: Proxy, engines: list[EngineReplica]) -> None:
    victim = engines[1]
    victim.kill()
    try:
        async def run() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as c:
                out = []
                for i in range(6):
                    body = {"model": KV, "max_tokens": 4, "temperature": 0,
                            "messages": [{"role": "user", "content": f"while one replica is down {i}"}]}
                    r = await c.post(f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS)
                    out.append(r.status_code)
                return out

        codes = asyncio.run(run())
        print(f"\nstatus codes with one replica down: {codes}")
        assert codes == [200] * 6
    finally:
        victim.restart()
    # The restarted engine starts its event seq again at 0: its old entries must be gone and it must
    # be ready again.
    _wait_exact(proxy, timeout=60)
    rep = next(r for r in _health(proxy)["routing"]["groups"][KV]["replicas"] if r["replica"].endswith(
        f":{victim.port}"))
    print(f"restarted replica state: {rep}")
    assert rep["ready"]
