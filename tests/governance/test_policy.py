"""Policy layers: metadata parsing, field errors naming key and field, strictest-wins resolution."""

from __future__ import annotations

import pytest

from litellm_kv.errors import ConfigError, MetadataError
from litellm_kv.governance.policy import (
    Limit,
    config_layer,
    metadata_layer,
    read_kv_settings,
    strictest_bool,
    strictest_choice,
    strictest_min,
)


def test_reads_dict_and_json_string_metadata() -> None:
    md = {"litellm_kv": {"reasoning": {"max_budget": 64}}}
    assert read_kv_settings(md, where="key 'a'") == {"reasoning": {"max_budget": 64}}
    as_text = '{"litellm_kv": "{\\"reasoning\\": {\\"max_budget\\": 64}}"}'
    assert metadata_layer(as_text, "reasoning", where="key 'a'").values == {"max_budget": 64}
    assert read_kv_settings(None, where="key 'a'") == {}
    assert metadata_layer({"other": 1}, "reasoning", where="key 'a'").values == {}


def test_invalid_json_names_owner_and_field() -> None:
    with pytest.raises(MetadataError) as e:
        read_kv_settings({"litellm_kv": "{not json"}, where="key 'bot-a'")
    assert e.value.status_code == 400
    assert "key 'bot-a'" in e.value.message and "metadata.litellm_kv" in e.value.message


def test_wrong_section_type_names_field() -> None:
    with pytest.raises(MetadataError) as e:
        metadata_layer({"litellm_kv": {"reasoning": [1, 2]}}, "reasoning", where="team 'research'")
    assert "team 'research'" in str(e.value)
    assert "metadata.litellm_kv.reasoning" in str(e.value)


def test_field_validation_messages() -> None:
    layer = metadata_layer({"litellm_kv": {"reasoning": {"max_budget": "lots", "allowed": 1}}},
                           "reasoning", where="key 'bot-a'")
    with pytest.raises(MetadataError) as e:
        layer.int_field("max_budget")
    assert str(e.value) == (
        "key 'bot-a': metadata.litellm_kv.reasoning.max_budget must be an integer >= 0, got \"lots\""
    )
    with pytest.raises(MetadataError, match=r"reasoning.allowed must be true or false"):
        layer.bool_field("allowed")
    with pytest.raises(MetadataError, match=r"reasoning.max_budget is not a known field"):
        metadata_layer({"litellm_kv": {"reasoning": {"max_budget": 1}}}, "reasoning",
                       where="k").check_known(["allowed"])
    assert layer.int_field("absent") is None


def test_config_layer_errors_are_config_errors() -> None:
    layer = config_layer({"max_budget": -1}, group="qwen", feature="reasoning")
    with pytest.raises(ConfigError, match=r"litellm_kv.model_groups.qwen.reasoning.max_budget"):
        layer.int_field("max_budget")


def test_strictest_wins_and_keeps_source() -> None:
    assert strictest_min(Limit(100, "key"), None, Limit(50, "team"), Limit(80, "config")) == Limit(50, "team")
    assert strictest_min(None, None) is None
    assert strictest_bool(Limit(True, "key"), Limit(False, "team")) == Limit(False, "team")
    assert strictest_bool(Limit(True, "key"), None) == Limit(True, "key")
    order = ("clamp", "reject")
    got = strictest_choice(order, Limit("clamp", "key"), Limit("reject", "config"))
    assert got == Limit("reject", "config")
