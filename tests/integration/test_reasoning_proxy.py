"""Reasoning budgets through a real ``litellm`` proxy process.

Keys with metadata are presented through ``general_settings.custom_auth`` (the database path
cannot run here). The upstream is the local fake (``tests/support/fake_upstream.py``): it stands in
for a reasoning model, honours ``thinking_token_budget`` and the template's thinking switch, and
records what it received, which is what these tests check. The real-engine check is in
``tests/integration/test_reasoning_engine.py``.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import litellm
import pytest
from tokenizers import Tokenizer

from tests.support.fake_upstream import start_fake_upstream
from tools.harness.procs import ManagedProcess
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

REASONING_WORDS = 20
IN_RATE, OUT_RATE, REASONING_RATE = 1e-6, 2e-6, 3e-5
DEEPSEEK_TOKENIZER = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers" / "deepseek_tokenizer.json"


def _fake(name: str, *extra: str) -> tuple[ManagedProcess, str]:
    return start_fake_upstream(name, "--reasoning-words", str(REASONING_WORDS), *extra)


def _reasoning_key(alias: str, reasoning: Any, **extra: Any) -> dict[str, Any]:
    return {"key_alias": alias, "metadata": {"litellm_kv": {"reasoning": reasoning}}, **extra}


KEYS: dict[str, dict[str, Any]] = {
    "sk-free": {"key_alias": "free", "metadata": {}},
    "sk-capped": _reasoning_key("capped", {"max_budget": 5}),
    "sk-strict": _reasoning_key("strict", {"max_budget": 5, "over_max": "reject"}),
    "sk-default": _reasoning_key("defaulted", {"default_budget": 3}),
    "sk-hidden": _reasoning_key("hidden", {"show_reasoning": False}),
    "sk-nothink": _reasoning_key("nothink", {"allowed": False}),
    "sk-daily": _reasoning_key("daily", {"tokens_per_day": 25}),
    "sk-team": {"key_alias": "member", "metadata": {}, "team_id": "t-research", "team_alias": "research",
                "team_metadata": {"litellm_kv": {"reasoning": {"max_budget": 4}}}},
    "sk-bad": _reasoning_key("broken", {"max_budget": "lots"}),
    "sk-badjson": {"key_alias": "badjson", "metadata": {"litellm_kv": "{reasoning: oops"}},
}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    reported, reported_url = _fake("reported", "--report-reasoning-tokens", "--count-reasoning-in-completion")
    counted, counted_url = _fake("counted")
    capture = Path(tempfile.mkdtemp(prefix="litellm-kv-spend-")) / "spend.jsonl"
    prices = {"input_cost_per_token": IN_RATE, "output_cost_per_token": OUT_RATE,
              "output_cost_per_reasoning_token": REASONING_RATE}
    config = {
        "model_list": [
            {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                      "api_base": reported_url + "/v1", **prices}},
            {"model_name": "qwen-counted", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                              "api_base": counted_url + "/v1", **prices}},
            {"model_name": "o-mini", "litellm_params": {"model": "openai/fake-model",
                                                        "api_base": reported_url + "/v1", "api_key": "x", **prices}},
            {"model_name": "qwen-lenient", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                              "api_base": reported_url + "/v1", **prices}},
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler",
                                           "tests.support.spend_capture.capture"]},
        "litellm_kv": {"model_groups": {
            "qwen": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "qwen-counted": {"reasoning": {"style": "vllm", "template_kwarg": "thinking",
                                           "tokenizer": str(DEEPSEEK_TOKENIZER),
                                           "completion_includes_reasoning": False}},
            "o-mini": {"reasoning": {"style": "openai"}},
            "qwen-lenient": {"reasoning": {"style": "vllm", "max_budget": 7, "invalid_metadata": "ignore"}},
        }},
    }
    proxy = start_proxy(config, name="litellm-reasoning", keys=KEYS,
                        env={"LITELLM_KV_SPEND_CAPTURE": str(capture), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "reported": reported_url, "counted": counted_url, "capture": capture}
    finally:
        proxy.stop()
        reported.stop()
        counted.stop()


def _chat(proxy: Proxy, key: str, model: str = "qwen", **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": "think about it"}], **body}
    return httpx.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(key), timeout=60)


def _last_upstream(url: str) -> dict[str, Any]:
    reqs = httpx.get(url + "/_requests", timeout=5).json()
    return dict(reqs[-1]["body"])


def _expected_cost(usage: dict[str, Any]) -> float:
    reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
    return (usage["prompt_tokens"] * IN_RATE + (usage["completion_tokens"] - reasoning) * OUT_RATE
            + reasoning * REASONING_RATE)


def _spend_rows(capture: Path) -> list[dict[str, Any]]:
    if not capture.exists():
        return []
    return [json.loads(line) for line in capture.read_text().splitlines() if line.strip()]


def test_group_max_is_injected_for_vllm(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-free", max_tokens=10)
    assert r.status_code == 200, r.text
    up = _last_upstream(stack["reported"])
    assert up["thinking_token_budget"] == 50
    assert up["chat_template_kwargs"] == {"enable_thinking": True}
    assert up["max_tokens"] == 50 + 512  # raised so an answer still fits after the thinking budget
    assert r.headers["x-litellm-kv-reasoning-budget"] == "50"


def test_key_max_clamps_and_says_so(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-capped", extra_body={"thinking_token_budget": 400})
    assert r.status_code == 200, r.text
    assert _last_upstream(stack["reported"])["thinking_token_budget"] == 5
    assert r.headers["x-litellm-kv-reasoning-clamped"] == (
        "requested=400; budget=5; limit=max_budget; source=key 'capped'"
    )
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


def test_over_max_reject_is_400_naming_limit(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-strict", reasoning_effort="high")
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "Requested thinking budget 4096" in msg and "maximum of 5" in msg and "key 'strict'" in msg


def test_team_limit_is_stricter_than_group(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-team", thinking={"type": "enabled", "budget_tokens": 30})
    assert r.status_code == 200, r.text
    up = _last_upstream(stack["reported"])
    assert up["thinking_token_budget"] == 4
    assert "thinking" not in up and "reasoning_effort" not in up  # LiteLLM would map thinking to an effort
    assert "source=team 'research'" in r.headers["x-litellm-kv-reasoning-clamped"]


def test_default_budget_applies_when_client_sets_none(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-default")
    assert r.status_code == 200
    assert _last_upstream(stack["reported"])["thinking_token_budget"] == 3


def test_client_cannot_raise_limits_through_any_field(stack: dict[str, Any]) -> None:
    r = _chat(
        stack["proxy"], "sk-capped",
        thinking_token_budget=9999,
        reasoning_effort="max",
        thinking={"type": "enabled", "budget_tokens": 9999},
        chat_template_kwargs={"enable_thinking": True, "custom": 1},
        vllm_xargs={"thinking_token_budget": 9999, "kv_cache_report_mode": "full"},
        extra_body={"thinking_token_budget": 9999, "include_reasoning": True},
        metadata={"litellm_kv": {"reasoning": {"max_budget": 9999}},
                  "litellm_kv_reasoning": {"thinking": True, "budget": 9999, "charges": []}},
    )
    assert r.status_code == 200, r.text
    up = _last_upstream(stack["reported"])
    assert up["thinking_token_budget"] == 5
    assert up["chat_template_kwargs"] == {"custom": 1, "enable_thinking": True}
    assert up.get("vllm_xargs", {}) == {"kv_cache_report_mode": "full"}
    for name in ("reasoning_effort", "thinking", "include_reasoning"):
        assert name not in up
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


def test_not_allowed_switches_thinking_off(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-nothink")
    assert r.status_code == 200, r.text
    up = _last_upstream(stack["reported"])
    assert up["chat_template_kwargs"] == {"enable_thinking": False}
    assert up["thinking_token_budget"] == 0
    assert r.headers["x-litellm-kv-reasoning-disabled"] == "not allowed (key 'nothink')"
    assert not r.json()["choices"][0]["message"].get("reasoning_content")


def test_hidden_reasoning_is_stripped_but_billed(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-hidden")
    assert r.status_code == 200
    body = r.json()
    assert not body["choices"][0]["message"].get("reasoning_content")
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == REASONING_WORDS
    with httpx.stream("POST", stack["proxy"].url + "/v1/chat/completions", timeout=60,
                      headers=stack["proxy"].headers("sk-hidden"),
                      json={"model": "qwen", "stream": True, "messages": [{"role": "user", "content": "x"}]}) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: {")]
    assert lines
    assert all("think0" not in ln and "reasoning_content\": \"" not in ln for ln in lines)


def test_non_streamed_usage_and_cost_include_reasoning_price(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-free")
    usage = r.json()["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == REASONING_WORDS
    cost = float(r.headers["x-litellm-response-cost"])
    assert cost == pytest.approx(_expected_cost(usage), rel=1e-6)
    # Priced at the reasoning rate, not the output rate: the difference is visible.
    assert cost > usage["prompt_tokens"] * IN_RATE + usage["completion_tokens"] * OUT_RATE


def test_counted_with_tokenizer_when_not_reported(stack: dict[str, Any]) -> None:
    """Upstream reports no reasoning tokens and leaves them out of completion_tokens."""
    r = _chat(stack["proxy"], "sk-free", model="qwen-counted")
    assert r.status_code == 200, r.text
    body = r.json()
    up = _last_upstream(stack["counted"])
    assert up["chat_template_kwargs"] == {"thinking": True}  # DeepSeek-V3.1-style switch
    text = body["choices"][0]["message"]["reasoning_content"]
    expected = len(Tokenizer.from_file(str(DEEPSEEK_TOKENIZER)).encode(text, add_special_tokens=False).ids)
    usage = body["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == expected
    assert usage["completion_tokens"] == 3 + expected  # "answer from counted"
    assert float(r.headers["x-litellm-response-cost"]) == pytest.approx(_expected_cost(usage), rel=1e-6)


def _wait_rows(capture: Path, before: int) -> list[dict[str, Any]]:
    for _ in range(40):  # the spend log is written after the response
        rows = _spend_rows(capture)[before:]
        if rows:
            return rows
        time.sleep(0.25)
    raise AssertionError("no spend-log row was written")


def test_streamed_usage_carries_reasoning_and_cost(stack: dict[str, Any]) -> None:
    """A vLLM-like upstream (reports reasoning_tokens in the final usage chunk)."""
    before = len(_spend_rows(stack["capture"]))
    with httpx.stream("POST", stack["proxy"].url + "/v1/chat/completions", timeout=60,
                      headers=stack["proxy"].headers("sk-capped"),
                      json={"model": "qwen", "stream": True, "stream_options": {"include_usage": True},
                            "thinking_token_budget": 999,
                            "messages": [{"role": "user", "content": "stream please"}]}) as s:
        assert s.status_code == 200
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    assert _last_upstream(stack["reported"])["thinking_token_budget"] == 5
    text = "".join((c["choices"][0]["delta"].get("reasoning_content") or "") for c in chunks if c.get("choices"))
    assert text.split() == [f"think{i}" for i in range(5)]
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 5
    row = _wait_rows(stack["capture"], before)[-1]
    assert row["response_cost"] == pytest.approx(_expected_cost(usage), rel=1e-6)
    bd = row["spend_logs_metadata"]["litellm_kv"]["reasoning"]
    assert bd["reasoning_tokens"] == 5 and bd["budget"] == 5


def test_spend_log_breakdown(stack: dict[str, Any]) -> None:
    before = len(_spend_rows(stack["capture"]))
    r = _chat(stack["proxy"], "sk-capped", extra_body={"thinking_token_budget": 400})
    assert r.status_code == 200
    row = _wait_rows(stack["capture"], before)[-1]
    bd = row["spend_logs_metadata"]["litellm_kv"]["reasoning"]
    assert bd["reasoning_tokens"] == 5 and bd["budget"] == 5 and bd["requested"] == 400
    assert bd["clamped_by"] == "key 'capped'" and bd["measured_by"] == "reported"
    assert row["response_cost"] == pytest.approx(float(r.headers["x-litellm-response-cost"]), rel=1e-6)


def test_period_budget_clamps_then_429_with_reset(stack: dict[str, Any]) -> None:
    r1 = _chat(stack["proxy"], "sk-daily")  # 20 of 25 used
    assert r1.status_code == 200 and r1.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 20
    r2 = _chat(stack["proxy"], "sk-daily")  # only 5 left: clamped to 5
    assert r2.status_code == 200, r2.text
    assert _last_upstream(stack["reported"])["thinking_token_budget"] == 5
    assert "limit=tokens_per_day" in r2.headers["x-litellm-kv-reasoning-clamped"]
    r3 = _chat(stack["proxy"], "sk-daily")
    assert r3.status_code == 429, r3.text
    msg = r3.json()["error"]["message"]
    assert "key 'daily' has used 25 of 25 reasoning tokens this day" in msg and "resets at" in msg
    assert 0 < int(r3.headers["retry-after"]) <= 86400


def test_openai_style_maps_budget_to_effort(stack: dict[str, Any]) -> None:
    r = _chat(stack["proxy"], "sk-team", model="o-mini", reasoning_effort="high")
    assert r.status_code == 200, r.text
    up = _last_upstream(stack["reported"])
    assert up["reasoning_effort"] == "none"  # team max 4 tokens: no effort level fits above 'none'
    assert "thinking_token_budget" not in up


@pytest.mark.parametrize(("key", "field"), [
    ("sk-bad", "metadata.litellm_kv.reasoning.max_budget must be an integer >= 0, got \"lots\""),
    ("sk-badjson", "metadata.litellm_kv is not valid JSON"),
])
def test_malformed_metadata_is_a_clear_400(stack: dict[str, Any], key: str, field: str) -> None:
    before = _invalid_metadata_counts(stack["proxy"])
    r = _chat(stack["proxy"], key)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    alias = KEYS[key]["key_alias"]
    assert msg.startswith(f"key '{alias}': ") and field in msg
    assert _invalid_metadata_counts(stack["proxy"]) == {**before, "reject": before["reject"] + 1}


def _invalid_metadata_counts(proxy: Proxy) -> dict[str, float]:
    return {"reject": 0.0, "ignore": 0.0, **proxy.metric_by("litellm_kv_reasoning_invalid_metadata_total", "action")}


@pytest.mark.parametrize("key", ["sk-bad", "sk-badjson"])
def test_ignored_malformed_metadata_leaves_the_config_limits(stack: dict[str, Any], key: str) -> None:
    """``invalid_metadata: ignore``: the key's broken section is dropped (and counted), the group's own limit holds."""
    before = _invalid_metadata_counts(stack["proxy"])
    r = _chat(stack["proxy"], key, model="qwen-lenient", extra_body={"thinking_token_budget": 400})
    assert r.status_code == 200, r.text
    assert _last_upstream(stack["reported"])["thinking_token_budget"] == 7
    assert r.headers["x-litellm-kv-reasoning-clamped"] == (
        "requested=400; budget=7; limit=max_budget; source=config model_groups.qwen-lenient.reasoning"
    )
    assert _invalid_metadata_counts(stack["proxy"]) == {**before, "ignore": before["ignore"] + 1}
