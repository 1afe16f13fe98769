"""Request and metadata readers given what a hostile client (or a careless admin) can send: each gives a
value or a MetadataError naming the field, never another exception that would skip the policy."""

from __future__ import annotations

import pytest

from litellm_kv.errors import MetadataError
from litellm_kv.governance.policy import metadata_layer


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
