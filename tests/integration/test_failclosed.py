"""The callback with the governance handlers, called as LiteLLM 1.110 calls it: failures where a limit is at
stake refuse the request.

The proxy-level versions of these cases are in ``tests/integration/test_adversarial_governance.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from litellm.proxy._types import ProxyException, UserAPIKeyAuth

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import MemoryPeriodBudgets
from litellm_kv.governance.images import ImageBounds, ImageError, ImagePart
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.integration.hooks import Handler, ProxyRequest
from litellm_kv.integration.reasoning_hooks import ReasoningHandler
from litellm_kv.integration.vision_hooks import VisionHandler


def settings() -> Settings:
    groups = {"g": {"reasoning": {"style": "vllm", "max_budget": 5}, "vision": {"family": "qwen2_5_vl"}}}
    return parse_section(Settings, {"model_groups": groups}, "litellm_kv")


class Governed(Handler):
    """Stands in for a governance handler with a bug."""

    name = "reasoning"
    fails_closed = True

    async def pre_call(self, req: ProxyRequest) -> None:
        raise RecursionError("a bug while deciding")


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


async def test_visual_token_limit_refuses_an_image_url_httpx_cannot_fetch() -> None:
    """httpx raises InvalidURL (not an HTTPError) for a NUL byte: the image is a 400, not a skipped count."""
    groups = {"g": {"vision": {"family": "qwen2_5_vl", "fetch": {"allow_hosts": ["127.0.0.1"]}}}}
    h = VisionHandler(parse_section(Settings, {"model_groups": groups}, "litellm_kv"), MemoryPeriodBudgets())
    part = ImagePart("messages[0].content[1]", "http://127.0.0.1:9/x.png#\x00", inline=False)
    with pytest.raises(ImageError) as exc:
        await h._fetch_size(part, h.group_settings("g"), ImageBounds(max_bytes=2**20, max_pixels=2**24))
    assert exc.value.limit_name == "image.invalid_url"
