"""Period budgets on a proxy served by several worker processes (``litellm --num_workers 3``), through real
``litellm`` proxy processes, a real redis-server and the local fake reasoning upstream.

Each request opens a new connection, so the workers' accept queue spreads them over the workers, as a
load balancer's connections would be. Before this was guarded, three workers without a Redis each kept the
key's budget in memory and served it nearly three times over (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
from litellm.proxy._types import UserAPIKeyAuth
from playwright.sync_api import expect

from litellm_kv.governance.budgets import Period
from tests.support.browser import admin_tab, chromium
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.proxy, pytest.mark.redis]

WORKERS = 3
REASONING_WORDS = 40
DAY_LIMIT = 400
REQUESTS = 24  # enough for every worker to be asked several times

KEYS: dict[str, dict[str, Any]] = {
    "sk-daily": {"key_alias": "daily", "metadata": {"litellm_kv": {"reasoning": {"tokens_per_day": DAY_LIMIT}}}},
    "sk-capped": {"key_alias": "capped", "metadata": {"litellm_kv": {"reasoning": {"max_budget": 20}}}},
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    proc, url = start_fake_upstream("workers-reasoner", "--reasoning-words", str(REASONING_WORDS),
                                    "--report-reasoning-tokens", "--count-reasoning-in-completion")
    try:
        yield url
    finally:
        proc.stop()


def _proxy(upstream: str, name: str, redis_url: str | None = None) -> Proxy:
    section: dict[str, Any] = {"model_groups": {"qwen": {"reasoning": {"style": "vllm"}}}}
    if redis_url:
        section["redis_url"] = redis_url
    config = {
        "model_list": [{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                 "api_base": upstream + "/v1"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": section,
    }
    return start_proxy(config, name=name, keys=KEYS, workers=WORKERS, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})


def _chats(proxy: Proxy, key: str, n: int = REQUESTS) -> list[httpx.Response]:
    """``n`` requests one after the other, each on a connection of its own (so the workers share them)."""
    out = []
    for i in range(n):
        with httpx.Client(timeout=60) as client:
            out.append(client.post(proxy.url + "/v1/chat/completions", headers=proxy.headers(key),
                                   json={"model": "qwen", "messages": [{"role": "user", "content": f"think {i}"}]}))
    return out


def _reasoning(resp: httpx.Response) -> int:
    details = resp.json().get("usage", {}).get("completion_tokens_details") or {}
    return int(details.get("reasoning_tokens") or 0)


def _workers(proxy: Proxy) -> dict[str, Any]:
    r = httpx.get(proxy.url + "/litellm-kv/health", headers=proxy.headers(), timeout=10)
    r.raise_for_status()
    return dict(r.json()["workers"])


def _page_warns(proxy: Proxy) -> None:
    """The admin page's fleet tab, in a real headless Chromium, says what each worker keeps for itself."""
    with chromium() as browser:
        page = admin_tab(browser, proxy.url, MASTER_KEY, "fleet")
        warning = page.locator("#fleet-workers")
        expect(warning).to_be_visible()
        expect(warning).to_contain_text("3 worker processes (NUM_WORKERS)")
        expect(warning.locator("li")).to_have_count(1)
        expect(warning.locator("li")).to_contain_text("period budgets")


def test_without_a_redis_period_budgets_are_refused_not_multiplied(upstream: str) -> None:
    """The limit ``reasoning.tokens_per_day``: three workers without a Redis would each grant the whole budget,
    so a request that needs it is refused (503, no Retry-After: waiting does not help) with the fix named, and
    nothing reaches the engine. A key with a per-request limit only is served: nothing is shared there."""
    proxy = _proxy(upstream, "litellm-workers-memory")
    try:
        workers = _workers(proxy)
        assert workers["count"] == WORKERS and workers["from"] == "NUM_WORKERS"
        assert set(workers["per_worker"]) == {"period_budgets"}
        before = httpx.get(upstream + "/_requests", timeout=5).json()
        responses = _chats(proxy, "sk-daily")
        assert {r.status_code for r in responses} == {503}, [r.text for r in responses if r.status_code != 503]
        body = responses[0].text
        assert "reasoning.store" in body and "3 worker processes (NUM_WORKERS=3)" in body
        assert "litellm_kv.redis" in body
        assert "retry-after" not in {h.lower() for h in responses[0].headers}
        assert httpx.get(upstream + "/_requests", timeout=5).json() == before, "a refused request reached the engine"
        capped = _chats(proxy, "sk-capped", 6)
        assert {r.status_code for r in capped} == {200}, [r.text for r in capped]
        assert all(0 < _reasoning(r) <= 20 for r in capped)
        # One worker answers the scrape, with its own registry: each sets the gauges when it starts.
        assert proxy.metric_by("litellm_kv_unshared_state", "state") == {
            "period_budgets": 1.0, "kv_load": 0.0, "affinity_pins": 0.0}
        assert proxy.metric_by("litellm_kv_proxy_workers", "state") == {"": float(WORKERS)}
        log = proxy.proc.log_tail(200_000)
        assert log.count("3 worker processes (NUM_WORKERS=3): period budgets") == WORKERS, log[-3000:]
        _page_warns(proxy)
    finally:
        proxy.stop()


def test_with_a_redis_the_workers_share_one_budget(upstream: str) -> None:
    """The limit ``reasoning.tokens_per_day`` with a Redis: the three workers draw on one budget, so what the
    key is served in all stays within it."""
    redis = RedisServer(name="redis-workers")
    try:
        proxy = _proxy(upstream, "litellm-workers-redis", redis.url)
        try:
            assert _workers(proxy)["per_worker"] == {}
            responses = _chats(proxy, "sk-daily")
            assert {r.status_code for r in responses} <= {200, 429}, [r.text for r in responses]
            served = sum(_reasoning(r) for r in responses if r.status_code == 200)
            assert DAY_LIMIT - REASONING_WORDS < served <= DAY_LIMIT, served
            token = UserAPIKeyAuth(api_key="sk-daily", token="hashed-sk-daily").token
            day = Period.DAY.window_id(datetime.now(timezone.utc))
            used = int(redis.client().get(f"litellm_kv:budget:{{key:{token}}}:reasoning_tokens:day:{day}") or 0)
            assert used <= DAY_LIMIT
        finally:
            proxy.stop()
    finally:
        redis.stop()
