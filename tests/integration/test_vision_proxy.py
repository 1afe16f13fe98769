"""Visual-token limits and charging through a real ``litellm`` proxy process.

No vision model can run on this machine (the CPU vLLM build here cannot serve a Qwen-VL model in
test time), so the upstream is the local fake (``tests/support/fake_upstream.py``) standing in for
a vision engine: it records each request (``GET /_requests``, where the injected
``mm_processor_kwargs`` are checked), makes each image occupy prompt tokens like an engine, and one
instance reports vLLM 0.32's ``prompt_tokens_details.multimodal_tokens = {"image": n}``. Keys with
metadata are presented through ``general_settings.custom_auth`` (the database path cannot run
here); the spend log row is read from ``tests.support.spend_capture`` (the payload LiteLLM writes to
``LiteLLM_SpendLogs``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import struct
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from litellm_kv.governance.vision import visual_tokens
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.procs import ManagedProcess
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

IN_RATE, OUT_RATE, IMAGE_RATE = 1e-6, 2e-6, 5e-6
ENGINE_TOKENS_EACH = 777
GROUP_MAX_PIXELS = 28 * 28 * 1280  # the ceiling for unfetched remote images: 1280 tokens


def _fake(name: str, *extra: str) -> tuple[ManagedProcess, str]:
    return start_fake_upstream(name, *extra)


def _vision_key(alias: str, vision: Any, **extra: Any) -> dict[str, Any]:
    return {"key_alias": alias, "metadata": {"litellm_kv": {"vision": vision}}, **extra}


TEAM = {"team_id": "t-research", "team_alias": "research"}
KEYS: dict[str, dict[str, Any]] = {
    "sk-plain": {"key_alias": "plain", "metadata": {}},
    "sk-two": _vision_key("two-images", {"max_images_per_request": 2}),
    "sk-tok": _vision_key("tok-reject", {"max_visual_tokens_per_request": 500}),
    "sk-down": _vision_key("tok-down", {"max_visual_tokens_per_request": 500, "over_limit": "downscale"}),
    "sk-team-down": {"key_alias": "member", "metadata": {}, **TEAM,
                     "team_metadata": {"litellm_kv": {"vision": {"max_pixels_per_image": 250_000,
                                                                 "over_limit": "downscale"}}}},
    "sk-team-px": {"key_alias": "member2", "metadata": {}, **TEAM,
                   "team_metadata": {"litellm_kv": {"vision": {"max_pixels_per_image": 250_000}}}},
    "sk-day": _vision_key("daily", {"tokens_per_day": 1024}),
    "sk-bad": _vision_key("broken", {"max_images_per_request": "lots"}),
}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    plain, plain_url = _fake("vl-plain")  # reports no visual tokens; an image is one prompt token
    engine, engine_url = _fake("vl-engine", "--image-tokens-each", str(ENGINE_TOKENS_EACH), "--mm-tokens-format",
                               "dict", "--image-prompt-tokens", str(ENGINE_TOKENS_EACH))
    capture = Path(tempfile.mkdtemp(prefix="litellm-kv-vision-")) / "spend.jsonl"
    prices = {"input_cost_per_token": IN_RATE, "output_cost_per_token": OUT_RATE,
              "input_cost_per_image_token": IMAGE_RATE}
    config = {
        "model_list": [
            {"model_name": "qwen-vl", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                         "api_base": plain_url + "/v1", **prices}},
            {"model_name": "qwen-vl-engine", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                "api_base": engine_url + "/v1", **prices}},
            {"model_name": "gpt-vision", "litellm_params": {"model": "openai/fake-model", "api_key": "x",
                                                            "api_base": plain_url + "/v1", **prices}},
            {"model_name": "qwen-vl-lenient", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                                 "api_base": plain_url + "/v1", **prices}},
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler",
                                           "tests.support.spend_capture.capture"]},
        "litellm_kv": {"model_groups": {
            # The fake counts an image as one prompt token, so visual tokens are added to prompt_tokens.
            "qwen-vl": {"vision": {"family": "qwen2_5_vl", "prompt_includes_images": False,
                                   "max_pixels": GROUP_MAX_PIXELS, "max_image_bytes": 200_000,
                                   "max_images_per_request": 8}},
            "qwen-vl-engine": {"vision": {"family": "qwen2_5_vl"}},
            "gpt-vision": {"vision": {"family": "openai", "prompt_includes_images": False,
                                      "max_visual_tokens_per_request": 500, "over_limit": "downscale"}},
            "qwen-vl-lenient": {"vision": {"family": "qwen2_5_vl", "prompt_includes_images": False,
                                           "max_images_per_request": 1, "invalid_metadata": "ignore"}},
        }},
    }
    proxy = start_proxy(config, name="litellm-vision", keys=KEYS,
                        env={"LITELLM_KV_SPEND_CAPTURE": str(capture), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "plain": plain_url, "engine": engine_url, "capture": capture}
    finally:
        proxy.stop()
        plain.stop()
        engine.stop()


# -- helpers ---------------------------------------------------------------------------------------


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def data_url(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(proxy: Proxy, key: str, parts: list[dict[str, Any]], model: str = "qwen-vl", **body: Any) -> httpx.Response:
    content = [{"type": "text", "text": "describe this"}, *parts]
    payload = {"model": model, "messages": [{"role": "user", "content": content}], **body}
    return httpx.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(key), timeout=60)


def last_upstream(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/_requests", timeout=5).json()[-1]["body"])


def upstream_count(url: str) -> int:
    return len(httpx.get(url + "/_requests", timeout=5).json())


def spend_rows(capture: Path, after: int) -> list[dict[str, Any]]:
    for _ in range(40):  # the spend log is written just after the response
        rows = [json.loads(x) for x in capture.read_text().splitlines()] if capture.exists() else []
        if len(rows) > after:
            return rows[after:]
        time.sleep(0.25)
    return []


def n_rows(capture: Path) -> int:
    return len(capture.read_text().splitlines()) if capture.exists() else 0


def error_of(r: httpx.Response) -> str:
    return str(r.json()["error"]["message"])


TEXT_TOKENS = 3  # the fake's "<user> describe this"
COMPLETION = 3  # "answer from <name>"


# -- counting and pricing --------------------------------------------------------------------------


def test_visual_tokens_priced_in_usage_cost_header_and_spend_log(stack: dict[str, Any]) -> None:
    before = n_rows(stack["capture"])
    raw = png(896, 896)
    r = chat(stack["proxy"], "sk-plain", [{**image_part(data_url(raw)), "uuid": "client-chosen"}])
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens_details"]["image_tokens"] == 1024
    # image tokens are a part of prompt_tokens (LiteLLM prices prompt - image at the text rate)
    assert usage["prompt_tokens"] == TEXT_TOKENS + 1 + 1024
    expected = (TEXT_TOKENS + 1) * IN_RATE + 1024 * IMAGE_RATE + COMPLETION * OUT_RATE
    assert float(r.headers["x-litellm-response-cost"]) == pytest.approx(expected, rel=1e-9)
    assert r.headers["x-litellm-kv-visual-tokens"] == "1024"
    sent = last_upstream(stack["plain"])
    assert "mm_processor_kwargs" not in sent  # nothing over a limit: untouched
    # The engine gets the proxy's identifier of the image's bytes as the part's uuid, never the client's.
    ident = "sha256:" + hashlib.sha256(raw).hexdigest()
    assert sent["messages"][0]["content"][1]["uuid"] == ident
    row = spend_rows(stack["capture"], before)[-1]
    assert row["response_cost"] == pytest.approx(expected, rel=1e-9)
    breakdown = row["spend_logs_metadata"]["litellm_kv"]["vision"]
    assert breakdown["visual_tokens"] == 1024 and breakdown["measured_by"] == "formula"
    assert breakdown["images"] == [{"where": "messages[0].content[1]", "tokens": 1024, "width": 896,
                                    "height": 896, "how": "header", "identifier": ident}]


def test_streaming_is_charged_too(stack: dict[str, Any]) -> None:
    before = n_rows(stack["capture"])
    body = {"model": "qwen-vl", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe this"}, image_part(data_url(png(640, 480)))]}]}
    with httpx.stream("POST", stack["proxy"].url + "/v1/chat/completions", json=body, timeout=60,
                      headers=stack["proxy"].headers("sk-plain")) as s:
        assert s.status_code == 200
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    tokens = visual_tokens("qwen2_5_vl", 640, 480)
    assert last_upstream(stack["plain"])["stream_options"] == {"include_usage": True}
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    assert usage["prompt_tokens_details"]["image_tokens"] == tokens
    row = spend_rows(stack["capture"], before)[-1]
    expected = (TEXT_TOKENS + 1) * IN_RATE + tokens * IMAGE_RATE + COMPLETION * OUT_RATE
    assert row["response_cost"] == pytest.approx(expected, rel=1e-9)
    assert row["spend_logs_metadata"]["litellm_kv"]["vision"]["visual_tokens"] == tokens


def test_engine_count_is_preferred(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-plain", [image_part(data_url(png(896, 896)))] * 2, model="qwen-vl-engine")
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    engine = 2 * ENGINE_TOKENS_EACH
    assert usage["prompt_tokens_details"]["image_tokens"] == engine  # not our 2 x 1024
    assert usage["prompt_tokens"] == TEXT_TOKENS + engine
    expected = TEXT_TOKENS * IN_RATE + engine * IMAGE_RATE + COMPLETION * OUT_RATE
    assert float(r.headers["x-litellm-response-cost"]) == pytest.approx(expected, rel=1e-9)


def test_remote_images_are_not_fetched_and_count_at_the_group_ceiling(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-plain", [image_part("http://127.0.0.1:9/never-fetched.png")])
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["image_tokens"] == 1280
    # ...and the engine is told to keep to that ceiling, so the count is a true bound.
    assert last_upstream(stack["plain"])["mm_processor_kwargs"] == {"max_pixels": GROUP_MAX_PIXELS}


# -- limits: reject, downscale, per key and team -------------------------------------------------


def test_images_per_request_limit_names_key(stack: dict[str, Any]) -> None:
    sent = upstream_count(stack["plain"])
    r = chat(stack["proxy"], "sk-two", [image_part(data_url(png(32, 32)))] * 3)
    assert r.status_code == 400
    msg = error_of(r)
    assert "3 images" in msg and "limit is 2 images per request" in msg and "key 'two-images'" in msg
    assert upstream_count(stack["plain"]) == sent  # never reached the upstream


def test_group_default_images_limit(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-plain", [image_part(data_url(png(8, 8)))] * 9)
    assert r.status_code == 400
    assert "config model_groups.qwen-vl.vision" in error_of(r)


def test_visual_tokens_limit_rejects(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-tok", [image_part(data_url(png(896, 896)))])
    assert r.status_code == 400
    msg = error_of(r)
    assert "needs 1024 visual tokens" in msg and "500 visual tokens per request" in msg and "key 'tok-reject'" in msg


def test_visual_tokens_limit_downscales_on_vllm(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-down", [image_part(data_url(png(896, 896)))])
    assert r.status_code == 200, r.text
    max_pixels = last_upstream(stack["plain"])["mm_processor_kwargs"]["max_pixels"]
    tokens = visual_tokens("qwen2_5_vl", 896, 896, max_pixels=max_pixels)
    assert 450 <= tokens <= 500  # the largest size that fits, not just any
    assert visual_tokens("qwen2_5_vl", 896, 896, max_pixels=max_pixels + 28 * 28 * 4) > 500
    assert r.json()["usage"]["prompt_tokens_details"]["image_tokens"] == tokens
    assert r.headers["x-litellm-kv-vision-downscaled"] == (
        f"max_pixels={max_pixels}; by=max_visual_tokens_per_request (key 'tok-down')"
    )


def test_team_pixel_limit_downscales(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-team-down", [image_part(data_url(png(1400, 1000)))])
    assert r.status_code == 200, r.text
    assert last_upstream(stack["plain"])["mm_processor_kwargs"] == {"max_pixels": 250_000}
    tokens = visual_tokens("qwen2_5_vl", 1400, 1000, max_pixels=250_000)
    assert r.json()["usage"]["prompt_tokens_details"]["image_tokens"] == tokens
    assert "team 'research'" in r.headers["x-litellm-kv-vision-downscaled"]


def test_team_pixel_limit_rejects(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-team-px", [image_part(data_url(png(1400, 1000)))])
    assert r.status_code == 400
    msg = error_of(r)
    assert "1400x1000 = 1400000 pixels" in msg and "250000 pixels per image" in msg and "team 'research'" in msg


def test_non_vllm_group_cannot_downscale_and_gets_no_vllm_fields(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-plain", [image_part(data_url(png(2048, 4096)))], model="gpt-vision")
    assert r.status_code == 400
    assert "needs 1105 visual tokens" in error_of(r) and "downscaling needs a vLLM deployment" in error_of(r)
    ok = chat(stack["proxy"], "sk-plain", [image_part(data_url(png(1024, 1024)) )], model="gpt-vision",
              extra_body={})
    assert ok.status_code == 400  # 765 > 500 as well
    small = chat(stack["proxy"], "sk-plain", [{"type": "image_url", "image_url": {
        "url": data_url(png(1024, 1024)), "detail": "low"}}], model="gpt-vision")
    assert small.status_code == 200, small.text
    assert small.json()["usage"]["prompt_tokens_details"]["image_tokens"] == 85
    assert "mm_processor_kwargs" not in last_upstream(stack["plain"])


def test_period_budget_spent_is_429_with_reset(stack: dict[str, Any]) -> None:
    first = chat(stack["proxy"], "sk-day", [image_part(data_url(png(896, 896)))])
    assert first.status_code == 200, first.text
    r = chat(stack["proxy"], "sk-day", [image_part(data_url(png(28, 28)))])
    assert r.status_code == 429
    msg = error_of(r)
    assert "has used 1024 of 1024 visual tokens this day" in msg and "key 'daily'" in msg and "resets at" in msg
    assert int(r.headers["retry-after"]) > 0
    assert r.headers["x-litellm-kv-vision-reset"].endswith("T00:00:00Z")
    # Text-only requests are not affected by visual-token budgets.
    text = httpx.post(stack["proxy"].url + "/v1/chat/completions", headers=stack["proxy"].headers("sk-day"),
                      json={"model": "qwen-vl", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert text.status_code == 200


def _invalid_metadata_counts(proxy: Proxy) -> dict[str, float]:
    return {"reject": 0.0, "ignore": 0.0, **proxy.metric_by("litellm_kv_vision_invalid_metadata_total", "action")}


def test_malformed_metadata_names_the_field(stack: dict[str, Any]) -> None:
    before = _invalid_metadata_counts(stack["proxy"])
    r = chat(stack["proxy"], "sk-bad", [image_part(data_url(png(8, 8)))])
    assert r.status_code == 400
    assert "key 'broken': metadata.litellm_kv.vision.max_images_per_request must be an integer" in error_of(r)
    assert _invalid_metadata_counts(stack["proxy"]) == {**before, "reject": before["reject"] + 1}


def test_ignored_malformed_metadata_leaves_the_config_limits(stack: dict[str, Any]) -> None:
    """``invalid_metadata: ignore``: the key's broken section is dropped (and counted), the group's own limit holds."""
    before = _invalid_metadata_counts(stack["proxy"])
    one = chat(stack["proxy"], "sk-bad", [image_part(data_url(png(8, 8)))], model="qwen-vl-lenient")
    assert one.status_code == 200, one.text
    two = chat(stack["proxy"], "sk-bad", [image_part(data_url(png(8, 8)))] * 2, model="qwen-vl-lenient")
    assert two.status_code == 400
    assert "limit is 1 images per request" in error_of(two) and "config model_groups.qwen-vl-lenient" in error_of(two)
    assert _invalid_metadata_counts(stack["proxy"]) == {**before, "ignore": before["ignore"] + 2}


# -- bad input: one documented error per class -----------------------------------------------------


def _bomb() -> bytes:
    raw = bytearray(png(1, 1))
    struct.pack_into(">II", raw, 16, 100_000, 100_000)
    struct.pack_into(">I", raw, 29, zlib.crc32(bytes(raw[12:29])))
    return bytes(raw)


def _tiff() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "TIFF")
    return buf.getvalue()


BAD = {
    "invalid_base64": ("data:image/png;base64,%%%not-base64%%%", "not valid base64"),
    "truncated": (data_url(png(300, 300)[:60]), "truncated"),
    "unsupported_format": (data_url(_tiff(), "image/tiff"), "unsupported image format 'tiff'"),
    "too_many_pixels": (data_url(_bomb()), "100000x100000"),
    "too_large": (data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 300_000), "exceeds the cap of 200000 bytes"),
    "invalid_url": ("file:///etc/passwd", "data: URL or an http(s) URL"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_images_are_clear_400s(stack: dict[str, Any], kind: str) -> None:
    url, words = BAD[kind]
    r = chat(stack["proxy"], "sk-plain", [image_part(url)])
    assert r.status_code == 400, r.text
    msg = error_of(r)
    assert words in msg and "messages[0].content[1]" in msg


def test_video_is_rejected(stack: dict[str, Any]) -> None:
    r = chat(stack["proxy"], "sk-plain", [{"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}])
    assert r.status_code == 400
    assert "video input is not accepted" in error_of(r)


def _image_b64() -> str:
    return base64.b64encode(png(896, 896)).decode()


#: The same image through each endpoint other than /v1/chat/completions, in that endpoint's own shape.
OTHER_ENDPOINTS = {
    "/v1/messages": {"max_tokens": 20, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe this"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "{b64}"}}]}]},
    "/v1/responses": {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "describe this"},
        {"type": "input_image", "image_url": "data:image/png;base64,{b64}"}]}]},
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path", sorted(OTHER_ENDPOINTS))
def test_visual_token_limits_refuse_endpoints_they_do_not_charge(stack: dict[str, Any], path: str,
                                                                 stream: bool) -> None:
    """The limit `vision.tokens_per_day` (and every vision limit): images on /v1/messages and /v1/responses
    are found, but the visual tokens those calls use are not charged from their usage shapes, so a group
    with a vision section refuses both endpoints (400 `vision.endpoint`), streamed or not, before anything
    reaches the engine."""
    body = json.loads(json.dumps(OTHER_ENDPOINTS[path]).replace("{b64}", _image_b64()))
    sent = upstream_count(stack["plain"])
    r = httpx.post(stack["proxy"].url + path, headers=stack["proxy"].headers("sk-day"), timeout=60,
                   json={"model": "qwen-vl", "stream": stream, **body})
    assert r.status_code == 400, r.text
    assert "visual-token limits" in r.text and "/v1/chat/completions only" in r.text and path in r.text
    assert "vision.endpoint" in r.text
    assert upstream_count(stack["plain"]) == sent
