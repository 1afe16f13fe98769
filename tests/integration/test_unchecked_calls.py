"""A client's call that reaches a governed deployment without the proxy's pre-call hook is refused at the deployment.

LiteLLM runs the lines of a batch it executes itself (``/v1/batches`` over a LiteLLM-managed file) through
``Router.acompletion`` and its pass-through routes through ``Router.allm_passthrough_route``: neither calls the
pre-call hook, where the reasoning and vision limits are applied, but both call the deployment hook. The hooks are
called here as LiteLLM calls them, with the metadata LiteLLM's own code builds for those calls
(``LiteLLMProxyRequestSetup.get_sanitized_user_information_from_key``, as its batch runner does); the pass-through
shape is the one a real proxy hands the deployment hook (``litellm_metadata``, call type ``allm_passthrough_route``).
Executed batches run end to end, on LiteLLM's database with its managed files, in ``test_litellm_batches.py``.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from litellm.proxy._types import ProxyException, UserAPIKeyAuth
from litellm.proxy.litellm_pre_call_utils import LiteLLMProxyRequestSetup

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import MemoryPeriodBudgets
from litellm_kv.integration import litellm_data
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.integration.reasoning_hooks import ReasoningHandler
from litellm_kv.integration.routing_hooks import KVRoutingHandler
from litellm_kv.integration.vision_hooks import VisionHandler

SETTINGS = parse_section(Settings, {"model_groups": {
    "qwen": {"reasoning": {"style": "vllm", "max_budget": 50}},
    "qwen-vl": {"vision": {"family": "qwen2_5_vl"}},
    "open": {},
}, "freeze_startup_heap": False}, "litellm_kv")


def _callback() -> LiteLLMKV:
    budgets = MemoryPeriodBudgets()
    handlers = [VisionHandler(SETTINGS, budgets), ReasoningHandler(SETTINGS, budgets)]
    return LiteLLMKV(settings=SETTINGS, handlers=handlers)


def _key_metadata(**extra: Any) -> dict[str, Any]:
    auth = UserAPIKeyAuth(api_key="sk-client", key_alias="client", metadata={})
    return {**LiteLLMProxyRequestSetup.get_sanitized_user_information_from_key(auth), **extra}


def _batch_line(group: str) -> dict[str, Any]:
    # What Router.acompletion hands the deployment hook for one line of an executed batch.
    return {"model": "hosted_vllm/m", "api_base": "http://engine:8000/v1", "litellm_call_id": "line-1",
            "messages": [{"role": "user", "content": "think"}], "chat_template_kwargs": {"enable_thinking": True},
            "metadata": _key_metadata(model_group=group, batch_id="batch-1")}


def _pass_through(group: str) -> dict[str, Any]:
    return {"model": "hosted_vllm/m", "api_base": "http://engine:8000/v1", "litellm_call_id": "pt-1",
            "json": {"model": group, "messages": []}, "litellm_metadata": _key_metadata(model_group=group)}


@pytest.mark.parametrize("group", ["qwen", "qwen-vl"])
@pytest.mark.parametrize(("kwargs_of", "call_type"), [(_batch_line, "acompletion"),
                                                       (_pass_through, "allm_passthrough_route")],
                         ids=["batch-line", "pass-through"])
def test_a_call_that_skipped_the_pre_call_hook_is_refused(group: str, kwargs_of: Any, call_type: str) -> None:
    cb = _callback()
    with pytest.raises(ProxyException) as refused:
        asyncio.run(cb.async_pre_call_deployment_hook(kwargs_of(group), call_type))
    assert refused.value.param == "governance.unchecked_call"
    assert f"'{group}'" in refused.value.message and "/v1/chat/completions" in refused.value.message
    assert cb.refusals.latest(limit=1)[0].limit == "governance.unchecked_call"


def test_calls_that_passed_the_hook_and_calls_litellm_makes_itself_go_on() -> None:
    cb = _callback()
    auth = UserAPIKeyAuth(api_key="sk-client", key_alias="client", metadata={})
    data = {"model": "qwen", "litellm_call_id": "chat-1", "messages": [{"role": "user", "content": "hi"}],
            "metadata": {}}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "acompletion"))
    data["metadata"].update(model_group="qwen")  # as the router adds it
    assert asyncio.run(cb.async_pre_call_deployment_hook(data, "acompletion")) is data
    # An image-less request to a vision group keeps no decision, but did pass the hook.
    data = {"model": "qwen-vl", "litellm_call_id": "chat-2", "messages": [{"role": "user", "content": "hi"}],
            "metadata": {}}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "acompletion"))
    data["metadata"].update(model_group="qwen-vl")
    assert asyncio.run(cb.async_pre_call_deployment_hook(data, "acompletion")) is data
    # LiteLLM's health check names no group; a group configured without limits is the operator's choice.
    health = {"model": "hosted_vllm/m", "api_base": "http://engine:8000/v1", "litellm_call_id": "h",
              "litellm_metadata": {"user_api_key_hash": "litellm-internal-health-check", "tags": []}}
    assert asyncio.run(cb.async_pre_call_deployment_hook(health, "acompletion")) is health
    line = _batch_line("open")
    assert asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion")) is line


def test_a_copied_token_does_not_pass_another_call() -> None:
    """The record is keyed by the call id and the proxy's token: a batch line carrying a governed chat call's token
    under another call id is still refused."""
    cb = _callback()
    auth = UserAPIKeyAuth(api_key="sk-client", key_alias="client", metadata={})
    data = {"model": "qwen", "litellm_call_id": "chat-1", "messages": [], "metadata": {}}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "acompletion"))
    line = _batch_line("qwen")
    line["metadata"].update({k: v for k, v in data["metadata"].items() if k.startswith("litellm_kv")})
    with pytest.raises(ProxyException):
        asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion"))


def test_a_fallback_to_another_governed_group_is_refused() -> None:
    """The router calls a fallback group's deployment within the call, after the hook applied the first group's
    limits (``tests/integration/test_fallback_limits.py`` through a real proxy)."""
    cb = _callback()
    auth = UserAPIKeyAuth(api_key="sk-client", key_alias="client", metadata={})
    data = {"model": "qwen", "litellm_call_id": "chat-1", "messages": [], "metadata": {}}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "acompletion"))
    data["metadata"]["model_group"] = "qwen-vl"  # as the router sets it for the fallback's attempt
    with pytest.raises(ProxyException) as refused:
        asyncio.run(cb.async_pre_call_deployment_hook(data, "acompletion"))
    assert "fallback of model 'qwen'" in refused.value.message
    data["metadata"]["model_group"] = "open"  # a fallback to a group without limits goes on
    assert asyncio.run(cb.async_pre_call_deployment_hook(data, "acompletion")) is data


def test_a_fallback_the_operator_configured_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # The router's settings stand in for a proxy's (read through litellm_data.configured_fallbacks).
    monkeypatch.setattr(litellm_data, "configured_fallbacks", lambda group: {"qwen-vl"} if group == "qwen" else set())
    cb = _callback()
    auth = UserAPIKeyAuth(api_key="sk-client", key_alias="client", metadata={})
    data = {"model": "qwen", "litellm_call_id": "chat-1", "messages": [], "metadata": {}}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "acompletion"))
    data["metadata"]["model_group"] = "qwen-vl"
    assert asyncio.run(cb.async_pre_call_deployment_hook(data, "acompletion")) is data


def test_an_application_s_own_router_is_not_governed() -> None:
    """Without governance handlers (the SDK's routing-only callback) nothing is refused here."""
    cb = LiteLLMKV(settings=SETTINGS, handlers=[KVRoutingHandler(SETTINGS, deployments=list)])
    line = _batch_line("qwen")
    assert asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion")) is line


def test_the_deployment_s_own_group_counts_when_shared_metadata_names_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines of LiteLLM's batch completion (``"model": "qwen,other"``) share one metadata dict, and each line's
    router call writes its own ``model_group`` into it: when the router retried the refused 'qwen' line, the metadata
    named 'other', and the call reached qwen's engine. The deployment id the router writes at the call's top level
    is the call's own. A real in-process ``litellm.Router`` stands in for the proxy's."""
    import litellm

    router = litellm.Router(model_list=[
        {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://engine:8000/v1"},
         "model_info": {"id": "dep-qwen"}},
        {"model_name": "other", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://other:8000/v1"},
         "model_info": {"id": "dep-other"}},
    ])
    monkeypatch.setattr(litellm_data, "_router", lambda: router)
    cb = _callback()
    line = _batch_line("other")  # the metadata as the other line left it
    line["model_info"] = {"id": "dep-qwen"}  # this call's own deployment
    with pytest.raises(ProxyException) as refused:
        asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion"))
    assert refused.value.param == "governance.unchecked_call" and "'qwen'" in refused.value.message
    other = _batch_line("other")
    other["model_info"] = {"id": "dep-other"}
    assert asyncio.run(cb.async_pre_call_deployment_hook(other, "acompletion")) is other


def _managed_file_id(*models: str) -> str:
    # The id LiteLLM gives a file it keeps (/v1/files with target_model_names), as its files endpoint builds it.
    from litellm.types.utils import SpecialEnums

    unified = (f"{SpecialEnums.LITELM_MANAGED_FILE_ID_PREFIX.value}application/jsonl;unified_id,3f1c;"
               f"target_model_names,{','.join(models)};llm_output_file_id,file-9;llm_output_file_model_id,None")
    return base64.urlsafe_b64encode(unified.encode()).decode().rstrip("=")


def test_the_models_a_batch_may_run_on_are_read_from_its_body_and_its_file() -> None:
    from litellm.proxy.openai_files_endpoints.common_utils import encode_file_id_with_model

    assert litellm_data.batch_models({"input_file_id": _managed_file_id("qwen")}) == ["qwen"]
    assert litellm_data.batch_models({"model": "open", "input_file_id": _managed_file_id("qwen", "b")}) == \
        ["open", "qwen", "b"]
    assert litellm_data.batch_models({"input_file_id": encode_file_id_with_model("file-abc", "qwen-vl")}) == \
        ["qwen-vl"]
    assert litellm_data.batch_models({"model": "open", "input_file_id": "file-abc"}) == ["open"]
    assert litellm_data.batch_models({"input_file_id": "%%%not base64"}) == []
    assert litellm_data.batch_models({"input_file_id": 7}) == []


@pytest.mark.parametrize(("body", "limit"), [
    ({"input_file_id": _managed_file_id("qwen")}, "reasoning.endpoint"),
    ({"model": "open", "input_file_id": _managed_file_id("qwen-vl")}, "vision.endpoint"),
], ids=["model-from-the-file", "body-names-another"])
def test_a_batch_whose_file_is_for_a_governed_group_is_refused_when_created(body: dict[str, Any], limit: str) -> None:
    cb = _callback()
    auth = UserAPIKeyAuth(api_key="sk-client", key_alias="client", metadata={})
    data = {**body, "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": {}}
    with pytest.raises(ProxyException) as refused:
        asyncio.run(cb.async_pre_call_hook(auth, None, data, "acreate_batch"))
    assert refused.value.param == limit and "/v1/batches" in refused.value.message


def test_a_batch_for_a_group_without_limits_goes_on() -> None:
    cb = _callback()
    auth = UserAPIKeyAuth(api_key="sk-client", key_alias="client", metadata={})
    data = {"input_file_id": _managed_file_id("open"), "endpoint": "/v1/chat/completions", "metadata": {}}
    assert asyncio.run(cb.async_pre_call_hook(auth, None, data, "acreate_batch")) is data
