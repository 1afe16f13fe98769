"""The LiteLLM callback's contract: handler failures are contained, PolicyViolation becomes the caller's
HTTP error, and an invalid ``litellm_kv`` section stops a real proxy from starting with a clear message."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from litellm.proxy._types import ProxyException, UserAPIKeyAuth

from litellm_kv.config import Settings, parse_section
from litellm_kv.errors import ConfigError, PolicyViolation
from litellm_kv.integration.callback import INTERNAL_ERRORS, LiteLLMKV, _install
from litellm_kv.integration.hooks import Handler, ProxyRequest
from tools.harness.proxy import start_proxy


class Boom(Handler):
    name = "boom"

    async def pre_call(self, req: ProxyRequest) -> None:
        raise RuntimeError("bug")

    async def filter_deployments(self, *a: Any) -> list[dict[str, Any]] | None:
        raise RuntimeError("bug")


class Reject(Handler):
    name = "reject"

    async def pre_call(self, req: ProxyRequest) -> None:
        raise PolicyViolation(429, "reasoning budget spent", limit_name="reasoning.tokens_per_day",
                              headers={"retry-after": "60"})


def _errors(hook: str) -> float:
    return INTERNAL_ERRORS.labels("boom", hook)._value.get()


def test_handler_failures_are_contained() -> None:
    cb = LiteLLMKV(settings=Settings(), handlers=[Boom(Settings())])
    deps = [{"model_info": {"id": "a"}}, {"model_info": {"id": "b"}}]
    before = (_errors("pre_call"), _errors("filter_deployments"))
    data = {"model": "m", "messages": []}
    out = asyncio.run(cb.async_pre_call_hook(UserAPIKeyAuth(), None, data, "completion"))
    assert out is data
    assert asyncio.run(cb.async_filter_deployments("m", deps, [])) == deps
    assert (_errors("pre_call"), _errors("filter_deployments")) == (before[0] + 1, before[1] + 1)


def test_policy_violation_becomes_http_error() -> None:
    cb = LiteLLMKV(settings=Settings(), handlers=[Reject(Settings())])
    with pytest.raises(ProxyException) as exc:
        asyncio.run(cb.async_pre_call_hook(UserAPIKeyAuth(), None, {"model": "m"}, "completion"))
    assert exc.value.code == "429"
    assert exc.value.headers["retry-after"] == "60"
    assert "reasoning budget spent" in exc.value.message


@pytest.mark.proxy
@pytest.mark.parametrize("section", [
    {"mode": "embeded"},  # the top level, checked as the settings load
    {"model_groups": {"m": {"routing": "kv", "kv": {"block_sise": 32}}}},  # a group section a handler parses
])
def test_invalid_config_stops_the_proxy(section: dict[str, Any]) -> None:
    cfg = {
        "model_list": [{"model_name": "m", "litellm_params": {"model": "hosted_vllm/x", "api_base": "http://127.0.0.1:9"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": section,
    }
    with pytest.raises(RuntimeError, match=r"ConfigError: litellm_kv\.(mode|model_groups\.m\.kv)"):
        start_proxy(cfg, name="bad-config", timeout=240, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})


@pytest.mark.parametrize("group", [
    {"routing": "kv", "kv": {"block_sise": 32}},
    {"reasoning": {"style": "vlm"}},
    {"vision": {"family": "qwen2_5_vl", "videos": "refuse"}},
    {"reasoning": {"style": "vllm", "max_budget": "lots"}},  # a limit, read as a request would read it
    {"vision": {"family": "qwen2_5_vl", "over_limit": "refuse"}},
])
def test_every_group_section_is_checked_when_the_callback_loads(group: dict[str, Any]) -> None:
    """Not at the first request: a group whose section has a typo would otherwise fail every request."""
    settings = parse_section(Settings, {"model_groups": {"m": group}}, "litellm_kv")

    async def load() -> None:
        _install(LiteLLMKV(settings=settings))

    with pytest.raises(ConfigError, match=r"litellm_kv\.model_groups\.m\.(kv|reasoning|vision)"):
        asyncio.run(load())


def test_gc_pauses_are_timed_by_generation() -> None:
    import gc

    from prometheus_client import REGISTRY

    from litellm_kv.integration.callback import watch_gc_pauses

    def count() -> float:
        return REGISTRY.get_sample_value("litellm_kv_gc_pause_seconds_count", {"generation": "2"}) or 0.0

    watch_gc_pauses()
    watch_gc_pauses()  # idempotent: one timer
    before = count()
    gc.collect()
    assert count() == before + 1
