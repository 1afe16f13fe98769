"""Request and metadata readers given what a hostile client (or a careless admin) can send: each gives a
value or a MetadataError naming the field, never another exception that would skip the policy."""

from __future__ import annotations

import pytest

from litellm_kv.errors import MetadataError
from litellm_kv.governance.policy import metadata_layer
from litellm_kv.governance.reasoning import (
    DEFAULT_EFFORT_BUDGETS,
    MAX_CLIENT_BUDGET,
    read_client_ask,
    strip_client_reasoning,
)


@pytest.mark.parametrize("place", ["", "extra_body", "vllm_xargs"])
def test_reasoning_max_budget_sees_a_400_digit_budget_as_the_largest_ask(place: str) -> None:
    huge = int("9" * 400)
    fields = {"thinking": {"type": "enabled", "budget_tokens": huge}, "thinking_token_budget": huge}
    data = {**fields} if not place else {place: fields}
    ask = read_client_ask(data, DEFAULT_EFFORT_BUDGETS, "enable_thinking")
    assert ask.budget == MAX_CLIENT_BUDGET and not ask.off
    strip_client_reasoning(data, "enable_thinking")
    assert data == {}


def test_reasoning_limits_refuse_key_metadata_nested_too_deeply() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(MetadataError) as exc:
        metadata_layer({"litellm_kv": deep}, "reasoning", where="key 'deep'")
    assert exc.value.limit_name == "metadata.litellm_kv" and exc.value.status_code == 400


def test_reasoning_limits_name_a_deeply_nested_bad_value() -> None:
    value: object = 1
    for _ in range(5000):
        value = [value]
    with pytest.raises(MetadataError) as exc:
        metadata_layer({"litellm_kv": {"reasoning": {"max_budget": value}}}, "reasoning", where="key 'k'") \
            .int_field("max_budget")
    assert exc.value.limit_name == "metadata.litellm_kv.reasoning.max_budget"
    assert len(exc.value.message) < 400  # the value is cut, the message stays readable
