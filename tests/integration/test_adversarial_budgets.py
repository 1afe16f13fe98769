"""Period budgets held against a hostile client, through a real ``litellm`` proxy process and a real
redis-server.

Keys with metadata are presented through ``general_settings.custom_auth`` (the database path cannot
run here). The upstream is the local fake (``tests/support/fake_upstream.py``): it stands in for a
reasoning model (no reasoning model can be driven twenty times in parallel on this machine), honours
``thinking_token_budget`` and answers slowly enough for concurrent requests to overlap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest

from litellm_kv.governance.budgets import Period
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import Proxy, start_proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.proxy, pytest.mark.redis]

REASONING_WORDS = 40
DAY_LIMIT = 1000


def _reasoning_key(alias: str, reasoning: dict[str, Any]) -> dict[str, Any]:
    return {"key_alias": alias, "metadata": {"litellm_kv": {"reasoning": reasoning}}}


KEYS: dict[str, dict[str, Any]] = {
    "sk-burst": _reasoning_key("burst", {"tokens_per_day": DAY_LIMIT}),
    "sk-flaky": _reasoning_key("flaky", {"tokens_per_day": DAY_LIMIT}),
}


def _usage_key(api_key: str) -> str:
    """The Redis counter of a test key's reasoning budget today (custom_auth hashes keys as 'hashed-<key>')."""
    day = Period.DAY.window_id(datetime.now(timezone.utc))
    return f"litellm_kv:budget:{{key:hashed-{api_key}}}:reasoning_tokens:day:{day}"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-adversarial-budgets")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer) -> Iterator[dict[str, Any]]:
    upstream, upstream_url = start_fake_upstream(
        "slow-reasoner", "--reasoning-words", str(REASONING_WORDS), "--report-reasoning-tokens",
        "--count-reasoning-in-completion", "--delay-ms", "300",
    )
    config = {
        "model_list": [{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                 "api_base": upstream_url + "/v1"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"redis_url": redis_server.url, "model_groups": {"qwen": {"reasoning": {"style": "vllm"}}}},
    }
    proxy = start_proxy(config, name="litellm-adversarial-budgets", keys=KEYS,
                        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "upstream": upstream_url, "redis": redis_server}
    finally:
        proxy.stop()
        upstream.stop()


async def _parallel_chats(proxy: Proxy, key: str, n: int) -> list[httpx.Response]:
    payload = {"model": "qwen", "messages": [{"role": "user", "content": "think hard"}]}
    async with httpx.AsyncClient(timeout=120) as client:
        return list(await asyncio.gather(*[
            client.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(key))
            for _ in range(n)
        ]))


def test_tokens_per_day_is_not_overspent_by_concurrent_requests(stack: dict[str, Any]) -> None:
    """The limit `reasoning.tokens_per_day`: twenty parallel requests on a budget with 50 tokens left.

    Each one is granted only what neither usage nor the others' holds take, so together they think at
    most 50 tokens (the fake, like vLLM, stops thinking at ``thinking_token_budget``: the documented
    overshoot is what requests use beyond their hold, here none)."""
    r = stack["redis"].client()
    key = _usage_key("sk-burst")
    r.set(key, DAY_LIMIT - 50, ex=3 * 86400)
    responses = asyncio.run(_parallel_chats(stack["proxy"], "sk-burst", 20))
    assert {resp.status_code for resp in responses} <= {200, 429}, [resp.text for resp in responses]
    assert any(resp.status_code == 200 for resp in responses)
    used = int(r.get(key) or 0)
    assert used <= DAY_LIMIT, f"{used - DAY_LIMIT} tokens over the tokens_per_day limit"
    assert used > DAY_LIMIT - 50  # what was left was used, not lost to holds
    assert r.hlen(key + ":holds") == 0  # every hold was settled
    for resp in responses:
        if resp.status_code == 429:
            assert "reasoning.tokens_per_day" in resp.text or "Reasoning token budget spent" in resp.text


def test_tokens_per_day_hold_is_released_when_the_call_fails(stack: dict[str, Any]) -> None:
    """The limit `reasoning.tokens_per_day`: a failed call gives its hold back, so the budget it held
    is not lost to the key."""
    r = stack["redis"].client()
    key = _usage_key("sk-flaky")
    httpx.post(stack["upstream"] + "/_fail", json={"status": 500}, timeout=5)
    try:
        failed = httpx.post(stack["proxy"].url + "/v1/chat/completions", timeout=60,
                            headers=stack["proxy"].headers("sk-flaky"),
                            json={"model": "qwen", "messages": [{"role": "user", "content": "x"}]})
    finally:
        httpx.post(stack["upstream"] + "/_fail", json={"status": 0}, timeout=5)
    assert failed.status_code >= 500
    for _ in range(40):  # the failure is logged (and the hold released) after the response
        if r.hlen(key + ":holds") == 0:
            break
        time.sleep(0.25)
    assert r.hlen(key + ":holds") == 0
    assert int(r.get(key) or 0) == 0
