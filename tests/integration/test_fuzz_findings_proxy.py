"""What fuzzing the request readers found or relies on (``tests/governance/test_fuzz_readers.py``), through
a real ``litellm`` proxy process: each case is a request a client can send and the reasoning limit it names.

The upstream is the local capture server (``tests/support/fake_upstream.py``) standing in for a vLLM
reasoning engine: these tests read the body the engine received (``GET /_requests``), which only a capture
server can show. Keys with metadata come through ``general_settings.custom_auth`` (no database here).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

MAX_BUDGET = 5
KEYS: dict[str, dict[str, Any]] = {
    "sk-plain": {"key_alias": "plain", "metadata": {}},
    "sk-no-thinking": {"key_alias": "no-thinking", "metadata": {"litellm_kv": {"reasoning": {"allowed": False}}}},
}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    upstream, url = start_fake_upstream("fuzz-findings", "--reasoning-words", "5", "--report-reasoning-tokens")
    config = {
        "model_list": [{"model_name": "qwen",
                        "litellm_params": {"model": "hosted_vllm/fake-model", "api_base": url + "/v1"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {"qwen": {"reasoning": {"style": "vllm", "max_budget": MAX_BUDGET}}}},
    }
    proxy = start_proxy(config, name="litellm-fuzz-findings", keys=KEYS, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "upstream": url}
    finally:
        proxy.stop()
        upstream.stop()


def _chat(proxy: Proxy, key: str, **body: Any) -> httpx.Response:
    payload = {"model": "qwen", "messages": [{"role": "user", "content": "think about it"}], **body}
    return httpx.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(key), timeout=60)


def _sent_upstream(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/_requests", timeout=5).json()[-1]["body"])


def test_reasoning_allowed_holds_against_chat_template_kwargs_in_extra_body(stack: dict[str, Any]) -> None:
    """LiteLLM sends extra_body as top-level fields; where the proxy wrote the same field at top level, the
    proxy's reaches the engine, with its thinking switch. The in-process fuzzing relies on this order."""
    r = _chat(stack["proxy"], "sk-no-thinking", extra_body={"chat_template_kwargs": {"custom": 1}})
    assert r.status_code == 200, r.text
    up = _sent_upstream(stack["upstream"])
    assert up["chat_template_kwargs"]["enable_thinking"] is False
    assert up["thinking_token_budget"] == 0


def test_reasoning_max_budget_holds_when_chat_template_kwargs_is_not_an_object(stack: dict[str, Any]) -> None:
    """A string chat_template_kwargs used to crash the handler (a 500 for a client's typo); the proxy's own
    object replaces it, so the request is served within the key's limits."""
    r = _chat(stack["proxy"], "sk-plain", chat_template_kwargs="enable_thinking", thinking_token_budget=10**6)
    assert r.status_code == 200, r.text
    up = _sent_upstream(stack["upstream"])
    assert up["chat_template_kwargs"] == {"enable_thinking": True}
    assert up["thinking_token_budget"] == MAX_BUDGET
