"""Visual tokens: how many prompt tokens one image becomes, per model family.

Pure functions, no I/O. The public entry point is :func:`visual_tokens`::

    from litellm_kv.governance.vision import visual_tokens
    visual_tokens("qwen2_5_vl", 896, 896)   # 1024

Families and their published defaults (sources in ``docs/vision.md``):

* ``qwen2_5_vl``: resize so both sides are multiples of 28 (14-px patches merged 2×2) with the
  pixel count inside ``[min_pixels, max_pixels]`` (defaults 3,136 and 12,845,056 from the model's
  ``preprocessor_config.json``); one token per 28×28 cell.
* ``qwen3_vl``: the same rule with 16-px patches (factor 32) and defaults 65,536 / 16,777,216.
* ``openai``: 512-px tiles (GPT-4o, GPT-4.1, o-series): ``detail="low"`` → 85, otherwise fit in
  2048×2048, shorten the short side to 768, 85 + 170 per tile. ``openai_patch``: 32-px patches
  capped at 1,536 (GPT-4.1-mini/nano, o4-mini), before the per-model multiplier.
* ``anthropic``: ⌈w/28⌉·⌈h/28⌉ after fitting into the native resolution (long edge 1,568 px and
  1,568 tokens; ``detail="high"``: 2,576 px and 4,784 tokens, Claude Opus 4.7 and later).
* ``gemini``: Gemini 2.x: 258 for an image with both sides ≤ 384 px, else 258 per crop tile;
  ``detail`` ``"low"``/``"medium"``/``"high"`` → Gemini 3 ``media_resolution`` (280/560/1,120).
* ``fixed``: ``tokens_per_image`` for every image.

Qwen counts are the ``<|image_pad|>`` tokens the engine inserts, which is what vLLM reports in
``usage.prompt_tokens_details.multimodal_tokens``; the two ``<|vision_start|>``/``<|vision_end|>``
markers come from the chat template and are ordinary text tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

Family = Literal["qwen2_5_vl", "qwen3_vl", "openai", "openai_patch", "anthropic", "gemini", "fixed"]
FAMILIES: Final[tuple[str, ...]] = (
    "qwen2_5_vl", "qwen3_vl", "openai", "openai_patch", "anthropic", "gemini", "fixed",
)
#: Families whose engine (vLLM) resizes on request: ``mm_processor_kwargs.max_pixels`` works for them.
ENGINE_RESIZABLE: Final[frozenset[str]] = frozenset({"qwen2_5_vl", "qwen3_vl"})


@dataclass(frozen=True, slots=True)
class QwenGrid:
    """Patch geometry of a Qwen-VL image processor and its published pixel bounds."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    #: The HF processor refuses images more elongated than this (vLLM answers 400).
    max_aspect_ratio: float = 200.0

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


QWEN_GRIDS: Final[dict[str, QwenGrid]] = {
    # Qwen/Qwen2.5-VL-*-Instruct preprocessor_config.json: min_pixels 3136, max_pixels 12845056.
    "qwen2_5_vl": QwenGrid(patch_size=14, merge_size=2, min_pixels=56 * 56, max_pixels=28 * 28 * 16384),
    # Qwen/Qwen3-VL-*-Instruct preprocessor_config.json: size.shortest_edge 65536, longest_edge 16777216.
    "qwen3_vl": QwenGrid(patch_size=16, merge_size=2, min_pixels=256 * 256, max_pixels=4096 * 4096),
}

OPENAI_BASE_TOKENS: Final = 85
OPENAI_TILE_TOKENS: Final = 170
OPENAI_PATCH_BUDGET: Final = 1536
ANTHROPIC_LIMITS: Final[dict[str, tuple[int, int]]] = {"standard": (1568, 1568), "high": (2576, 4784)}
GEMINI_TILE_TOKENS: Final = 258
GEMINI_MEDIA_RESOLUTION: Final[dict[str, int]] = {"low": 280, "medium": 560, "high": 1120}


def qwen_resize(family: str, width: int, height: int, *, min_pixels: int | None = None,
                max_pixels: int | None = None) -> tuple[int, int]:
    """``(width, height)`` the Qwen image processor resizes to (multiples of its factor).

    Raises ``ValueError`` for an aspect ratio above 200, which the processor rejects.
    """
    grid = QWEN_GRIDS[family]
    lo = grid.min_pixels if min_pixels is None else min_pixels
    hi = grid.max_pixels if max_pixels is None else max_pixels
    f = grid.factor
    if max(width, height) / min(width, height) > grid.max_aspect_ratio:
        raise ValueError(
            f"aspect ratio {max(width, height) / min(width, height):.1f} exceeds {grid.max_aspect_ratio:g}, "
            f"which {family} models reject"
        )
    # Same arithmetic (and float rounding) as the reference processor, step by step: round to the
    # grid, then shrink with floor or grow with ceil so the pixel count lands inside [lo, hi].
    h = round(height / f) * f
    w = round(width / f) * f
    if h * w > hi:
        shrink = math.sqrt(height * width / hi)
        h = max(f, math.floor(height / shrink / f) * f)
        w = max(f, math.floor(width / shrink / f) * f)
    elif h * w < lo:
        grow = math.sqrt(lo / (height * width))
        h = math.ceil(height * grow / f) * f
        w = math.ceil(width * grow / f) * f
    return w, h


def _qwen_tokens(family: str, width: int, height: int, min_pixels: int | None, max_pixels: int | None) -> int:
    w, h = qwen_resize(family, width, height, min_pixels=min_pixels, max_pixels=max_pixels)
    f = QWEN_GRIDS[family].factor
    return (w // f) * (h // f)


def _openai_tiles(width: int, height: int, detail: str | None) -> int:
    if detail == "low":
        return OPENAI_BASE_TOKENS
    # "high" and "auto" alike: auto may pick low for small images, high is the bound we can promise.
    # Fit in 2048×2048, then shorten the short side to 768 (never enlarge).
    scale = min(1.0, 2048 / max(width, height), 768 / min(width, height))
    w = max(1, math.floor(width * scale))
    h = max(1, math.floor(height * scale))
    return OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * math.ceil(w / 512) * math.ceil(h / 512)


def _openai_patches(width: int, height: int) -> int:
    patches = math.ceil(width / 32) * math.ceil(height / 32)
    if patches <= OPENAI_PATCH_BUDGET:
        return patches
    # Shrink to the budget, then a little more so whole patches fit along both sides.
    shrink = math.sqrt(32 * 32 * OPENAI_PATCH_BUDGET / (width * height))
    across, down = width * shrink / 32, height * shrink / 32
    shrink *= min(math.floor(across) / across, math.floor(down) / down)
    w = max(1, math.floor(width * shrink))
    h = max(1, math.floor(height * shrink))
    return math.ceil(w / 32) * math.ceil(h / 32)


def _anthropic(width: int, height: int, detail: str | None) -> int:
    max_edge, budget = ANTHROPIC_LIMITS["high" if detail == "high" else "standard"]
    long_edge, short_edge = max(width, height), min(width, height)
    ratio = long_edge / short_edge

    def cost(edge: int) -> int:
        return math.ceil(edge / 28) * math.ceil(max(1, round(edge / ratio)) / 28)

    if long_edge <= max_edge and cost(long_edge) <= budget:
        return cost(long_edge)
    # The largest long edge (same aspect ratio) within both the edge and the token budget;
    # cost() is monotone in the edge, so bisect.
    lo, hi = 1, min(long_edge, max_edge)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return cost(lo)


def _gemini(width: int, height: int, detail: str | None) -> int:
    if detail is not None and detail in GEMINI_MEDIA_RESOLUTION:
        return GEMINI_MEDIA_RESOLUTION[detail]
    if width <= 384 and height <= 384:
        return GEMINI_TILE_TOKENS
    unit = max(1, math.floor(min(width, height) / 1.5))
    return GEMINI_TILE_TOKENS * math.ceil(width / unit) * math.ceil(height / unit)


def visual_tokens(
    family: str,
    width: int,
    height: int,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    detail: str | None = None,
    tokens_per_image: int | None = None,
) -> int:
    """Tokens the model sees for one ``width`` × ``height`` image.

    ``min_pixels``/``max_pixels`` override the Qwen processors' bounds (what vLLM's
    ``mm_processor_kwargs`` sets); other families ignore them. ``detail`` is OpenAI's
    ``low``/``high``/``auto``, Anthropic's ``high`` (Opus 4.7+ resolution) or Gemini 3's
    ``low``/``medium``/``high`` media resolution. ``tokens_per_image`` is the count of family
    ``fixed``. Raises ``ValueError`` for an unknown family, non-positive sizes, or an image the
    family's processor refuses (Qwen: aspect ratio above 200).
    """
    if isinstance(width, bool) or isinstance(height, bool) or width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if family in QWEN_GRIDS:
        return _qwen_tokens(family, width, height, min_pixels, max_pixels)
    if family == "openai":
        return _openai_tiles(width, height, detail)
    if family == "openai_patch":
        return _openai_patches(width, height)
    if family == "anthropic":
        return _anthropic(width, height, detail)
    if family == "gemini":
        return _gemini(width, height, detail)
    if family == "fixed":
        if tokens_per_image is None or tokens_per_image < 0:
            raise ValueError("family 'fixed' needs tokens_per_image >= 0")
        return tokens_per_image
    raise ValueError(f"unknown vision family {family!r}; known: {list(FAMILIES)}")


def max_visual_tokens(
    family: str,
    *,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    detail: str | None = None,
    tokens_per_image: int | None = None,
) -> int | None:
    """The most tokens any image can cost in ``family`` with these bounds, or ``None`` if unbounded.

    Used for images whose size is unknown (remote URLs that are not fetched).
    """
    if family in QWEN_GRIDS:
        grid = QWEN_GRIDS[family]
        hi = grid.max_pixels if max_pixels is None else max_pixels
        lo = grid.min_pixels if min_pixels is None else min_pixels
        f, ratio = grid.factor, grid.max_aspect_ratio
        # Shrinking floors both sides, so the result stays within hi pixels, unless the short side
        # is clamped up to one factor, possible only when hi < ratio·f²: then the long side is at
        # most sqrt(hi·ratio). Growing ceils both sides: at most (sqrt(lo·r)/f + 1)(sqrt(lo/r)/f + 1).
        bound = hi // (f * f)
        if hi < ratio * f * f:
            bound = max(bound, math.floor(math.sqrt(hi * ratio) / f))
        grown = (math.sqrt(lo * ratio) / f + 1) * (math.sqrt(lo / ratio) / f + 1)
        return max(bound, math.floor(grown))
    if family == "openai":
        return OPENAI_BASE_TOKENS if detail == "low" else OPENAI_BASE_TOKENS + OPENAI_TILE_TOKENS * 4 * 2
    if family == "openai_patch":
        return OPENAI_PATCH_BUDGET
    if family == "anthropic":
        return ANTHROPIC_LIMITS["high" if detail == "high" else "standard"][1]
    if family == "gemini":
        return GEMINI_MEDIA_RESOLUTION.get(detail or "")
    if family == "fixed":
        return tokens_per_image
    raise ValueError(f"unknown vision family {family!r}; known: {list(FAMILIES)}")
