"""Period budgets in a Redis that loses them: one that deletes keys when full, and one restarted without
persistence, through a real ``litellm`` proxy process, a real redis-server (its policy set at run time,
evictions forced by filling it; restarted by its PID) and the local fake reasoning upstream.

Budget counters carry a TTL, so every eviction policy but ``noeviction`` may delete them, and a deleted counter
is a budget spent again. The proxy reads the Redis's policy and eviction count (``INFO``) every
``redis_eviction_check_s``: a Redis that may delete them is reported; once it has deleted keys, requests that
need a period budget are refused until its policy is fixed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.index.test_redis_eviction import cap_memory, fill_until_evicted
from tests.support.browser import admin_tab, chromium
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.proxy, pytest.mark.redis]

KEYS: dict[str, dict[str, Any]] = {
    "sk-daily": {"key_alias": "daily", "metadata": {"litellm_kv": {"reasoning": {"tokens_per_day": 10**6}}}},
    "sk-capped": {"key_alias": "capped", "metadata": {"litellm_kv": {"reasoning": {"max_budget": 20}}}},
    "sk-small": {"key_alias": "small", "metadata": {"litellm_kv": {"reasoning": {"tokens_per_day": 25}}}},
}
CHECK_S = 0.5


@pytest.fixture
def stack() -> Iterator[tuple[Proxy, RedisServer, str]]:
    redis = RedisServer(name="redis-budget-eviction")
    up, url = start_fake_upstream("eviction-reasoner", "--reasoning-words", "10", "--report-reasoning-tokens",
                                  "--count-reasoning-in-completion")
    proxy = None
    try:
        config = {
            "model_list": [{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                     "api_base": url + "/v1"}}],
            "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
            "litellm_kv": {"redis_url": redis.url, "redis_eviction_check_s": CHECK_S,
                           "model_groups": {"qwen": {"reasoning": {"style": "vllm"}}}},
        }
        proxy = start_proxy(config, name="litellm-budget-eviction", keys=KEYS,
                            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        yield proxy, redis, url
    finally:
        if proxy is not None:
            proxy.stop()
        up.stop()
        redis.stop()


def _chat(proxy: Proxy, key: str) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/chat/completions", headers=proxy.headers(key), timeout=60,
                      json={"model": "qwen", "messages": [{"role": "user", "content": "think"}]})


def _eviction(proxy: Proxy) -> dict[str, Any]:
    r = httpx.get(proxy.url + "/litellm-kv/health", headers=proxy.headers(), timeout=10)
    r.raise_for_status()
    [watched] = r.json()["redis_eviction"]
    return dict(watched)


def _wait_eviction(proxy: Proxy, check: Any, what: str, timeout: float = 15) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = _eviction(proxy)
        if check(seen):
            return seen
        time.sleep(CHECK_S / 2)
    raise AssertionError(f"{what} never shown: {seen}")


def test_budgets_in_a_redis_that_evicted_keys_are_refused_until_its_policy_is_fixed(
    stack: tuple[Proxy, RedisServer, str],
) -> None:
    """The limit ``reasoning.tokens_per_day`` in a Redis whose ``maxmemory-policy`` is ``volatile-lru`` (what
    managed Redis services start with)."""
    proxy, redis, upstream = stack
    r = redis.client()
    assert _chat(proxy, "sk-daily").status_code == 200
    cap_memory(r, "volatile-lru")
    r.config_resetstat()
    risk = _wait_eviction(proxy, lambda s: s["may_evict"] == ["budgets"], "the eviction risk")
    assert risk["policy"] == "volatile-lru" and risk["problems"] == {}
    assert _chat(proxy, "sk-daily").status_code == 200  # a risk only: nothing was deleted yet
    assert proxy.metric_by("litellm_kv_redis_may_evict", "use") == {"budgets": 1.0}

    fill_until_evicted(r, ttl=True)
    _wait_eviction(proxy, lambda s: "budgets" in s["problems"], "the evicted budgets")
    before = httpx.get(upstream + "/_requests", timeout=5).json()
    refused = _chat(proxy, "sk-daily")
    assert refused.status_code == 503, refused.text
    assert "reasoning.store" in refused.text and "maxmemory-policy volatile-lru" in refused.text
    assert "retry-after" not in {h.lower() for h in refused.headers}
    assert httpx.get(upstream + "/_requests", timeout=5).json() == before, "a refused request reached the engine"
    assert _chat(proxy, "sk-capped").status_code == 200  # no period budget: nothing kept in Redis for it
    assert proxy.metric_by("litellm_kv_redis_evicted_keys", "use")["budgets"] > 0
    assert "once full it deletes keys of budgets" in proxy.proc.log_tail(200_000)

    with chromium() as browser:
        page = admin_tab(browser, proxy.url, MASTER_KEY, "fleet")
        notice = page.locator("#fleet-eviction")
        expect(notice).to_be_visible()
        expect(notice).to_contain_text("maxmemory-policy volatile-lru")
        expect(notice).to_contain_text("budgets: the Redis at")
        assert "error" in (notice.get_attribute("class") or "")

    r.config_set("maxmemory-policy", "noeviction")
    _wait_eviction(proxy, lambda s: s["problems"] == {} and s["may_evict"] == [], "the fixed policy")
    assert _chat(proxy, "sk-daily").status_code == 200


def test_a_spent_budget_stays_spent_when_the_redis_restarts_empty(stack: tuple[Proxy, RedisServer, str]) -> None:
    """The limit ``reasoning.tokens_per_day``: the Redis (no persistence, like the compose file's) restarts and
    loses every counter. The proxy saw the key's usage, so its counter is raised back before anything is granted
    from it: the key stays refused instead of spending its budget again."""
    proxy, redis, _ = stack
    codes = [_chat(proxy, "sk-small").status_code for _ in range(4)]  # 10 + 10 + 5 reasoning tokens, then spent
    assert codes == [200, 200, 200, 429], codes
    [counter] = [k for k in redis.client().scan_iter("litellm_kv:budget:*:day:*") if b":hold" not in k]
    assert int(redis.client().get(counter) or 0) == 25
    restored = proxy.metric_by("litellm_kv_budget_usage_restored_total", "").get("", 0.0)
    redis.restart()
    assert redis.client().get(counter) is None  # the restart lost it
    after = _chat(proxy, "sk-small")
    assert after.status_code == 429, after.text
    assert int(redis.client().get(counter) or 0) == 25
    assert proxy.metric_by("litellm_kv_budget_usage_restored_total", "").get("", 0.0) - restored == 25
