"""A hostile client's images against the visual-token limits, through a real ``litellm`` proxy process.

Each case is something a client can send that the engine decodes bigger than it was counted, and
names the limit it protects. No vision model can run on this machine, so the upstream is the local
fake (``tests/support/fake_upstream.py``) standing in for vLLM: it records the body it receives
(``GET /_requests``), which is what these tests read back to see what the engine would be told. What
vLLM itself does with those bodies is checked without a proxy: Pillow sizes in
``tests/governance/test_images_pillow.py``, vLLM's part parser in
``tests/governance/test_images_engine_parts.py``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from litellm_kv.governance.vision import visual_tokens
from tests.support.fake_upstream import start_fake_upstream
from tests.support.image_server import image_server
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

CAP = 1000  # sk-cap's max_visual_tokens_per_request
KEYS: dict[str, dict[str, Any]] = {
    "sk-plain": {"key_alias": "plain", "metadata": {}},
    "sk-cap": {"key_alias": "capped", "metadata": {"litellm_kv": {"vision": {"max_visual_tokens_per_request": CAP}}}},
}


#: Fetches per path of the switching image server.
_SEEN: dict[str, int] = {}


def _switching(path: str) -> bytes:
    """The first fetch of a path gets a small PNG, every later one a large one (what a hostile client's
    server would do to the proxy's fetch and then the engine's)."""
    n = _SEEN[path] = _SEEN.get(path, 0) + 1
    return png(28, 28) if n == 1 else png(2000, 2000)


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    upstream, url = start_fake_upstream("vl-adversarial")
    config = {
        "model_list": [{"model_name": "qwen-vl", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                    "api_base": url + "/v1"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {"qwen-vl": {"vision": {"family": "qwen2_5_vl",
                                                               "fetch": {"allow_hosts": ["127.0.0.1"]}}}}},
    }
    try:
        with image_server(_switching) as images:
            proxy = start_proxy(config, name="litellm-adversarial-media", keys=KEYS,
                                env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
            try:
                yield {"proxy": proxy, "upstream": url, "images": images}
            finally:
                proxy.stop()
    finally:
        upstream.stop()


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def data_url(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


def post(proxy: Proxy, key: str, messages: list[dict[str, Any]], **body: Any) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/chat/completions", headers=proxy.headers(key), timeout=60,
                      json={"model": "qwen-vl", "messages": messages, **body})


def user_image(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "describe"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def upstream_bodies(url: str) -> list[dict[str, Any]]:
    return [r["body"] for r in httpx.get(url + "/_requests", timeout=5).json()]


def error_of(r: httpx.Response) -> str:
    return str(r.json()["error"]["message"])


# -- sizes as the decoder sees them ----------------------------------------------------------------


def gif_with_small_screen(frame: tuple[int, int], screen: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("P", frame).save(buf, "GIF")
    raw = bytearray(buf.getvalue())
    struct.pack_into("<HH", raw, 6, *screen)  # logical screen; the frame keeps its size
    return bytes(raw)


def test_max_visual_tokens_gif_logical_screen_does_not_hide_the_frame(stack: dict[str, Any]) -> None:
    """Pillow (vLLM's decoder) opens a GIF whose screen says 1x1 at its 4000x4000 frame: 16,384 tokens."""
    url = data_url(gif_with_small_screen((4000, 4000), (1, 1)), "image/gif")
    r = post(stack["proxy"], "sk-cap", user_image(url))
    assert r.status_code == 400, r.text
    assert "needs 16384 visual tokens" in error_of(r)
    ok = post(stack["proxy"], "sk-plain", user_image(url))
    assert ok.status_code == 200 and ok.headers["x-litellm-kv-visual-tokens"] == "16384"


# -- every role and part form the engine reads -------------------------------------------------------


@pytest.mark.parametrize("role", ["system", "assistant", "tool"])
def test_max_visual_tokens_untyped_image_parts_in_any_role_are_counted(stack: dict[str, Any], role: str) -> None:
    """LiteLLM checks part types on user messages only; vLLM reads ``{"image_url": ...}`` in every role."""
    hidden: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": "see"},
                                                       {"image_url": {"url": data_url(png(896, 896))}}]}
    if role == "tool":
        hidden["tool_call_id"] = "call-1"
    messages = [hidden, {"role": "user", "content": "what was in it?"}]
    if role == "tool":
        messages.insert(0, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]})
    r = post(stack["proxy"], "sk-cap", messages)
    assert r.status_code == 400, r.text
    assert "needs 1024 visual tokens" in error_of(r)
    ok = post(stack["proxy"], "sk-plain", messages)
    assert ok.status_code == 200, ok.text
    assert ok.headers["x-litellm-kv-visual-tokens"] == "1024"


def test_max_visual_tokens_text_part_with_uuid_and_image_is_counted(stack: dict[str, Any]) -> None:
    """A ``text`` part with a ``uuid`` passes LiteLLM's check; vLLM parses its ``image_url``."""
    part = {"type": "text", "text": "hi", "uuid": "img-1", "image_url": {"url": data_url(png(896, 896))}}
    r = post(stack["proxy"], "sk-cap", [{"role": "user", "content": [part]}])
    assert r.status_code == 400, r.text
    assert "needs 1024 visual tokens" in error_of(r)


def test_max_visual_tokens_a_fetched_image_reaches_the_engine_as_the_bytes_that_were_counted(
    stack: dict[str, Any],
) -> None:
    """The server answers the proxy's fetch with 28x28 (4 tokens, under the cap) and any later fetch with
    2000x2000 (over it): the engine is sent the 28x28 bytes, under their identifier, not the URL."""
    r = post(stack["proxy"], "sk-cap", user_image(stack["images"] + "/switch.png"))
    assert r.status_code == 200, r.text
    assert r.headers["x-litellm-kv-visual-tokens"] == "4"
    part = upstream_bodies(stack["upstream"])[-1]["messages"][0]["content"][1]
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    raw = base64.b64decode(url.split(",", 1)[1])
    assert raw == png(28, 28) and part["uuid"] == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert _SEEN["switch.png"] == 1  # only the proxy fetched it


def test_max_visual_tokens_a_clients_uuid_never_reaches_the_engine(stack: dict[str, Any]) -> None:
    raw = png(56, 56)
    part = {"type": "image_url", "image_url": {"url": data_url(raw)}, "uuid": "someone-elses-image"}
    r = post(stack["proxy"], "sk-plain", [{"role": "user", "content": [part]}])
    assert r.status_code == 200, r.text
    sent = upstream_bodies(stack["upstream"])[-1]["messages"][0]["content"][0]
    assert sent["uuid"] == "sha256:" + hashlib.sha256(raw).hexdigest()


# -- processor bounds from the client ------------------------------------------------------------


def test_max_visual_tokens_extra_body_min_pixels_is_counted_and_sent_at_top_level(stack: dict[str, Any]) -> None:
    """``extra_body.mm_processor_kwargs`` reaches vLLM: a 28x28 image (4 tokens) grown to ~15K tokens."""
    grown = visual_tokens("qwen2_5_vl", 28, 28, min_pixels=12_000_000)
    assert visual_tokens("qwen2_5_vl", 28, 28) == 4 and grown > 15_000
    r = post(stack["proxy"], "sk-plain", user_image(data_url(png(28, 28))),
             extra_body={"mm_processor_kwargs": {"min_pixels": 12_000_000}})
    assert r.status_code == 200, r.text
    assert r.headers["x-litellm-kv-visual-tokens"] == str(grown)
    assert r.json()["usage"]["prompt_tokens_details"]["image_tokens"] == grown
    body = upstream_bodies(stack["upstream"])[-1]
    # One copy, at top level, holding the bounds that were counted.
    assert body["mm_processor_kwargs"] == {"min_pixels": 12_000_000, "max_pixels": 28 * 28 * 16384}
    assert "mm_processor_kwargs" not in (body.get("extra_body") or {})


def test_max_visual_tokens_extra_body_min_pixels_cannot_pass_the_limit(stack: dict[str, Any]) -> None:
    sent = len(upstream_bodies(stack["upstream"]))
    small = post(stack["proxy"], "sk-cap", user_image(data_url(png(28, 28))))
    assert small.status_code == 200, small.text
    assert small.headers["x-litellm-kv-visual-tokens"] == "4"
    r = post(stack["proxy"], "sk-cap", user_image(data_url(png(28, 28))),
             extra_body={"mm_processor_kwargs": {"min_pixels": 12_000_000}})
    assert r.status_code == 400, r.text
    assert f"{CAP} visual tokens per request" in error_of(r) and "key 'capped'" in error_of(r)
    assert len(upstream_bodies(stack["upstream"])) == sent + 1  # only the small one reached the engine


@pytest.mark.parametrize("place", ["top", "extra_body"])
def test_max_visual_tokens_uncounted_processor_kwargs_are_refused(stack: dict[str, Any], place: str) -> None:
    kwargs = {"size": {"shortest_edge": 12_000_000, "longest_edge": 16_777_216}}
    extra = {"mm_processor_kwargs": kwargs} if place == "top" else {"extra_body": {"mm_processor_kwargs": kwargs}}
    r = post(stack["proxy"], "sk-plain", user_image(data_url(png(28, 28))), **extra)
    assert r.status_code == 400, r.text
    assert "mm_processor_kwargs.size is not accepted" in error_of(r)
