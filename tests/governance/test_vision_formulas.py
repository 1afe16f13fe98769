"""Visual-token formulas against their reference implementations and published examples.

* Qwen2.5-VL / Qwen3-VL: differential against ``transformers``' own Qwen2-VL image processor
  (``get_number_of_image_patches``, the function vLLM calls to size the placeholder) configured as
  each model's published ``preprocessor_config.json``. It runs in ``.venv-engine`` (transformers
  5.x, no weights needed) through a subprocess, so the proxy venv stays free of transformers.
* OpenAI tiles/patches and Anthropic: differential against LiteLLM 1.110.2's own estimators
  (``litellm.litellm_core_utils.token_counter``), plus the providers' published examples.
* Gemini: published values only (no reference implementation runs here).
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from litellm_kv.governance.vision import FAMILIES, max_visual_tokens, qwen_resize, visual_tokens

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PY = ROOT / ".venv-engine" / "bin" / "python"

_REFERENCE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as P
procs = {
    "qwen2_5_vl": P(size={"shortest_edge": 3136, "longest_edge": 12845056}, patch_size=14, merge_size=2),
    "qwen3_vl": P(size={"shortest_edge": 65536, "longest_edge": 16777216}, patch_size=16, merge_size=2),
}
out = []
for family, w, h, lo, hi in json.load(sys.stdin):
    kw = {}
    if lo is not None: kw["min_pixels"] = lo
    if hi is not None: kw["max_pixels"] = hi
    p = procs[family]
    try:
        out.append(p.get_number_of_image_patches(h, w, kw) // (p.merge_size ** 2))
    except ValueError:
        out.append("error")
print(json.dumps(out))
"""


def _random_sizes(rng: random.Random, n: int) -> list[tuple[int, int]]:
    sizes: list[tuple[int, int]] = []
    for i in range(n):
        shape = i % 4
        if shape == 0:  # everyday photos and screenshots
            sizes.append((rng.randint(16, 4096), rng.randint(16, 4096)))
        elif shape == 1:  # tiny images (grow branch)
            sizes.append((rng.randint(1, 120), rng.randint(1, 120)))
        elif shape == 2:  # huge scans (shrink branch)
            sizes.append((rng.randint(2000, 12000), rng.randint(2000, 12000)))
        else:  # elongated, around the aspect-ratio limit of 200
            short = rng.randint(1, 80)
            sizes.append((short, short * rng.randint(100, 260)) if rng.random() < 0.5 else (short * 190, short))
    # Exact grid multiples and half-way points exercise round-half-to-even.
    sizes += [(896, 896), (28 * 15 + 14, 28 * 9 + 14), (32 * 7 + 16, 32 * 3 + 16), (1, 1), (200, 1), (201, 1)]
    return sizes


@pytest.mark.skipif(not ENGINE_PY.exists(), reason=".venv-engine (transformers reference) not installed")
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_qwen_matches_transformers_processor(family: str) -> None:
    rng = random.Random(f"qwen-{family}")
    cases: list[tuple[str, int, int, int | None, int | None]] = []
    for w, h in _random_sizes(rng, 300):
        cases.append((family, w, h, None, None))
    # Caller-chosen bounds, as vLLM's mm_processor_kwargs set them (the downscale path).
    for w, h in _random_sizes(rng, 120):
        hi = rng.choice([28 * 28 * 64, 200_704, 401_408, 1_003_520, rng.randint(50_000, 3_000_000)])
        lo = rng.choice([None, 3136, 65536, rng.randint(1000, 40_000)])
        cases.append((family, w, h, lo, hi))
    ran = subprocess.run(
        [str(ENGINE_PY), "-c", _REFERENCE], input=json.dumps(cases), capture_output=True, text=True, timeout=300,
        check=True,
    )
    expected = json.loads(ran.stdout.strip().splitlines()[-1])
    assert len(expected) == len(cases) >= 400
    mismatches = []
    for (fam, w, h, lo, hi), want in zip(cases, expected, strict=True):
        try:
            got: int | str = visual_tokens(fam, w, h, min_pixels=lo, max_pixels=hi)
        except ValueError:
            got = "error"
        if got != want:
            mismatches.append((w, h, lo, hi, got, want))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:5]}"


def test_qwen_published_examples() -> None:
    # Issue text / Qwen2.5-VL docs: 896x896 -> 32x32 cells of 28 px = 1024 tokens.
    assert visual_tokens("qwen2_5_vl", 896, 896) == 1024
    assert qwen_resize("qwen2_5_vl", 896, 896) == (896, 896)
    # Qwen3-VL: 32-px cells, so 896x896 is 28x28 = 784 tokens.
    assert visual_tokens("qwen3_vl", 896, 896) == 784
    # The transformers class default (max 1280 tokens) is what many deployments pass explicitly.
    assert visual_tokens("qwen2_5_vl", 4000, 3000, max_pixels=28 * 28 * 1280) <= 1280
    # Small images are grown to min_pixels: Qwen3-VL's 65,536-pixel floor is 64 tokens.
    assert visual_tokens("qwen3_vl", 10, 10) == 64
    with pytest.raises(ValueError, match="aspect ratio"):
        visual_tokens("qwen2_5_vl", 201, 1)


# -- OpenAI ----------------------------------------------------------------------------------


def test_openai_published_examples() -> None:
    # platform.openai.com/docs/guides/vision, "Calculating costs".
    assert visual_tokens("openai", 1024, 1024, detail="high") == 765
    assert visual_tokens("openai", 2048, 4096, detail="high") == 1105
    assert visual_tokens("openai", 4096, 8192, detail="low") == 85
    # auto is counted as high (the bound); small images are never enlarged: one tile.
    assert visual_tokens("openai", 128, 64) == 255
    # Patch models (GPT-4.1-mini family), before their per-model multiplier.
    assert visual_tokens("openai_patch", 1024, 1024) == 1024
    assert visual_tokens("openai_patch", 1800, 2400) == 1452


def test_openai_matches_litellm_estimators() -> None:
    from litellm.litellm_core_utils import token_counter as tc

    rng = random.Random("openai")
    sizes = _random_sizes(rng, 250)
    for w, h in sizes:
        assert visual_tokens("openai", w, h, detail="high") == tc._image_policy_tokens("gpt-4o", (w, h), "high"), (w, h)
        assert visual_tokens("openai", w, h, detail="low") == tc._image_policy_tokens("gpt-4o", (w, h), "low")
        assert visual_tokens("openai_patch", w, h) == tc._image_patch_count(w, h, 10**9, 1536), (w, h)


# -- Anthropic -------------------------------------------------------------------------------


def test_anthropic_published_rule() -> None:
    # docs.anthropic.com vision: ceil(w/28) * ceil(h/28) visual tokens within the native resolution.
    assert visual_tokens("anthropic", 1000, 1000) == 36 * 36
    assert visual_tokens("anthropic", 200, 200) == 8 * 8
    assert visual_tokens("anthropic", 1092, 1092) == 39 * 39
    # Large images shrink to the 1,568-token budget (standard) or 4,784 (Opus 4.7+ "high").
    assert 1500 <= visual_tokens("anthropic", 6000, 4000) <= 1568
    assert 4600 <= visual_tokens("anthropic", 6000, 4000, detail="high") <= 4784


def test_anthropic_matches_litellm_estimator() -> None:
    from litellm.litellm_core_utils import token_counter as tc

    rng = random.Random("anthropic")
    for w, h in _random_sizes(rng, 250):
        assert visual_tokens("anthropic", w, h) == tc._anthropic_image_tokens((w, h), (1568, 1568)), (w, h)
        assert visual_tokens("anthropic", w, h, detail="high") == tc._anthropic_image_tokens((w, h), (2576, 4784))


# -- Gemini and fixed --------------------------------------------------------------------------


def test_gemini_published_values() -> None:
    # ai.google.dev/gemini-api/docs/tokens: both sides <= 384 px -> 258 tokens; larger -> 258 per tile.
    assert visual_tokens("gemini", 384, 384) == 258
    assert visual_tokens("gemini", 100, 384) == 258
    assert visual_tokens("gemini", 1024, 1024) == 4 * 258
    # Gemini 3 media_resolution levels.
    assert [visual_tokens("gemini", 4000, 3000, detail=d) for d in ("low", "medium", "high")] == [280, 560, 1120]


def test_fixed_and_errors() -> None:
    assert visual_tokens("fixed", 1, 1, tokens_per_image=576) == 576
    with pytest.raises(ValueError):
        visual_tokens("fixed", 10, 10)
    with pytest.raises(ValueError, match="unknown vision family"):
        visual_tokens("llava", 10, 10)
    with pytest.raises(ValueError, match="positive"):
        visual_tokens("qwen2_5_vl", 0, 10)


# -- ceilings (used for remote images that are not fetched) --------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    family=st.sampled_from(["qwen2_5_vl", "qwen3_vl"]),
    w=st.integers(1, 50_000),
    h=st.integers(1, 50_000),
    hi=st.one_of(st.none(), st.integers(4_000, 20_000_000)),
    lo=st.one_of(st.none(), st.integers(1, 100_000)),
)
def test_qwen_ceiling_is_an_upper_bound(family: str, w: int, h: int, hi: int | None, lo: int | None) -> None:
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    ceiling = max_visual_tokens(family, min_pixels=lo, max_pixels=hi)
    assert ceiling is not None
    try:
        tokens = visual_tokens(family, w, h, min_pixels=lo, max_pixels=hi)
    except ValueError:
        return
    assert tokens <= ceiling


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(["openai", "openai_patch", "anthropic"]), w=st.integers(1, 30_000),
       h=st.integers(1, 30_000), detail=st.sampled_from([None, "low", "high", "auto"]))
def test_provider_ceilings(family: str, w: int, h: int, detail: str | None) -> None:
    ceiling = max_visual_tokens(family, detail=detail)
    assert ceiling is not None and visual_tokens(family, w, h, detail=detail) <= ceiling


def test_every_family_is_documented() -> None:
    doc = (ROOT / "docs" / "vision.md").read_text()
    for family in FAMILIES:
        assert f"`{family}`" in doc
