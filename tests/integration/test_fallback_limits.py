"""A fallback a client asks for carries no way around the limits of the group it falls back to, through a real
``litellm`` proxy process.

LiteLLM accepts ``fallbacks`` in the request body. When the first group's deployment fails, the router calls the
fallback group's deployment inside the same call, without running the pre-call hook again: before this check, a
call to a reasoning group that fell back to a vision group reached the vision engine with images no handler had
counted, under the reasoning group's record.

Two local fake upstreams stand in for the engines (``tests/support/fake_upstream.py``): one fails on purpose
(``/_fail``), and the tests read what each received. Keys are presented through ``general_settings.custom_auth``.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import start_proxy

pytestmark = pytest.mark.proxy

KEYS: dict[str, dict[str, Any]] = {"sk-client": {"key_alias": "client", "metadata": {}}}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    text, text_url = start_fake_upstream("text", "--reasoning-words", "5")
    vl, vl_url = start_fake_upstream("vl", "--image-tokens-each", "64")
    backup, backup_url = start_fake_upstream("backup", "--reasoning-words", "5")
    other, other_url = start_fake_upstream("other")
    config = {
        "model_list": [
            {"model_name": name, "litellm_params": {"model": "hosted_vllm/fake-model", "api_base": url + "/v1"}}
            for name, url in (("qwen", text_url), ("qwen-vl", vl_url), ("other", other_url),
                              ("qwen-guarded", text_url), ("qwen-backup", backup_url))
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"], "num_retries": 0},
        # The operator's own fallback between two governed groups.
        "router_settings": {"fallbacks": [{"qwen-guarded": ["qwen-backup"]}]},
        "litellm_kv": {"model_groups": {
            "qwen": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "qwen-guarded": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "qwen-backup": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "qwen-vl": {"vision": {"family": "qwen2_5_vl", "max_images_per_request": 1}},
        }},
    }
    proxy = start_proxy(config, name="litellm-fallbacks", keys=KEYS, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "text": text_url, "vl": vl_url, "other": other_url, "backup": backup_url}
    finally:
        proxy.stop()
        text.stop()
        vl.stop()
        other.stop()
        backup.stop()


def _png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (28, 28), (10, 120, 200)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _received(url: str) -> int:
    return len(httpx.get(url + "/_requests", timeout=5).json())


def _failing(url: str, status: int) -> None:
    httpx.post(url + "/_fail", json={"status": status}, timeout=5).raise_for_status()


def _chat_while_the_text_engine_fails(stack: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
    """A chat request sent while the reasoning groups' engine answers 500 (so the router falls back)."""
    proxy = stack["proxy"]
    _failing(stack["text"], 500)
    try:
        return httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=proxy.headers("sk-client"),
                          timeout=60)
    finally:
        _failing(stack["text"], 0)


def test_a_fallback_to_a_group_with_other_limits_is_refused(stack: dict[str, Any]) -> None:
    """Three images to a group that allows one, reached as the fallback of a failing reasoning group."""
    images = [{"type": "image_url", "image_url": {"url": _png()}} for _ in range(3)]
    body = {"model": "qwen", "fallbacks": ["qwen-vl"],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, *images]}]}
    before = _received(stack["vl"])
    r = _chat_while_the_text_engine_fails(stack, body)
    assert r.status_code >= 400, r.text
    assert "governance.unchecked_call" in r.text
    assert _received(stack["vl"]) == before  # the vision engine never saw the uncounted images


def test_a_fallback_to_an_ungoverned_group_still_works(stack: dict[str, Any]) -> None:
    body = {"model": "qwen", "fallbacks": ["other"], "messages": [{"role": "user", "content": "hi"}]}
    r = _chat_while_the_text_engine_fails(stack, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "answer from other"


def test_a_fallback_the_operator_configured_still_works(stack: dict[str, Any]) -> None:
    """``router_settings.fallbacks`` between two governed groups is the operator's choice: it goes on, with the
    limits the first group's decision wrote into the request."""
    body = {"model": "qwen-guarded", "messages": [{"role": "user", "content": "hi"}]}
    r = _chat_while_the_text_engine_fails(stack, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "answer from backup"
    up = httpx.get(stack["backup"] + "/_requests", timeout=5).json()[-1]["body"]
    assert up["thinking_token_budget"] == 50
