"""An upstream the client names itself does not reach a governed engine, through a real ``litellm`` proxy process.

With ``general_settings.allow_client_side_credentials`` LiteLLM lets a request carry its own ``api_base`` or a
``user_config`` model list. Before this check, ``"model": "hosted_vllm/fake-model", "api_base": <a governed
engine>`` was served there with none of the group's limits: the name is no group's, so nothing governed it.

Two local fake upstreams stand in for the engines (``tests/support/fake_upstream.py``); the tests read what each
received on any path, which only a capture server can show.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import start_proxy

pytestmark = pytest.mark.proxy

THINK = {"messages": [{"role": "user", "content": "think hard"}], "chat_template_kwargs": {"enable_thinking": True},
         "max_tokens": 9999}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    governed, governed_url = start_fake_upstream("governed", "--reasoning-words", "20")
    other, other_url = start_fake_upstream("other", "--reasoning-words", "20")
    config = {
        "model_list": [{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                  "api_base": governed_url + "/v1"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {"qwen": {"reasoning": {"style": "vllm", "max_budget": 50}}}},
        "general_settings": {"allow_client_side_credentials": True},
    }
    proxy = start_proxy(config, name="litellm-client-upstream", env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "governed": governed_url, "other": other_url}
    finally:
        proxy.stop()
        governed.stop()
        other.stop()


def _received(url: str) -> int:
    return len(httpx.get(url + "/_requests", timeout=5).json()) + len(httpx.get(url + "/_stray", timeout=5).json())


def _chat(stack: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
    proxy = stack["proxy"]
    return httpx.post(proxy.url + "/v1/chat/completions", json={**THINK, **body}, headers=proxy.headers(), timeout=60)


@pytest.mark.parametrize("body", [
    {"model": "hosted_vllm/fake-model", "api_base": "{governed}/v1"},
    {"model": "hosted_vllm/fake-model", "base_url": "{governed}/v1"},
    {"model": "qwen", "api_base": "{governed}/v1"},
    {"model": "free", "user_config": {"model_list": [{"model_name": "free", "litellm_params": {
        "model": "hosted_vllm/fake-model", "api_base": "{governed}/v1"}}]}},
], ids=["api_base", "base_url", "governed-name", "user_config"])
def test_a_client_chosen_upstream_never_reaches_a_governed_engine(stack: dict[str, Any], body: dict[str, Any]) -> None:
    body = _filled(body, stack["governed"])
    before = _received(stack["governed"])
    r = _chat(stack, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "governance.client_upstream"
    assert _received(stack["governed"]) == before


def test_a_client_chosen_upstream_elsewhere_is_served_as_before(stack: dict[str, Any]) -> None:
    before = _received(stack["other"])
    r = _chat(stack, {"model": "hosted_vllm/fake-model", "api_base": stack["other"] + "/v1"})
    assert r.status_code == 200, r.text
    assert _received(stack["other"]) == before + 1


def _filled(value: Any, governed: str) -> Any:
    if isinstance(value, str):
        return value.replace("{governed}", governed)
    if isinstance(value, dict):
        return {k: _filled(v, governed) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, governed) for v in value]
    return value
