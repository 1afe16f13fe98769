"""Pure reasoning decisions: what a client asked for, stripping, and the fields written per provider style."""

from __future__ import annotations

from typing import Any

from litellm_kv.governance.reasoning import (
    DEFAULT_EFFORT_BUDGETS,
    GroupReasoningSettings,
    ReasoningDecision,
    apply_decision,
    effort_for_budget,
    read_client_ask,
    requested_sequences,
    strip_client_reasoning,
)


def test_largest_explicit_ask_wins_and_off_wins_over_all() -> None:
    data: dict[str, Any] = {"thinking_token_budget": 10, "extra_body": {"thinking_token_budget": 900}}
    ask = read_client_ask(data, DEFAULT_EFFORT_BUDGETS, "enable_thinking")
    assert (ask.budget, ask.field) == (900, "extra_body.thinking_token_budget")
    off = read_client_ask({"reasoning_effort": "high", "chat_template_kwargs": {"thinking": False}},
                          DEFAULT_EFFORT_BUDGETS, "enable_thinking")
    assert off.off


def test_strip_removes_every_override_place() -> None:
    data: dict[str, Any] = {"thinking": {"type": "enabled"}, "chat_template_kwargs": {"enable_thinking": True, "x": 1},
                            "vllm_xargs": {"thinking_token_budget": 5}, "extra_body": {"reasoning_effort": "max"}}
    removed = strip_client_reasoning(data, "enable_thinking")
    assert data == {"chat_template_kwargs": {"x": 1}}
    assert set(removed) == {"thinking", "chat_template_kwargs.enable_thinking", "vllm_xargs.thinking_token_budget",
                            "extra_body.reasoning_effort"}


def test_anthropic_and_openai_styles() -> None:
    data: dict[str, Any] = {"max_tokens": 1000}
    apply_decision(data, ReasoningDecision(True, 2048), GroupReasoningSettings(style="anthropic"))
    assert data == {"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 2048 + 512}
    data = {}
    apply_decision(data, ReasoningDecision(False, 0), GroupReasoningSettings(style="anthropic"))
    assert data == {"thinking": {"type": "disabled"}}
    data = {}
    apply_decision(data, ReasoningDecision(True, 3000), GroupReasoningSettings(style="openai"))
    assert data == {"reasoning_effort": "medium"}
    assert effort_for_budget(0, DEFAULT_EFFORT_BUDGETS) == "none"


def test_the_sequences_a_request_asks_for_are_read_as_the_engine_reads_them() -> None:
    assert requested_sequences({}) == 1
    assert requested_sequences({"n": None}) == 1
    assert requested_sequences({"n": 4, "extra_body": {"n": "16"}}) == 16  # the largest, wherever it is
    assert requested_sequences({"best_of": 8.0}) == 8
    for bad in (0, -1, 2.5, "many", True, [2], float("inf")):
        assert requested_sequences({"n": bad}) is None, bad


def test_a_request_s_sequences_share_its_budget() -> None:
    """vLLM applies thinking_token_budget to each sequence: the request's budget is divided among them."""
    data: dict[str, Any] = {"n": 8, "max_tokens": 10}
    apply_decision(data, ReasoningDecision(True, 100, sequences=8), GroupReasoningSettings())
    assert data["thinking_token_budget"] == 12
    assert data["max_tokens"] == 12 + GroupReasoningSettings().answer_tokens
    assert ReasoningDecision.from_json(ReasoningDecision(True, 100, sequences=8).to_json()).per_sequence == 12
