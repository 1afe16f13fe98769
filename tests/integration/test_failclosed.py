"""The callback with the governance handlers, called as LiteLLM 1.110 calls it: failures where a limit is at
stake refuse the request.

The proxy-level versions of these cases are in ``tests/integration/test_adversarial_governance.py``.
"""

from __future__ import annotations

import pytest

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import MemoryPeriodBudgets
from litellm_kv.governance.images import ImageBounds, ImageError, ImagePart
from litellm_kv.integration.vision_hooks import VisionHandler


async def test_visual_token_limit_refuses_an_image_url_httpx_cannot_fetch() -> None:
    """httpx raises InvalidURL (not an HTTPError) for a NUL byte: the image is a 400, not a skipped count."""
    groups = {"g": {"vision": {"family": "qwen2_5_vl", "fetch": {"allow_hosts": ["127.0.0.1"]}}}}
    h = VisionHandler(parse_section(Settings, {"model_groups": groups}, "litellm_kv"), MemoryPeriodBudgets())
    part = ImagePart("messages[0].content[1]", "http://127.0.0.1:9/x.png#\x00", inline=False)
    with pytest.raises(ImageError) as exc:
        await h._fetch_size(part, h.group_settings("g"), ImageBounds(max_bytes=2**20, max_pixels=2**24))
    assert exc.value.limit_name == "image.invalid_url"
