"""An upstream the client names itself does not reach a governed engine, through a real ``litellm`` proxy process.

With ``general_settings.allow_client_side_credentials`` LiteLLM lets a request carry its own ``api_base`` or a
``user_config`` model list. Before this check, ``"model": "hosted_vllm/fake-model", "api_base": <a governed
engine>`` was served there with none of the group's limits: the name is no group's, so nothing governed it.

Two local fake upstreams stand in for the engines (``tests/support/fake_upstream.py``); the tests read what each
received on any path, which only a capture server can show.
"""

from __future__ import annotations

import socket
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
        # A LiteLLM credential of the operator's for the governed engine (a deployment may name it instead of an
        # api_base); a client's own router can name it too.
        "credential_list": [{"credential_name": "engine-cred", "credential_info": {},
                             "credential_values": {"api_base": governed_url + "/v1", "api_key": "k"}}],
    }
    # LiteLLM's default for a hosted_vllm model without an api_base: the governed engine.
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOSTED_VLLM_API_BASE": governed_url + "/v1"}
    proxy = start_proxy(config, name="litellm-client-upstream", env=env)
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
    {"model": "free", "user_config": {"default_litellm_params": {"api_base": "{governed}/v1"}, "model_list": [
        {"model_name": "free", "litellm_params": {"model": "hosted_vllm/fake-model"}}]}},
    {"model": "free", "user_config": {"model_list": [{"model_name": "free", "litellm_params": {
        "model": "hosted_vllm/fake-model", "base_url": "{governed}/v1"}}]}},
    {"model": "free", "user_config": {"model_list": [{"model_name": "free", "litellm_params": {
        "model": "hosted_vllm/fake-model"}}]}},
    # The engine speaks OpenAI's API; the openai provider has no default upstream of this proxy's to fall back on.
    {"model": "free", "user_config": {"model_list": [{"model_name": "free", "litellm_params": {
        "model": "openai/fake-model", "litellm_credential_name": "engine-cred"}}]}},
    {"model": "free", "user_config": {"default_litellm_params": {"litellm_credential_name": "engine-cred"},
                                      "model_list": [{"model_name": "free", "litellm_params": {
                                          "model": "openai/fake-model"}}]}},
], ids=["api_base", "base_url", "governed-name", "user_config", "user_config-defaults", "user_config-base_url",
        "user_config-provider-default", "user_config-credential", "user_config-defaults-credential"])
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


SPELLINGS = {
    "localhost": "http://localhost:{port}/v1",
    "upper-case": "http://LOCALHOST:{port}/v1",
    "trailing-dot": "http://localhost.:{port}/v1",
    "short-ipv4": "http://127.1:{port}/v1",
    "decimal-ipv4": "http://2130706433:{port}/v1",
    "hex-ipv4": "http://0x7f.0.0.1:{port}/v1",
    "mapped-ipv6": "http://[::ffff:127.0.0.1]:{port}/v1",
    "unspecified": "http://0.0.0.0:{port}/v1",
    "host-name": "http://{hostname}:{port}/v1",  # this machine's name, which DNS (here /etc/hosts) resolves
}


@pytest.mark.parametrize("spelling", list(SPELLINGS.values()), ids=list(SPELLINGS))
def test_the_governed_engine_under_another_spelling_of_its_address_is_refused(stack: dict[str, Any],
                                                                               spelling: str) -> None:
    """On the code before, 6 of these were served by the governed engine without its limits (200); the rest
    failed in LiteLLM's HTTP client (500), which does not read every IPv4 form the C library does."""
    port = httpx.URL(stack["governed"]).port
    before = _received(stack["governed"])
    api_base = spelling.format(port=port, hostname=socket.gethostname())
    r = _chat(stack, {"model": "hosted_vllm/fake-model", "api_base": api_base})
    assert (r.status_code, _received(stack["governed"])) == (400, before), r.text[:300]
    assert r.json()["error"]["param"] == "governance.client_upstream"


@pytest.mark.parametrize(("api_base", "reason"), [
    ("http://nowhere.invalid:8000/v1", "does not resolve"),
    ("localhost:{port}/v1", "no host and port this proxy can read"),
    ("http://127.0.0.1:99999/v1", "no host and port this proxy can read"),
], ids=["no-such-name", "no-scheme", "port-out-of-range"])
def test_an_upstream_whose_server_cannot_be_told_is_refused_with_the_reason(stack: dict[str, Any], api_base: str,
                                                                           reason: str) -> None:
    """Where a name that cannot be resolved, or a URL this proxy cannot read, goes cannot be told; with governed
    groups it is refused, saying why."""
    port = httpx.URL(stack["governed"]).port
    r = _chat(stack, {"model": "hosted_vllm/fake-model", "api_base": api_base.format(port=port)})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "governance.client_upstream" and reason in error["message"]
