"""LiteLLM's pass-through routes do not reach a governed engine, through a real ``litellm`` proxy process.

LiteLLM forwards a request on ``/vllm/*``, ``/azure/*``, ``/openrouter/*`` (and its other provider routes) or on an
operator's ``pass_through_endpoints`` as written, without its pre-call hook: before this gate, ``POST
/vllm/v1/chat/completions`` with ``"model": "qwen"`` reached the engine with the client's ``chat_template_kwargs``
and ``max_tokens`` and no ``thinking_token_budget``, and its reasoning was shown to a key whose policy hides it.

Two local fake upstreams stand in for the engines (``tests/support/fake_upstream.py``): the tests read what each
received, on any path (``/_requests``, ``/_stray``), which only a capture server can show. Keys are presented
through ``general_settings.custom_auth`` (the database path cannot run here).
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
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

KEYS: dict[str, dict[str, Any]] = {
    "sk-capped": {"key_alias": "capped",
                  "metadata": {"litellm_kv": {"reasoning": {"max_budget": 5, "show_reasoning": False}}}},
}
THINK = {"messages": [{"role": "user", "content": "think hard"}], "chat_template_kwargs": {"enable_thinking": True},
         "max_tokens": 9999}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    governed, governed_url = start_fake_upstream("governed", "--reasoning-words", "20", "--report-reasoning-tokens")
    other, other_url = start_fake_upstream("other", "--reasoning-words", "20")
    isolated, isolated_url = start_fake_upstream("isolated")
    on_governed = {"model": "hosted_vllm/fake-model", "api_base": governed_url + "/v1"}
    on_isolated = {"model": "hosted_vllm/fake-model", "api_base": isolated_url + "/v1"}
    config = {
        "model_list": [
            {"model_name": "qwen", "litellm_params": on_governed},
            {"model_name": "qwen-vl", "litellm_params": on_governed},
            {"model_name": "open", "litellm_params": on_governed},  # configured without limits
            {"model_name": "second-name", "litellm_params": on_governed},  # not configured at all
            {"model_name": "other", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                       "api_base": other_url + "/v1"}},
            {"model_name": "iso", "litellm_params": on_isolated},  # KV-routed, tenants' caches apart
            {"model_name": "iso-second", "litellm_params": on_isolated},  # not configured at all
        ],
        "router_settings": {"model_group_alias": {"qwen-latest": "qwen"}},
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {
            "qwen": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "qwen-vl": {"vision": {"family": "qwen2_5_vl", "max_visual_tokens_per_request": 1000}},
            "open": {},
            "iso": {"routing": "kv", "kv": {"tenant_isolation": "key"}},
        }},
        "general_settings": {"pass_through_endpoints": [
            {"path": "/engine-direct", "target": governed_url + "/v1/chat/completions"},
            {"path": "/other-direct", "target": other_url + "/v1/chat/completions"},
        ]},
    }
    # /vllm/ without a router model goes to VLLM_API_BASE: here the governed engine.
    proxy = start_proxy(config, name="litellm-passthrough", keys=KEYS,
                        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "VLLM_API_BASE": governed_url,
                             "LITELLM_KV_SALT_SECRET": "passthrough-test-secret-" + "s" * 24})
    try:
        yield {"proxy": proxy, "governed": governed_url, "other": other_url, "isolated": isolated_url}
    finally:
        proxy.stop()
        isolated.stop()
        governed.stop()
        other.stop()


def _received(url: str) -> int:
    """Requests the upstream at ``url`` has received on any path."""
    return len(httpx.get(url + "/_requests", timeout=5).json()) + len(httpx.get(url + "/_stray", timeout=5).json())


def _last_body(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/_requests", timeout=5).json()[-1]["body"])


def _png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (28, 28), (10, 120, 200)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _post(proxy: Proxy, path: str, key: str = "sk-capped", **kwargs: Any) -> httpx.Response:
    return httpx.post(proxy.url + path, headers=proxy.headers(key), timeout=60, **kwargs)


IMAGE = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                      {"type": "image_url", "image_url": {"url": "IMAGE"}}]}]


@pytest.mark.parametrize(("path", "kwargs"), [
    ("/vllm/v1/chat/completions", {"json": {"model": "qwen", **THINK}}),
    ("/vllm/v1/chat/completions", {"json": {"model": "qwen", **THINK, "stream": True}}),
    ("/vllm/v1/chat/completions", {"json": {"model": "qwen-latest", **THINK}}),
    ("/vllm/v1/chat/completions", {"json": {"model": "second-name", **THINK}}),
    ("/vllm/v1/chat/completions", {"json": {"model": "qwen-vl", "messages": IMAGE}}),
    ("/vllm/v1/chat/completions", {"json": THINK}),  # no model: VLLM_API_BASE, the governed engine
    ("/vllm/v1/chat/completions", {"json": {"model": "not-a-router-model", **THINK}}),
    ("/vllm/v1/chat/completions", {"json": THINK, "params": {"model": "qwen"}}),
    ("/vllm/v1/chat/completions", {"data": {"model": "qwen", "prompt": "x"}}),  # a form
    ("/azure/openai/deployments/qwen/chat/completions", {"json": {"model": "qwen", **THINK}}),
    ("/azure/openai/deployments/qwen/chat/completions", {"json": THINK}),  # the model in the path only
    ("/openrouter/v1/chat/completions", {"json": {"model": "qwen", **THINK}}),
    ("/anthropic/v1/messages", {"json": {"model": "qwen", "max_tokens": 50, "messages": THINK["messages"]}}),
    ("/engine-direct", {"json": {"model": "anything", **THINK}}),
], ids=["vllm", "vllm-stream", "alias", "second-name", "vision", "vllm-env-target", "vllm-unknown-model",
        "query-model", "form-model", "azure", "azure-path-only", "openrouter", "anthropic", "configured-endpoint"])
def test_a_pass_through_route_never_reaches_a_governed_engine(stack: dict[str, Any], path: str,
                                                               kwargs: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    if "json" in kwargs and kwargs["json"].get("messages") is IMAGE:
        kwargs = {"json": {**kwargs["json"], "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": _png()}}]}]}}
    before = _received(stack["governed"]), _received(stack["other"])
    r = _post(proxy, path, **kwargs)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "governance.passthrough"
    assert "pass-through route" in error["message"] and "/v1/chat/completions" in error["message"]
    assert (_received(stack["governed"]), _received(stack["other"])) == before  # nothing reached either engine
    refused = proxy.metric_by("litellm_kv_passthrough_refused_total", "model_group")
    assert set(refused) <= {"qwen", "qwen-vl", "iso"} and sum(refused.values()) >= 1


def test_pass_through_routes_to_other_engines_still_work(stack: dict[str, Any]) -> None:
    """The gate refuses only what reaches a governed engine: an ungoverned group's pass-through is as before,
    and so is a name the operator configured without limits (as on /v1/chat/completions)."""
    proxy = stack["proxy"]
    r = _post(proxy, "/vllm/v1/chat/completions", json={"model": "other", **THINK})
    assert r.status_code == 200, r.text
    assert _last_body(stack["other"])["chat_template_kwargs"] == {"enable_thinking": True}  # as written
    r = _post(proxy, "/other-direct", json={"model": "fake-model", **THINK})
    assert r.status_code == 200, r.text
    before = _received(stack["governed"])
    r = _post(proxy, "/vllm/v1/chat/completions", json={"model": "open", **THINK})
    assert r.status_code == 200, r.text
    assert _received(stack["governed"]) == before + 1


def test_litellm_s_own_health_checks_still_reach_governed_engines(stack: dict[str, Any]) -> None:
    """A call that skipped the pre-call hook is refused at the deployment when a client made it; LiteLLM's own
    health checks name no group and are not."""
    proxy = stack["proxy"]
    r = httpx.get(proxy.url + "/health", headers=proxy.headers(), timeout=60)
    assert r.status_code == 200, r.text
    health = r.json()
    assert health["unhealthy_endpoints"] == [], health["unhealthy_endpoints"]
    assert len(health["healthy_endpoints"]) == 7


def test_the_chat_route_under_the_openai_prefix_applies_the_limits(stack: dict[str, Any]) -> None:
    """``/openai/deployments/{model}/chat/completions`` is the proxy's own chat route (not a pass-through): it
    runs the hooks, so it is served with the limits applied."""
    r = _post(stack["proxy"], "/openai/deployments/qwen/chat/completions", json={"model": "qwen", **THINK})
    assert r.status_code == 200, r.text
    assert _last_body(stack["governed"])["thinking_token_budget"] == 5
    assert not r.json()["choices"][0]["message"].get("reasoning_content")  # show_reasoning: false


@pytest.mark.parametrize(("path", "body", "limit"), [
    ("/v1/completions", {"model": "qwen", "prompt": "<think>", "max_tokens": 9999}, "reasoning.endpoint"),
    ("/v1/embeddings", {"model": "qwen", "input": "x"}, "reasoning.endpoint"),
    ("/v1/completions", {"model": "qwen-vl", "prompt": "x"}, "vision.endpoint"),
    ("/v1/embeddings", {"model": "qwen-vl", "input": "x"}, "vision.endpoint"),
], ids=["completions-reasoning", "embeddings-reasoning", "completions-vision", "embeddings-vision"])
def test_governed_groups_serve_chat_completions_only(stack: dict[str, Any], path: str, body: dict[str, Any],
                                                     limit: str) -> None:
    """Before, /v1/completions reached the engine on a reasoning group: thinking in its text was neither measured,
    charged to the reasoning budgets nor hidden."""
    before = _received(stack["governed"])
    r = _post(stack["proxy"], path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == limit
    assert path in r.json()["error"]["message"]
    assert _received(stack["governed"]) == before
    r = _post(stack["proxy"], path, json={**body, "model": "other"})  # an ungoverned group: LiteLLM's as before
    assert r.json().get("error", {}).get("param") != limit


@pytest.mark.parametrize(("model", "limit"), [("qwen", "reasoning.endpoint"), ("qwen-vl", "vision.endpoint")])
def test_a_realtime_session_on_a_governed_group_is_refused(stack: dict[str, Any], model: str, limit: str) -> None:
    """LiteLLM's realtime websocket (``/v1/realtime?model=…``) runs the pre-call hook with call type ``_arealtime``:
    a governed group refuses it with an error event naming the limit, and closes before anything reaches the engine.
    A real websocket client against the real proxy."""
    import asyncio
    import json

    import websockets

    async def session() -> list[Any]:
        url = stack["proxy"].url.replace("http://", "ws://") + f"/v1/realtime?model={model}"
        got: list[Any] = []
        async with websockets.connect(url, additional_headers=stack["proxy"].headers("sk-capped"),
                                      open_timeout=20) as ws:
            try:
                while True:
                    got.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
            except websockets.ConnectionClosed as closed:
                got.append(closed.rcvd.code if closed.rcvd else None)
        return got

    before = _received(stack["governed"])
    events = asyncio.run(session())
    assert events[-1] == 1011, events  # closed by the proxy, not by a timeout
    errors = [e for e in events[:-1] if isinstance(e, dict) and e.get("type") == "error"]
    assert errors and limit in errors[0]["error"]["message"] and "_arealtime" in errors[0]["error"]["message"], events
    assert _received(stack["governed"]) == before


def test_tenant_cache_isolation_is_not_skipped_by_a_pass_through_route_or_another_name(stack: dict[str, Any]) -> None:
    """A KV-routed group with ``tenant_isolation`` gets each tenant's ``cache_salt`` in the pre-call hook. A
    pass-through route or a second name over its engines would reach them unsalted, sharing one cache across
    tenants: both are refused as for groups with limits, and the group's own name is served salted."""
    proxy, isolated = stack["proxy"], stack["isolated"]
    before = _received(isolated)
    r = _post(proxy, "/vllm/v1/chat/completions", json={"model": "iso", "messages": THINK["messages"]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "governance.passthrough", r.text
    r = _post(proxy, "/v1/chat/completions", json={"model": "iso-second", "messages": THINK["messages"]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "governance.model_name" and "cache isolation" in error["message"], error
    assert _received(isolated) == before  # neither reached the engine
    r = _post(proxy, "/v1/chat/completions",
              json={"model": "iso", "messages": THINK["messages"], "cache_salt": "chosen-by-the-client"})
    assert r.status_code == 200, r.text
    salt = _last_body(isolated).get("cache_salt")
    assert isinstance(salt, str) and len(salt) == 48 and salt != "chosen-by-the-client", salt
