"""The callback with the governance handlers, called as LiteLLM 1.110 calls it: failures where a limit is at
stake refuse the request, client-sent ``litellm_kv*`` entries are dropped on entry, and every later hook
reads what the proxy decided (kept under the call id), never what the client wrote in the metadata.

The proxy-level versions of these cases are in ``tests/integration/test_adversarial_governance.py``; these
call the hooks directly to reach states a proxy test cannot set up (a handler bug, a reused call id).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from litellm.proxy._types import ProxyException, UserAPIKeyAuth

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import MemoryPeriodBudgets, Period
from litellm_kv.governance.images import ImageError, ImagePart
from litellm_kv.governance.vision_policy import PixelBounds
from litellm_kv.integration.call_records import CallRecords
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.integration.hooks import Handler, ProxyRequest
from litellm_kv.integration.litellm_data import CALL_TOKEN_KEY
from litellm_kv.integration.reasoning_hooks import ReasoningHandler
from litellm_kv.integration.vision_hooks import VisionHandler, count_images


def settings() -> Settings:
    groups = {"g": {"reasoning": {"style": "vllm", "max_budget": 5}, "vision": {"family": "qwen2_5_vl"}}}
    return parse_section(Settings, {"model_groups": groups}, "litellm_kv")


class Governed(Handler):
    """Stands in for a governance handler with a bug."""

    name = "reasoning"
    fails_closed = True

    async def pre_call(self, req: ProxyRequest) -> None:
        raise RecursionError("a bug while deciding")


class Seen(Handler):
    name = "seen"

    def __init__(self, s: Settings) -> None:
        super().__init__(s)
        self.metadata: list[dict[str, Any]] = []

    async def pre_call(self, req: ProxyRequest) -> None:
        self.metadata.append(dict(req.data.get("metadata") or {}))


def _request(call_id: str = "call-1", **extra: Any) -> dict[str, Any]:
    return {"model": "g", "messages": [{"role": "user", "content": "hi"}], "litellm_call_id": call_id, **extra}


async def test_governance_failure_refuses_the_request_naming_the_limits() -> None:
    cb = LiteLLMKV(settings=settings(), handlers=[Governed(settings())])
    with pytest.raises(ProxyException) as exc:
        await cb.async_pre_call_hook(UserAPIKeyAuth(), None, _request(), "completion")
    assert exc.value.code == "500"
    assert exc.value.param == "reasoning.internal_error"


async def test_reasoning_max_budget_holds_against_a_400_digit_budget() -> None:
    cb = LiteLLMKV(settings=settings(), handlers=[ReasoningHandler(settings(), MemoryPeriodBudgets())])
    data = _request(thinking={"type": "enabled", "budget_tokens": int("9" * 400)}, reasoning_effort="max",
                    chat_template_kwargs={"enable_thinking": True})
    await cb.async_pre_call_hook(UserAPIKeyAuth(), None, data, "completion")
    assert data["thinking_token_budget"] == 5
    assert "thinking" not in data and "reasoning_effort" not in data


async def test_client_litellm_kv_entries_are_dropped_before_any_handler() -> None:
    seen = Seen(settings())
    cb = LiteLLMKV(settings=settings(), handlers=[seen])
    md = {"litellm_kv_vision": {"tokens": 1}, "litellm_kv_headers": {"set-cookie": "x"}, "litellm_kv_route": {},
          CALL_TOKEN_KEY: "the-client-s-token", "spend_logs_metadata": {"litellm_kv": {"forged": 1}, "mine": 1},
          "tags": ["a"]}
    data = _request(metadata=md, litellm_metadata={"litellm_kv_reasoning": {"budget": 9}})
    await cb.async_pre_call_hook(UserAPIKeyAuth(), None, data, "completion")
    assert seen.metadata == [{"spend_logs_metadata": {"mine": 1}, "tags": ["a"]}]
    # The proxy's own token, written (into LiteLLM's dict of this route) after the client's were dropped.
    token = data["litellm_metadata"].pop(CALL_TOKEN_KEY)
    assert token != "the-client-s-token" and data["litellm_metadata"] == {}


async def test_a_reused_call_id_reaches_no_other_call_s_record() -> None:
    """The client chooses x-litellm-call-id: a second call under the same id neither reads nor ends the first's."""
    cb = LiteLLMKV(settings=settings(), handlers=[ReasoningHandler(settings(), MemoryPeriodBudgets())])
    first = _request("dup")
    await cb.async_pre_call_hook(UserAPIKeyAuth(), None, first, "completion")
    second = {"model": "other", "litellm_call_id": "dup", "metadata": {}}
    await cb.async_pre_call_hook(UserAPIKeyAuth(), None, second, "completion")
    assert await cb.async_post_call_response_headers_hook(second, UserAPIKeyAuth(), None) is None
    assert await cb.async_post_call_response_headers_hook(first, UserAPIKeyAuth(), None) == {
        "x-litellm-kv-reasoning-budget": "5"}
    # The first call is over: its record is gone.
    assert await cb.async_post_call_response_headers_hook(first, UserAPIKeyAuth(), None) is None


async def test_visual_token_budgets_cannot_be_charged_by_a_forged_decision() -> None:
    budgets = MemoryPeriodBudgets()
    vision = VisionHandler(settings(), budgets)
    cb = LiteLLMKV(settings=settings(), handlers=[vision])
    forged = {"model_group": "g", "tokens": 10**9, "charges": [{"scope": "team:victim", "period": "day",
                                                                 "limit": 1, "source": "forged"}]}
    data = {"model": "other", "messages": [], "litellm_call_id": "c-forged", "metadata": {"litellm_kv_vision": forged}}
    await cb.async_pre_call_hook(UserAPIKeyAuth(), None, data, "completion")
    kwargs = {"litellm_call_id": "c-forged", "metadata": {"litellm_kv_vision": forged}}  # as if it got through
    usage: dict[str, Any] = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    await cb.async_post_call_success_deployment_hook(kwargs, {"usage": usage}, "completion")
    now = datetime.now(timezone.utc)
    assert (await budgets.check("team:victim", "visual_tokens", Period.DAY, 1, now=now)).used == 0
    assert "prompt_tokens_details" not in usage


async def test_response_headers_come_only_from_the_proxy() -> None:
    cb = LiteLLMKV(settings=settings(), handlers=[ReasoningHandler(settings(), MemoryPeriodBudgets())])
    forged = {"set-cookie": "session=stolen", "x-litellm-kv-reasoning-budget": "unlimited"}
    governed = _request("h1", metadata={"litellm_kv_headers": forged})
    await cb.async_pre_call_hook(UserAPIKeyAuth(), None, governed, "completion")
    governed["metadata"]["litellm_kv_headers"] = forged  # written again after entry: still never read
    assert await cb.async_post_call_response_headers_hook(governed, UserAPIKeyAuth(), None) == {
        "x-litellm-kv-reasoning-budget": "5"}
    other = {"model": "other", "litellm_call_id": "h2", "metadata": {"litellm_kv_headers": forged}}
    await cb.async_pre_call_hook(UserAPIKeyAuth(), None, other, "completion")
    assert await cb.async_post_call_response_headers_hook(other, UserAPIKeyAuth(), None) is None


async def test_visual_token_limit_refuses_an_image_url_httpx_cannot_fetch() -> None:
    """httpx raises InvalidURL (not an HTTPError) for a NUL byte: the image is a 400, not a skipped count."""
    groups = {"g": {"vision": {"family": "qwen2_5_vl", "fetch": {"allow_hosts": ["127.0.0.1"]}}}}
    h = VisionHandler(parse_section(Settings, {"model_groups": groups}, "litellm_kv"), MemoryPeriodBudgets())
    part = ImagePart("messages[0].content[1]", "http://127.0.0.1:9/x.png#\x00", inline=False)
    with pytest.raises(ImageError) as exc:
        await count_images([part], h.group_settings("g"), PixelBounds(None, None))
    assert exc.value.limit_name == "image.invalid_url"



@pytest.mark.parametrize("call_type", ["aresponses", "anthropic_messages"])
async def test_reasoning_budgets_refuse_endpoints_they_cannot_meter(call_type: str) -> None:
    cb = LiteLLMKV(settings=settings(), handlers=[ReasoningHandler(settings(), MemoryPeriodBudgets())])
    data = _request(reasoning={"effort": "high"})
    with pytest.raises(ProxyException) as exc:
        await cb.async_pre_call_hook(UserAPIKeyAuth(), None, data, call_type)
    assert exc.value.code == "400" and exc.value.param == "reasoning.endpoint"
    assert "reasoning" not in data  # stripped even so

@pytest.mark.parametrize("call_type", ["aresponses", "anthropic_messages"])
async def test_vision_limits_refuse_endpoints_they_do_not_charge(call_type: str) -> None:
    budgets = MemoryPeriodBudgets()
    cb = LiteLLMKV(settings=settings(), handlers=[VisionHandler(settings(), budgets)])
    with pytest.raises(ProxyException) as exc:
        await cb.async_pre_call_hook(UserAPIKeyAuth(), None, _request(), call_type)
    assert exc.value.code == "400" and exc.value.param == "vision.endpoint"
    assert "/v1/chat/completions only" in exc.value.message


# -- the table itself ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_call_records_are_bounded_oldest_out() -> None:
    records = CallRecords(max_calls=2, ttl_s=60, clock=Clock())
    for cid in ("a", "b", "c"):
        records.put(cid, "vision", cid)
    assert len(records) == 2
    assert records.get("a", "vision") is None and records.get("c", "vision") == "c"


def test_call_records_expire() -> None:
    clock = Clock()
    records = CallRecords(max_calls=10, ttl_s=60, clock=clock)
    records.put("a", "reasoning", 1)
    clock.now = 59
    assert records.get("a", "reasoning") == 1
    clock.now = 60
    assert records.get("a", "reasoning") is None and len(records) == 0
    assert records.get(None, "reasoning") is None


async def test_an_image_decoder_that_fails_as_python_3_10_s_refuses_rather_than_skips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python 3.10's ``binascii.a2b_base64`` has no ``strict_mode`` and raises TypeError: the visual-token
    limits must then refuse the request (500 naming them), never send the image on uncounted."""
    import binascii

    real = binascii.a2b_base64

    def a2b_base64_3_10(data: Any, **kwargs: Any) -> bytes:
        if kwargs:
            raise TypeError(f"a2b_base64() takes no keyword arguments: {sorted(kwargs)}")
        return real(data)

    monkeypatch.setattr(binascii, "a2b_base64", a2b_base64_3_10)
    cb = LiteLLMKV(settings=settings(), handlers=[VisionHandler(settings(), MemoryPeriodBudgets())])
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}}
    data = _request("v-310", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}])
    with pytest.raises(ProxyException) as exc:
        await cb.async_pre_call_hook(UserAPIKeyAuth(), None, data, "completion")
    assert exc.value.code == "500"
    assert exc.value.param == "vision.internal_error"
