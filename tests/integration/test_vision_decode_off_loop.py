"""Large inline images are measured off the event loop: the proxy keeps serving while one is decoded.

Protects every request's latency against one client's 20 MB image; the image is still counted against
the visual-token limits exactly as before. Runs the vision handler in-process (no proxy needed: the
event loop is this test's own).
"""

from __future__ import annotations

import asyncio
import base64
import time

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.images import ImagePart, measure
from litellm_kv.governance.vision import visual_tokens
from litellm_kv.integration.hooks import Caller, ProxyRequest
from litellm_kv.integration.vision_hooks import HEADER_TOKENS, VisionHandler
from tests.governance.test_images_base64 import bmp_near_the_cap


async def test_max_image_bytes_large_image_is_decoded_off_the_event_loop() -> None:
    """The proxy's other requests keep being served while a large inline image is measured."""
    big_bmp = bmp_near_the_cap()
    url = "data:image/bmp;base64," + base64.encodebytes(big_bmp).decode()
    started = time.perf_counter()
    measure(ImagePart("m", url, True))
    on_loop = time.perf_counter() - started  # what one measurement blocks a thread for

    settings = parse_section(Settings, {"model_groups": {"qwen-vl": {"vision": {"family": "qwen2_5_vl"}}}},
                             "litellm_kv")
    handler = VisionHandler(settings)
    req = ProxyRequest(
        data={"model": "qwen-vl", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}]},
        caller=Caller(key_alias="k"), model_group="qwen-vl", call_type="acompletion", settings=settings,
        group=settings.group("qwen-vl"), record_key="call-1",
    )
    gaps: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.01)
    await handler.pre_call(req)
    done.set()
    await beat
    assert req.response_headers[HEADER_TOKENS] == str(visual_tokens("qwen2_5_vl", 2580, 2700))
    assert max(gaps) < on_loop / 2, f"event loop stalled {max(gaps):.3f} s; one measurement takes {on_loop:.3f} s"
