"""The processor bounds images are counted with are the ones the engine receives.

LiteLLM sends a client's ``mm_processor_kwargs`` to vLLM from the top level and from ``extra_body``;
vLLM resizes each image with them. Counting with other bounds than the engine's lets a client turn
an image counted at 4 tokens into ~15K, past ``max_visual_tokens_per_request`` and the period budgets.
"""

from __future__ import annotations

from typing import Any

import pytest

from litellm_kv.errors import PolicyViolation
from litellm_kv.governance.vision import visual_tokens
from litellm_kv.governance.vision_policy import (
    GroupVisionSettings,
    PixelBounds,
    engine_bounds,
    processor_kwargs_of,
    take_processor_kwargs,
)

QWEN = GroupVisionSettings(family="qwen2_5_vl")


def bounds_of(data: dict[str, Any], gs: GroupVisionSettings = QWEN) -> PixelBounds:
    return engine_bounds(take_processor_kwargs(data), gs)


@pytest.mark.parametrize("where", ["top", "extra_body"])
def test_max_visual_tokens_client_min_pixels_is_counted_wherever_it_is_sent(where: str) -> None:
    kwargs = {"min_pixels": 12_000_000}
    data: dict[str, Any] = {"model": "m", "extra_body": {"keep": 1}}
    if where == "top":
        data["mm_processor_kwargs"] = kwargs
    else:
        data["extra_body"]["mm_processor_kwargs"] = kwargs
    b = bounds_of(data)
    # Both copies are gone; the caller writes exactly these bounds back at top level.
    assert "mm_processor_kwargs" not in data and data["extra_body"] == {"keep": 1}
    assert processor_kwargs_of(b) == {"min_pixels": 12_000_000, "max_pixels": 28 * 28 * 16384}
    assert visual_tokens("qwen2_5_vl", 28, 28) == 4
    counted = visual_tokens("qwen2_5_vl", 28, 28, min_pixels=b.min_pixels, max_pixels=b.max_pixels)
    assert counted == visual_tokens("qwen2_5_vl", 28, 28, min_pixels=12_000_000) > 15_000


def test_max_visual_tokens_without_client_bounds_nothing_is_written() -> None:
    data: dict[str, Any] = {"model": "m"}
    assert take_processor_kwargs(data) is None
    assert engine_bounds(None, GroupVisionSettings(family="qwen2_5_vl", max_pixels=1_003_520)) == PixelBounds(
        None, 1_003_520)


def test_max_visual_tokens_same_value_twice_is_one_value_two_values_are_refused() -> None:
    same = {"mm_processor_kwargs": {"max_pixels": 200_704},
            "extra_body": {"mm_processor_kwargs": {"max_pixels": 200_704}}}
    assert bounds_of(same).max_pixels == 200_704
    two = {"mm_processor_kwargs": {"max_pixels": 200_704}, "extra_body": {"mm_processor_kwargs": {"max_pixels": 9}}}
    with pytest.raises(PolicyViolation) as err:
        bounds_of(two)
    assert err.value.status_code == 400 and err.value.limit_name == "vision.mm_processor_kwargs.max_pixels"
    assert "mm_processor_kwargs" not in two and two["extra_body"] == {}  # nothing left behind


@pytest.mark.parametrize("kwargs,field,limit", [
    # A client's own field names stay out of the limit name (it is a metric label).
    ({"size": {"shortest_edge": 12_000_000, "longest_edge": 16_777_216}}, "size", "mm_processor_kwargs"),
    ({"patch_size": 7}, "patch_size", "mm_processor_kwargs"),
    ({"min_pixels": "12000000"}, "min_pixels", "mm_processor_kwargs.min_pixels"),
    ({"max_pixels": 0}, "max_pixels", "mm_processor_kwargs.max_pixels"),
    ({"max_pixels": True}, "max_pixels", "mm_processor_kwargs.max_pixels"),
    ({"min_pixels": 500_000, "max_pixels": 100_000}, "min_pixels", "mm_processor_kwargs.min_pixels"),
    # past max_image_pixels: every image a decompression bomb
    ({"min_pixels": 90_000_000}, "min_pixels", "mm_processor_kwargs.min_pixels"),
])
def test_max_visual_tokens_uncountable_processor_kwargs_are_refused(kwargs: dict[str, Any], field: str,
                                                                    limit: str) -> None:
    with pytest.raises(PolicyViolation) as err:
        bounds_of({"extra_body": {"mm_processor_kwargs": kwargs}})
    assert err.value.status_code == 400
    assert err.value.limit_name == f"vision.{limit}"
    assert f"mm_processor_kwargs.{field}" in err.value.message


def test_max_visual_tokens_unknown_field_twice_keeps_the_limit_name_fixed() -> None:
    with pytest.raises(PolicyViolation) as err:
        bounds_of({"mm_processor_kwargs": {"x" * 50: 1}, "extra_body": {"mm_processor_kwargs": {"x" * 50: 2}}})
    assert err.value.limit_name == "vision.mm_processor_kwargs"


def test_max_visual_tokens_processor_kwargs_refused_on_families_the_engine_does_not_resize() -> None:
    with pytest.raises(PolicyViolation) as err:
        bounds_of({"mm_processor_kwargs": {"max_pixels": 100_000}}, GroupVisionSettings(family="openai"))
    assert err.value.limit_name == "vision.mm_processor_kwargs"
    with pytest.raises(PolicyViolation):
        bounds_of({"mm_processor_kwargs": ["min_pixels"]})
