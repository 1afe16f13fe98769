"""The save-time check of key/team metadata (``governance.metadata``): every bad field named at once, the
same verdict as the request path's readers, and a JSON Schema that agrees with both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from litellm_kv.errors import MetadataError
from litellm_kv.governance import reasoning, vision_policy
from litellm_kv.governance.metadata import SECTIONS, metadata_json_schema, validate_kv_settings, validate_metadata
from litellm_kv.governance.policy import config_layer, metadata_layer

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "docs" / "key-metadata.schema.json"


def test_documented_examples_are_valid() -> None:
    md = {
        "team_note": "kept as is",
        "litellm_kv": {
            "reasoning": {"max_budget": 2048, "tokens_per_day": 200000, "show_reasoning": False},
            "vision": {"max_images_per_request": 4, "max_visual_tokens_per_request": 4096,
                       "max_pixels_per_image": 1003520, "tokens_per_day": 2000000, "over_limit": "downscale"},
        },
    }
    assert validate_metadata(md) == []
    assert validate_metadata(None) == [] and validate_metadata({}) == [] and validate_metadata("") == []


def test_one_line_json_string_as_the_team_editor_stores_it() -> None:
    md = {"litellm_kv": '{"reasoning": {"max_budget": 64}}'}
    assert validate_metadata(md) == []
    bad = validate_metadata({"litellm_kv": '{"reasoning": {"max_budget": "lots"}}'}, where="team 'research'")
    assert [e.path for e in bad] == ["metadata.litellm_kv.reasoning.max_budget"]
    assert bad[0].message == (
        "team 'research': metadata.litellm_kv.reasoning.max_budget must be an integer >= 0, got \"lots\""
    )
    assert validate_metadata(json.dumps(md)) == []


def test_every_bad_field_is_named_at_once() -> None:
    md = {"litellm_kv": {
        "reasoning": {"max_budget": "lots", "over_max": "sometimes", "max_bugdet": 5, "allowed": True},
        "vison": {"max_images_per_request": 1},
        "vision": {"max_pixels_per_image": 0, "tokens_per_day": -1, "over_limit": "reject"},
    }}
    errors = validate_metadata(md, where="key 'bot-a'")
    assert sorted(e.path for e in errors) == sorted([
        "metadata.litellm_kv.reasoning.max_budget",
        "metadata.litellm_kv.reasoning.over_max",
        "metadata.litellm_kv.reasoning.max_bugdet",
        "metadata.litellm_kv.vison",
        "metadata.litellm_kv.vision.max_pixels_per_image",
        "metadata.litellm_kv.vision.tokens_per_day",
    ])
    assert all(e.message.startswith("key 'bot-a': " + e.path) for e in errors)
    assert {e.path: e.to_json()["value"] for e in errors}["metadata.litellm_kv.reasoning.max_budget"] == "lots"


@pytest.mark.parametrize(("md", "path"), [
    ("{not json", "metadata"),
    ({"litellm_kv": 5}, "metadata.litellm_kv"),
    ({"litellm_kv": "[1]"}, "metadata.litellm_kv"),
    ({"litellm_kv": "{bad"}, "metadata.litellm_kv"),
    ({"litellm_kv": {"reasoning": [1]}}, "metadata.litellm_kv.reasoning"),
    ({"litellm_kv": {"vision": "{bad"}}, "metadata.litellm_kv.vision"),
])
def test_wrong_shapes_name_the_field(md: Any, path: str) -> None:
    errors = validate_metadata(md)
    assert [e.path for e in errors] == [path]


def test_configured_metadata_key() -> None:
    md = {"kv": {"reasoning": {"max_budget": "lots"}}, "litellm_kv": {"reasoning": {"max_budget": "x"}}}
    assert [e.path for e in validate_metadata(md, metadata_key="kv")] == ["metadata.kv.reasoning.max_budget"]
    assert validate_kv_settings({"reasoning": {"max_budget": 1}}, metadata_key="kv") == []


# -- one definition: the save-time check, the request path and the schema agree ---------------------

SAMPLES: list[Any] = [None, 0, 1, -1, 7, 2048, 2048.0, 2.5, True, False, "lots", "64", "clamp", "reject",
                      "downscale", [], {}, 2**40]


def _request_path_accepts(section: str, values: dict[str, Any]) -> bool:
    """What the proxy does with this section on a request (the resolvers the request path calls)."""
    key = metadata_layer({"litellm_kv": {section: values}}, section, where="key 'k'")
    cfg = config_layer({}, group="g", feature=section)
    resolve = reasoning.resolve_policy if section == "reasoning" else vision_policy.resolve_policy
    try:
        resolve(key, None, cfg, key_scope="key:k", team_scope=None)
    except MetadataError:
        return False
    return True


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_check_schema_and_request_path_agree_on_every_field(section: str) -> None:
    validator = jsonschema.Draft202012Validator(metadata_json_schema())
    names = [spec.name for spec in SECTIONS[section]] + ["not_a_field"]
    for name in names:
        for value in SAMPLES:
            obj = {section: {name: value}}
            by_check = validate_kv_settings(obj) == []
            by_schema = validator.is_valid(obj)
            by_request = _request_path_accepts(section, {name: value})
            assert by_check == by_schema == by_request, (section, name, value, by_check, by_schema, by_request)


def test_specs_are_the_fields_the_request_path_reads() -> None:
    assert tuple(s.name for s in SECTIONS["reasoning"]) == reasoning.POLICY_FIELDS
    assert tuple(s.name for s in SECTIONS["vision"]) == vision_policy.POLICY_FIELDS


def test_published_schema_file_is_generated_from_the_code() -> None:
    """docs/key-metadata.schema.json is written by tools/docsgen.py; a stale copy fails here."""
    assert json.loads(SCHEMA_FILE.read_text()) == metadata_json_schema()
