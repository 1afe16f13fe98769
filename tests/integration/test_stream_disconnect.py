"""A streamed call the client leaves part-way, through a real ``litellm`` proxy process and a real
redis-server: what the engine read and generated until then is charged to the key's budgets. Left
uncharged, a client could read each answer and go away just before the stream's usage chunk, and its
reasoning and images would cost its budgets nothing (the hold taken for the call would be given back).

The upstream is the local fake (``tests/support/fake_upstream.py``): it streams its reasoning and answer a
word per chunk, slowly enough for the client to go away between them, and records whether its stream ran to
the end or was cut (a vLLM engine aborts the request when the proxy closes the connection; the fake stands in
because a real engine's reasoning cannot be timed against the client's disconnect on this machine).
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
from litellm.proxy._types import UserAPIKeyAuth
from PIL import Image

from litellm_kv.governance.budgets import Period
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import Proxy, start_proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.proxy, pytest.mark.redis]

REASONING_WORDS = 40
IMAGE_TOKENS = 64  # a 224 x 224 image for qwen2_5_vl: (224 / 28) ** 2
DAY_LIMIT = 10_000
KEYS = {
    "sk-leave-thinking": {"key_alias": "leave-thinking",
                          "metadata": {"litellm_kv": {"reasoning": {"tokens_per_day": DAY_LIMIT}}}},
    "sk-leave-answer": {"key_alias": "leave-answer",
                        "metadata": {"litellm_kv": {"reasoning": {"tokens_per_day": DAY_LIMIT}}}},
    "sk-leave-image": {"key_alias": "leave-image",
                       "metadata": {"litellm_kv": {"vision": {"tokens_per_day": DAY_LIMIT}}}},
}


def _usage_key(api_key: str, meter: str) -> str:
    token = UserAPIKeyAuth(api_key=api_key, token=f"hashed-{api_key}").token
    day = Period.DAY.window_id(datetime.now(timezone.utc))
    return f"litellm_kv:budget:{{key:{token}}}:{meter}:day:{day}"


def _png_data_url(side: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (20, 120, 200)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    redis_server = RedisServer(name="redis-stream-disconnect")
    upstream, upstream_url = start_fake_upstream(
        "slow-stream", "--reasoning-words", str(REASONING_WORDS), "--report-reasoning-tokens",
        "--count-reasoning-in-completion", "--chunk-delay-ms", "40",
    )
    config = {
        "model_list": [
            {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                      "api_base": upstream_url + "/v1"}},
            {"model_name": "qwen-vl", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                         "api_base": upstream_url + "/v1"}},
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"redis_url": redis_server.url, "model_groups": {
            "qwen": {"reasoning": {"style": "vllm"}},
            "qwen-vl": {"vision": {"family": "qwen2_5_vl", "prompt_includes_images": False}},
        }},
    }
    proxy: Proxy | None = None
    try:
        proxy = start_proxy(config, name="litellm-stream-disconnect", keys=KEYS,
                            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        yield {"proxy": proxy, "upstream": upstream_url, "redis": redis_server}
    finally:
        if proxy is not None:
            proxy.stop()
        upstream.stop()
        redis_server.stop()


def _leave_after(proxy: Proxy, key: str, words: int, model: str = "qwen", content: Any = "think") -> int:
    """Stream a chat and close the connection once ``words`` deltas (reasoning or answer) have arrived."""
    seen = 0
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": content}]}
    with httpx.Client(timeout=60) as client, client.stream(
        "POST", proxy.url + "/v1/chat/completions", json=body, headers=proxy.headers(key)
    ) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if '"reasoning_content"' in line or '"content"' in line:
                seen += 1
                if seen >= words:
                    break
    return seen


def _settled(r: Any, key: str, timeout_s: float = 15.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if r.hlen(key + ":holds") == 0:
            return int(r.get(key) or 0)
        time.sleep(0.25)
    raise AssertionError(f"holds of {key} were never settled: {r.hgetall(key + ':holds')}")


def _last_stream(upstream: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The upstream's record of its last request once its stream has ended ("done", or "cut" when the proxy went
    away part-way: the fake notices at its next chunk)."""
    deadline = time.monotonic() + timeout_s
    while True:
        recorded: dict[str, Any] = httpx.get(upstream + "/_requests", timeout=5).json()[-1]
        if recorded.get("stream") != "started" or time.monotonic() > deadline:
            return recorded
        time.sleep(0.1)


@pytest.mark.parametrize("words", [10, REASONING_WORDS + 2], ids=["mid-reasoning", "after-the-answer-began"])
def test_reasoning_streamed_before_the_client_left_is_charged(stack: dict[str, Any], words: int) -> None:
    """The limit `reasoning.tokens_per_day`: a client that reads part of a stream (its reasoning, or the start
    of the answer) and closes the connection is charged the reasoning streamed until then, counted by the
    proxy (the usage chunk never came)."""
    proxy, r = stack["proxy"], stack["redis"].client()
    api_key = "sk-leave-thinking" if words < REASONING_WORDS else "sk-leave-answer"
    seen = _leave_after(proxy, api_key, words)
    used = _settled(r, _usage_key(api_key, "reasoning_tokens"))
    assert _last_stream(stack["upstream"]).get("stream") == "cut"  # the engine's stream never reached its usage
    reasoning_seen = min(seen, REASONING_WORDS)
    assert used >= reasoning_seen, f"{reasoning_seen} reasoning deltas streamed, {used} reasoning tokens charged"


def test_images_of_a_stream_the_client_left_are_charged(stack: dict[str, Any]) -> None:
    """The limit `vision.tokens_per_day`: the engine read the image before the first delta, so a stream the
    client leaves after three deltas is charged the image's visual tokens."""
    proxy, r = stack["proxy"], stack["redis"].client()
    content = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": _png_data_url(224)}}]
    _leave_after(proxy, "sk-leave-image", 3, model="qwen-vl", content=content)
    used = _settled(r, _usage_key("sk-leave-image", "visual_tokens"))
    assert _last_stream(stack["upstream"]).get("stream") == "cut"
    assert used == IMAGE_TOKENS, f"{used} visual tokens charged for one 224 x 224 image"
