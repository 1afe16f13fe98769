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


# -- tenant cache isolation for calls that skipped the pre-call hook ------------------------------------------
ISOLATED = parse_section(Settings, {"model_groups": {
    "shared-kv": {"routing": "kv", "kv": {"tenant_isolation": "key"}},
    "team-kv": {"routing": "kv", "kv": {"tenant_isolation": "team"}},
}, "freeze_startup_heap": False}, "litellm_kv")


def _kv_callback(monkeypatch: pytest.MonkeyPatch, *, proxy: bool = True) -> tuple[LiteLLMKV, KVRoutingHandler]:
    monkeypatch.setenv("LITELLM_KV_SALT_SECRET", "a-test-secret-" + "x" * 32)
    handler = KVRoutingHandler(ISOLATED, deployments=list, proxy=proxy)
    return LiteLLMKV(settings=ISOLATED, handlers=[handler]), handler


def _kv_line(group: str, api_key: str, team_id: str | None = None, **body: Any) -> dict[str, Any]:
    # One line of a batch LiteLLM runs itself, as the router hands it to the deployment hook: the line's body and the
    # metadata the batch runner writes from the verified key.
    auth = UserAPIKeyAuth(api_key=api_key, key_alias="client", metadata={}, team_id=team_id)
    md = {**LiteLLMProxyRequestSetup.get_sanitized_user_information_from_key(auth), "model_group": group,
          "batch_id": "batch-1"}
    return {"model": "hosted_vllm/m", "api_base": "http://engine:8000/v1", "litellm_call_id": f"line-{api_key}",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "describe it"},
                {"type": "image_url", "image_url": {"url": "https://img.example/a.png"}, "uuid": "someone-elses"}]}],
            "metadata": md, **body}


def _chat_salt(cb: LiteLLMKV, group: str, api_key: str, team_id: str | None = None) -> str:
    auth = UserAPIKeyAuth(api_key=api_key, key_alias="client", metadata={}, team_id=team_id)
    data = {"model": group, "litellm_call_id": f"chat-{api_key}", "messages": [{"role": "user", "content": "hi"}],
            "metadata": {}}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "acompletion"))
    return str(data["cache_salt"])


def test_a_batch_line_gets_its_tenant_s_salt_and_loses_client_media_uuids(monkeypatch: pytest.MonkeyPatch) -> None:
    cb, _ = _kv_callback(monkeypatch)
    line = _kv_line("shared-kv", "sk-alice", cache_salt="chosen-by-the-client")
    asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion"))
    # The same salt as the key's chat calls (their cache is the key's), never the client's or another key's.
    assert line["cache_salt"] == _chat_salt(cb, "shared-kv", "sk-alice")
    assert line["cache_salt"] != _chat_salt(cb, "shared-kv", "sk-bob")
    assert all("uuid" not in part for part in line["messages"][0]["content"])
    other = _kv_line("shared-kv", "sk-bob")
    asyncio.run(cb.async_pre_call_deployment_hook(other, "acompletion"))
    assert other["cache_salt"] != line["cache_salt"]
    # By team where the group says so.
    team_line = _kv_line("team-kv", "sk-carol", team_id="t1")
    asyncio.run(cb.async_pre_call_deployment_hook(team_line, "acompletion"))
    assert team_line["cache_salt"] == _chat_salt(cb, "team-kv", "sk-dave", team_id="t1")


def test_a_line_is_salted_alike_at_the_routing_decision_and_at_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    cb, handler = _kv_callback(monkeypatch)
    line = _kv_line("shared-kv", "sk-alice")
    assert handler._isolate_unchecked("shared-kv", line)  # as filter_deployments does before deciding
    decided = line["cache_salt"]
    asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion"))
    assert line["cache_salt"] == decided


def test_a_call_that_passed_the_hook_keeps_its_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    cb, _ = _kv_callback(monkeypatch)
    auth = UserAPIKeyAuth(api_key="sk-alice", key_alias="client", metadata={})
    data = {"model": "shared-kv", "litellm_call_id": "chat-1", "cache_salt": "mine",
            "messages": [{"role": "user", "content": "hi"}], "metadata": {}}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "acompletion"))
    salted = data["cache_salt"]
    assert salted not in ("mine", _chat_salt(cb, "shared-kv", "sk-alice"))  # the client's salt folded in
    data["metadata"]["model_group"] = "shared-kv"
    asyncio.run(cb.async_pre_call_deployment_hook(data, "acompletion"))
    assert data["cache_salt"] == salted


def test_a_copied_call_token_does_not_skip_the_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    cb, _ = _kv_callback(monkeypatch)
    line = _kv_line("shared-kv", "sk-mallory", cache_salt="raw")
    line["metadata"][litellm_data.CALL_TOKEN_KEY] = "guessed"
    asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion"))
    assert line["cache_salt"] == _chat_salt(cb, "shared-kv", "sk-mallory")


def test_an_application_s_own_router_keeps_its_calls_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    cb, _ = _kv_callback(monkeypatch, proxy=False)
    line = _kv_line("shared-kv", "sk-alice", cache_salt="the-application-s")
    asyncio.run(cb.async_pre_call_deployment_hook(line, "acompletion"))
    assert line["cache_salt"] == "the-application-s"
    assert line["messages"][0]["content"][1]["uuid"] == "someone-elses"


def test_a_responses_call_carries_the_salt_in_extra_body_and_loses_client_uuids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM sends a Responses call to vLLM's /v1/responses with the Responses fields it knows: the salt goes where
    it is sent as written, with the client's own folded in, and the input's parts lose their uuids as messages do."""
    cb, _ = _kv_callback(monkeypatch)
    auth = UserAPIKeyAuth(api_key="sk-alice", key_alias="client", metadata={})
    data = {"model": "shared-kv", "litellm_call_id": "resp-1", "metadata": {},
            "extra_body": {"cache_salt": "chosen-by-the-client", "top_k": 5},
            "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "describe it"},
                {"type": "input_image", "image_url": "https://img.example/a.png", "uuid": "someone-elses"}]}]}
    asyncio.run(cb.async_pre_call_hook(auth, None, data, "aresponses"))
    salt = data["extra_body"]["cache_salt"]
    assert len(salt) == 48 and salt not in ("chosen-by-the-client", _chat_salt(cb, "shared-kv", "sk-alice"))
    assert data["extra_body"]["top_k"] == 5
    assert "uuid" not in data["input"][0]["content"][1]
    plain = {"model": "shared-kv", "litellm_call_id": "resp-2", "metadata": {}, "input": "hello"}
    asyncio.run(cb.async_pre_call_hook(auth, None, plain, "aresponses"))
    assert plain["extra_body"] == {"cache_salt": _chat_salt(cb, "shared-kv", "sk-alice")}
