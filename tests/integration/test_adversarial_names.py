"""Limits follow the deployments a name reaches, not the name the client sends (issue 18, "every name").

Through a real ``litellm`` proxy process: a ``router_settings.model_group_alias`` of a governed group,
a second ``model_name`` over its deployments and a wildcard ``model_name`` that LiteLLM resolves onto
them used to reach the same engine with no reasoning or vision limit at all. An alias now carries the
group's limits (key and config); the other names are refused with ``governance.model_name``; a group
over other deployments stays ungoverned.

Keys with metadata are presented through ``general_settings.custom_auth`` (the database path cannot run
here). The upstreams are the local fake (``tests/support/fake_upstream.py``) standing in for a reasoning
and vision engine: no such model runs on this machine, and these tests read what the upstream received
(``GET /_requests``), which only a capture server can show.
"""

from __future__ import annotations

import base64
import io
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

KEYS: dict[str, dict[str, Any]] = {
    "sk-plain": {"key_alias": "plain", "metadata": {}},
    "sk-capped": {"key_alias": "capped", "metadata": {"litellm_kv": {"reasoning": {"max_budget": 5}}}},
}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    governed, governed_url = start_fake_upstream("names-governed", "--reasoning-words", "20")
    other, other_url = start_fake_upstream("names-other", "--reasoning-words", "20")
    dep = {"model": "hosted_vllm/fake-model", "api_base": governed_url + "/v1"}
    config = {
        "model_list": [
            {"model_name": "qwen", "litellm_params": dep},
            {"model_name": "qwen-twin", "litellm_params": dep},  # a second name over the same deployment
            # ... and over the same server under another spelling of its address (127.0.0.1 in the other)
            {"model_name": "qwen-localhost", "litellm_params": {
                **dep, "api_base": governed_url.replace("127.0.0.1", "localhost") + "/v1"}},
            # ... and under this machine's host name, a DNS name (here from /etc/hosts) for one of its addresses
            {"model_name": "qwen-hostname", "litellm_params": {
                **dep, "api_base": governed_url.replace("127.0.0.1", socket.gethostname()) + "/v1"}},
            {"model_name": "wild/*", "litellm_params": {**dep, "model": "hosted_vllm/*"}},
            {"model_name": "other", "litellm_params": {**dep, "api_base": other_url + "/v1"}},
        ],
        "router_settings": {"model_group_alias": {"qwen-alias": "qwen"}},
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {
            "qwen": {"reasoning": {"style": "vllm", "max_budget": 50},
                     "vision": {"family": "qwen2_5_vl", "max_visual_tokens_per_request": 100}},
        }},
    }
    proxy = start_proxy(config, name="litellm-names", keys=KEYS, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "governed": governed_url, "other": other_url}
    finally:
        proxy.stop()
        governed.stop()
        other.stop()


def _chat(proxy: Proxy, key: str, model: str, content: Any = "think about it", **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": content}], **body}
    return httpx.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(key), timeout=60)


def _requests(url: str) -> list[dict[str, Any]]:
    return list(httpx.get(url + "/_requests", timeout=5).json())


def _image(w: int, h: int) -> list[dict[str, Any]]:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 120, 200)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return [{"type": "text", "text": "describe this"}, {"type": "image_url", "image_url": {"url": url}}]


def test_reasoning_max_budget_follows_a_model_group_alias(stack: dict[str, Any]) -> None:
    """The alias is served by 'qwen': the group's and the key's max_budget hold, the client's own fields go."""
    r = _chat(stack["proxy"], "sk-plain", "qwen-alias", reasoning_effort="high")
    assert r.status_code == 200, r.text
    assert r.headers["x-litellm-kv-reasoning-budget"] == "50"
    up = _requests(stack["governed"])[-1]["body"]
    assert up["thinking_token_budget"] == 50 and "reasoning_effort" not in up
    r = _chat(stack["proxy"], "sk-capped", "qwen-alias", extra_body={"thinking_token_budget": 400})
    assert r.status_code == 200, r.text
    assert _requests(stack["governed"])[-1]["body"]["thinking_token_budget"] == 5


def test_vision_max_visual_tokens_follows_a_model_group_alias(stack: dict[str, Any]) -> None:
    sent = len(_requests(stack["governed"]))
    r = _chat(stack["proxy"], "sk-plain", "qwen-alias", _image(560, 560))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "vision.max_visual_tokens_per_request"
    assert len(_requests(stack["governed"])) == sent


@pytest.mark.parametrize("model", ["qwen-twin", "qwen-localhost", "qwen-hostname", "wild/fake-model",
                                   "hosted_vllm/fake-model"])
def test_governed_limits_cannot_be_skipped_by_another_name_over_the_same_deployments(
    stack: dict[str, Any], model: str
) -> None:
    """A second model_name, a second name over the engine under another spelling of its address (``localhost``; the
    group's deployment says ``127.0.0.1``), a wildcard over qwen's deployment and the deployments' own
    ``litellm_params.model`` (which LiteLLM's router also routes by) have no entry of their own: refused, with the
    name's own message (the last was caught before only at the deployment, as a call that skipped the checks; the
    ``localhost`` name and the host-name one were served without the group's reasoning budget while servers were
    compared as written). The host name is resolved through DNS as LiteLLM would; where this machine's name does
    not resolve, that case is skipped."""
    if model == "qwen-hostname":
        try:
            socket.getaddrinfo(socket.gethostname(), None)
        except OSError:
            pytest.skip("this machine's host name does not resolve")
    sent = len(_requests(stack["governed"]))
    r = _chat(stack["proxy"], "sk-plain", model, reasoning_effort="high")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "governance.model_name"
    assert "'qwen'" in err["message"] and "reasoning and vision limits" in err["message"]
    assert len(_requests(stack["governed"])) == sent  # never reached the engine


def test_a_group_over_other_deployments_stays_ungoverned(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-capped", "other", extra_body={"thinking_token_budget": 400})
    assert r.status_code == 200, r.text
    assert "x-litellm-kv-reasoning-budget" not in r.headers
    assert _requests(stack["other"])[-1]["body"]["thinking_token_budget"] == 400  # as the client sent it


@pytest.mark.parametrize("body", [
    {"model": "qwen,other"},
    {"model": "other, qwen"},
    {"model": "qwen,"},
    {"model": "other,qwen-alias"},
    {"model": "qwen,other", "fastest_response": True},
], ids=["batch", "batch-reversed", "batch-of-one", "batch-with-alias", "fastest-response"])
def test_governed_limits_cannot_be_skipped_by_a_batch_of_models(stack: dict[str, Any], body: dict[str, Any]) -> None:
    """LiteLLM serves a chat whose model lists several names separated by commas as one call to each (its batch
    completion, or the first to answer with ``fastest_response``), with the body as the client wrote it. Before, the
    governed line reached its engine unbudgeted (``{"model": "qwen,other"}``: thinking on, no
    ``thinking_token_budget``, its reasoning returned): the pre-call hook saw no group it knew, and the deployment
    check read the group from request metadata the batch's lines share, which the other line had overwritten by the
    time the router retried the refused one. Now refused when any of the names reaches a governed group."""
    sent = len(_requests(stack["governed"]))
    think = {"messages": [{"role": "user", "content": "think hard"}], "max_tokens": 999,
             "chat_template_kwargs": {"enable_thinking": True}}
    r = httpx.post(stack["proxy"].url + "/v1/chat/completions", json={**think, **body},
                   headers=stack["proxy"].headers("sk-capped"), timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "governance.model_name", err
    assert "'qwen'" in err["message"]
    assert len(_requests(stack["governed"])) == sent  # never reached the engine


def test_a_batch_of_ungoverned_models_is_still_served(stack: dict[str, Any]) -> None:
    r = httpx.post(stack["proxy"].url + "/v1/chat/completions", headers=stack["proxy"].headers("sk-capped"),
                   json={"model": "other,other", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), list) and len(r.json()) == 2
