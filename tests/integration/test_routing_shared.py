"""Shared mode end to end: a ``litellm-kv indexer`` process feeds a real redis-server from two real vLLM
CPU replicas' KV events, and **two** real ``litellm`` proxy processes route from that one index (and
share in-flight load through Redis). Requests alternate between the proxies.

Also the failure path: Redis stopped mid-run → every request still succeeds (load-only choice, counted as
``index_unavailable``), and routing is exact again once Redis is back and the indexer has re-learned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.index.test_redis_eviction import cap_memory, fill_until_evicted
from tests.integration.test_routing_e2e import DEFAULT, KV, _assert_checked_exact, _chat, _config, _metric, _reset
from tools.harness.engines import EngineReplica
from tools.harness.indexer import running_indexer
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxies
from tools.harness.redis_server import RedisServer
from tools.harness.workload import COMPARISON, COMPARISON_SEEDS, format_table, make_workload, run_workload

pytestmark = [pytest.mark.engine, pytest.mark.proxy, pytest.mark.redis]
HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}


@pytest.fixture(scope="module")
def redis_srv() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-routing-shared")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def indexer(redis_srv: RedisServer, engines: list[EngineReplica]) -> Iterator[str]:
    with running_indexer(redis_srv.url, {KV: [e.api_base for e in engines]}, "indexer-routing-shared") as url:
        yield url


@pytest.fixture(scope="module")
def proxies(engines: list[EngineReplica], engine_model: Any, redis_srv: RedisServer,
            indexer: str) -> Iterator[list[Proxy]]:
    cfg = _config(engines, str(engine_model))
    cfg["litellm_kv"]["mode"] = "shared"
    cfg["litellm_kv"]["redis_url"] = redis_srv.url
    # This module measures routing quality; a lookup past the routing deadline falls back to load (tested
    # in test_redis_faults.py), which two proxies, an indexer and two engines on 2 cores can cause.
    cfg["litellm_kv"]["redis_routing"] = {"deadline_ms": 500}
    cfg["litellm_kv"]["redis_eviction_check_s"] = 0.5  # the last test makes the Redis evict keys
    started: list[Proxy] = []
    try:
        started = start_proxies([cfg, cfg], ["shared-proxy-a", "shared-proxy-b"])
        for p in started:
            _wait_ready(p)
        yield started
    finally:
        for p in started:
            p.stop()


def _wait_ready(p: Proxy, timeout: float = 60) -> None:
    assert p.wait_kv_exact(KV, timeout)["mode"] == "shared"


def _wait_indexer(url: str, timeout: float = 60) -> float:
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).json()["status"] == "ok":
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError("indexer did not recover")


def test_two_shared_proxies_beat_simple_shuffle(proxies: list[Proxy], engines: list[EngineReplica],
                                                indexer: str) -> None:
    workloads = [make_workload(**COMPARISON, seed=seed) for seed in COMPARISON_SEEDS]
    urls = [p.url for p in proxies]

    async def run() -> tuple[Any, Any]:
        base = kv = None
        for convs in workloads:  # caches reset before every run: each workload starts cold
            _reset(engines)
            b = await run_workload(urls, MASTER_KEY, DEFAULT, convs, label="simple-shuffle (2 proxies)",
                                   concurrency=3)
            _reset(engines)
            await asyncio.sleep(1.0)  # the indexer applies the AllBlocksCleared events
            k = await run_workload(urls, MASTER_KEY, KV, convs, label="litellm-kv shared (2 proxies)",
                                   concurrency=3)
            base, kv = (b, k) if base is None or kv is None else (base + b, kv + k)
        return base, kv

    before = [_metric(p, "litellm_kv_prediction_checks_total") for p in proxies]
    base, kv = asyncio.run(run())
    print("\n" + format_table([base, kv]))
    assert base.failures == 0 and kv.failures == 0
    print(f"cached-token ratio = {kv.cached_ratio / max(base.cached_ratio, 1e-9):.2f}x")
    assert kv.cached_ratio >= 1.5 * base.cached_ratio
    exact = total = 0.0
    for p, b in zip(proxies, before, strict=True):
        after = _metric(p, "litellm_kv_prediction_checks_total")
        for k, v in after.items():
            d = v - b.get(k, 0)
            total += d if 'outcome="fallback"' not in k else 0
            exact += d if 'outcome="exact"' in k else 0
    print(f"predictions across both proxies: {exact:.0f}/{total:.0f} exact")
    assert total >= len(kv.results) and exact / total >= 0.8


def test_proxies_stop_asking_for_reannouncements_once_the_indexer_follows_every_stream_whole(
    proxies: list[Proxy], engines: list[EngineReplica], indexer: str
) -> None:
    """``report_mode_full: "auto"`` in shared mode: the indexer marks each stream it follows whole in Redis (here
    from the caches' reset), every proxy reads the marks, and requests stop asking the engines to re-announce
    their hits; the index stays exact without them."""
    _reset(engines)
    for p in proxies:
        p.proc.wait_until(lambda p=p: all(r["stream_complete"] for r in p.kv_health(KV)["replicas"]), 15,
                          "the indexer's whole-stream marks read by the proxy")
        assert p.kv_health(KV)["reannounce"] is False

    def reannounced() -> int:
        health = httpx.get(indexer + "/health", timeout=5).json()
        return sum(int(s["reannounced"]) for r in health["replicas"] for s in r["streams"])

    body = {"model": KV, "max_tokens": 4, "messages": [{"role": "user", "content": "no re-announcement " * 40}]}
    before = reannounced()
    checks_before = [_metric(p, "litellm_kv_prediction_checks_total") for p in proxies]
    cached = []
    for i in range(4):
        resp = httpx.post(f"{proxies[i % 2].url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
        assert resp.status_code == 200, resp.text
        cached.append(int(resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0))
    assert cached[-1] > 0, cached
    time.sleep(1.0)  # the hits' events, had any been re-announced
    assert reannounced() == before, "the engines re-announced hits no proxy asked them to"
    key = f'litellm_kv_prediction_checks_total{{model_group="{KV}",outcome="exact"}}'
    exact = sum(_metric(p, "litellm_kv_prediction_checks_total").get(key, 0) - b.get(key, 0)
                for p, b in zip(proxies, checks_before, strict=True))
    assert exact == 4


def test_a_decision_takes_the_round_trip_made_while_litellm_authenticates(proxies: list[Proxy]) -> None:
    """``early_lookup_max_age_ms`` (on by default in shared mode): a long prompt's index round trip is made from the
    body's arrival, the decision takes that answer instead of making its own, and the prediction it routes with is
    still the engine's (the second request's predicted cached tokens are those the engine reports)."""
    p = proxies[0]
    system = " ".join(f"lookup{i} early" for i in range(300))  # ~5K characters, never sent before

    def msgs(turn: int) -> list[dict[str, Any]]:
        return [{"role": "system", "content": system}, {"role": "user", "content": f"turn {turn}"}]

    def predicted() -> dict[str, int]:
        r = httpx.post(f"{p.url}/litellm-kv/route", json={"model": KV, "messages": msgs(1)}, headers=HEADERS,
                       timeout=30)
        r.raise_for_status()
        return dict(r.json()["hit_tokens"])

    before = _metric(p, "litellm_kv_early_lookups_total")
    checks = _metric(p, "litellm_kv_prediction_checks_total")
    r = _chat(p, KV, msgs(0))
    assert r.status_code == 200, r.text
    p.proc.wait_until(lambda: bool(predicted()), 15, "the first prompt's blocks in the shared index")
    r = _chat(p, KV, msgs(1))
    assert r.status_code == 200, r.text
    assert int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0) > 0
    after = _metric(p, "litellm_kv_early_lookups_total")
    took = {k: after[k] - before.get(k, 0) for k in after if f'model_group="{KV}"' in k and after[k] > before.get(k, 0)}
    print(f"\nearly lookups: {took}")
    assert sum(took.values()) == 2, took  # one per request, each taken by its decision
    used = f'litellm_kv_early_lookups_total{{model_group="{KV}",outcome="used"}}'
    stale = f'litellm_kv_early_lookups_total{{model_group="{KV}",outcome="stale"}}'
    assert took.get(used, 0) >= 1 and took.get(used, 0) + took.get(stale, 0) == 2, took  # stale: a slow machine
    _assert_checked_exact(p, checks, 2)


def test_redis_outage_keeps_requests_flowing(proxies: list[Proxy], redis_srv: RedisServer, indexer: str) -> None:
    def send(n: int, tag: str) -> list[int]:
        async def go() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as c:
                codes = []
                for i in range(n):
                    body = {"model": KV, "max_tokens": 4, "temperature": 0, "messages": [
                        {"role": "system", "content": "outage drill " * 80},
                        {"role": "user", "content": f"{tag} {i}"}]}
                    r = await c.post(f"{proxies[i % 2].url}/v1/chat/completions", json=body, headers=HEADERS)
                    codes.append(r.status_code)
                return codes

        return asyncio.run(go())

    before = sum(v for p in proxies for k, v in _metric(p, "litellm_kv_routing_fallbacks_total").items()
                 if 'why="index_unavailable"' in k)
    redis_srv.stop()
    try:
        codes = send(6, "during outage")
        print(f"\nstatus codes while Redis is down: {codes}")
        assert codes == [200] * 6
        after = sum(v for p in proxies for k, v in _metric(p, "litellm_kv_routing_fallbacks_total").items()
                    if 'why="index_unavailable"' in k)
        assert after - before >= 6, "outage decisions must be counted as load-only fallbacks"
    finally:
        redis_srv.start()
    took = _wait_indexer(indexer)
    print(f"indexer healthy again {took:.1f}s after Redis came back")
    # Routing is exact again: a repeated prompt is predicted and hit.
    decisions_before = sum(v for p in proxies for k, v in _metric(p, "litellm_kv_routing_decisions_total").items()
                           if 'reason="cache"' in k)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert send(2, "after recovery") == [200, 200]
        now = sum(v for p in proxies for k, v in _metric(p, "litellm_kv_routing_decisions_total").items()
                  if 'reason="cache"' in k)
        if now > decisions_before:
            break
        time.sleep(1.0)
    else:
        raise AssertionError("no cache-routed decision after Redis recovered")
    print(f"cache-routed decisions resumed {time.monotonic() - deadline + 60:.1f}s after the indexer recovered")


def test_an_index_in_a_redis_that_evicted_keys_routes_load_only(proxies: list[Proxy], redis_srv: RedisServer) -> None:
    """Last in the module: it makes the shared Redis delete keys, the index's among them. With
    ``maxmemory-policy allkeys-lru`` a full Redis deletes any key, so once it has, the index may miss entries and
    every proxy routes the group by load, saying why; with the policy fixed, they route by cache again."""
    r = redis_srv.client()
    cap_memory(r, "allkeys-lru")
    try:
        fill_until_evicted(r, ttl=False)
        for p in proxies:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                health = p.kv_health(KV)
                if not health["exact"]:
                    break
                time.sleep(0.25)
            assert "maxmemory-policy allkeys-lru" in str(health["not_exact_why"]), health["not_exact_why"]
            assert "index entries" in str(health["not_exact_why"])
            assert health["reannounce"] is True  # an index that loses entries re-learns held blocks from hits
        body = {"model": KV, "max_tokens": 4, "messages": [{"role": "user", "content": "after the eviction"}]}
        resp = httpx.post(f"{proxies[0].url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
        assert resp.status_code == 200, resp.text
    finally:
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", "0")
        for key in r.scan_iter("filler:*", count=1000):
            r.delete(key)
    for p in proxies:
        _wait_ready(p)
