"""Image requests routed by cache on an engine started with ``--mm-processor-kwargs``: a real ``litellm`` proxy with
litellm-kv (embedded index) in front of one real vLLM CPU replica of the tiny Qwen2.5-VL model (``.venv-engine-
vl``; without it these tests skip and say so, or fail in scripts/test.sh's run: tests/support/vl_engine.py), 6 MiB
KV cache, started with an engine-level ``max_pixels`` smaller than most images sent, so the engine's visual-token
counts are not the model default's.

vLLM merges engine-level processor kwargs only when it calls the HF processor, not into an image's hash
factors (docs/hashing.md, "Engine-level processor kwargs"): the identifier stays the part's uuid verbatim and
only the count changes. Two KV-routed groups serve the same replica:

* ``vl-mirror``, whose vision section sets the engine's ``max_pixels``: every probe (seven sizes, resent images,
  a second turn, a URL twin, a client's own ``max_pixels``) is routed by cache with the predicted cached
  tokens equal to the engine's ``cached_tokens`` and the routed visual tokens equal to its ``multimodal_tokens``;
* ``vl-plain``, whose vision section does not: the per-response check sees each image the engine shrank as a
  mismatch, and after ``IMAGE_MISMATCH_LIMIT`` of them the group routes image requests by load
  (``multimodal_mismatch``), as ``/litellm-kv/health`` says.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from litellm_kv.governance.vision import QWEN_GRIDS, visual_tokens
from litellm_kv.routing.group import IMAGE_MISMATCH_LIMIT
from tests.integration.test_image_routing import chat, delta, explain, inline, png, text, until_indexed
from tests.support.image_server import image_server
from tests.support.vl_engine import require_vl_engine
from tools.harness.engines import EngineReplica, reset_prefix_caches, start_vl_replica
from tools.harness.proxy import Proxy, start_proxy

pytestmark = [pytest.mark.engine, pytest.mark.proxy]

BLOCK = 32
#: The engine's own bound (448 x 448): 640x480, 896x672, 784x784 and 300x700 images shrink under it.
ENGINE_MAX_PIXELS = 200_704
#: The model's own min_pixels: a client's max_pixels alone is sent with it.
MIN_PIXELS = QWEN_GRIDS["qwen2_5_vl"].min_pixels
MIRROR = "vl-mirror"
PLAIN = "vl-plain"
SIZES = [(112, 84), (448, 448), (640, 480), (896, 672), (784, 784), (300, 700), (1001, 37)]
Probe = tuple[list[dict[str, Any]], dict[str, Any], list[tuple[int, int]]]


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    require_vl_engine()
    served: dict[str, bytes] = {}
    engine: EngineReplica | None = None
    proxy: Proxy | None = None
    with image_server(served.get) as base:
        try:
            engine = start_vl_replica(
                block_size=BLOCK, name="vl-engine-kwargs", kv_cache_bytes="6M",
                extra_args=["--mm-processor-kwargs", json.dumps({"max_pixels": ENGINE_MAX_PIXELS}),
                            "--trust-request-mm-kwargs"],
                env={"VLLM_SERVER_DEV_MODE": "1"})
            kv = {"tokenizer_path": str(engine.model_dir), "scrape_interval_s": 0.5, "discovery_interval_s": 1.0}
            fetch = {"allow_hosts": ["127.0.0.1"]}
            config = {
                "model_list": [
                    {"model_name": group, "litellm_params": {"model": "hosted_vllm/tiny", "api_base": engine.api_base,
                                                             "api_key": "none"},
                     "model_info": {"id": f"{group}-0"}}
                    for group in (MIRROR, PLAIN)
                ],
                "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"],
                                     "request_timeout": 120},
                "litellm_kv": {"mode": "embedded", "model_groups": {
                    MIRROR: {"routing": "kv", "kv": kv, "vision": {
                        "family": "qwen2_5_vl", "max_pixels": ENGINE_MAX_PIXELS, "fetch": fetch}},
                    PLAIN: {"routing": "kv", "kv": kv, "vision": {"family": "qwen2_5_vl", "fetch": fetch}},
                }},
            }
            proxy = start_proxy(config, name="litellm-engine-kwargs", env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
            proxy.wait_kv_exact(MIRROR, 90)
            proxy.wait_kv_exact(PLAIN, 90)
            yield {"proxy": proxy, "engine": engine, "base": base, "served": served}
        finally:
            if proxy is not None:
                proxy.stop()
            if engine is not None:
                engine.stop()


def metrics(proxy: Proxy, name: str, group: str) -> dict[str, float]:
    """``litellm_kv_<name>_total`` samples of ``group``, keyed by their outcome (fallbacks: why) label."""
    return proxy.metric_by(f"litellm_kv_{name}_total", "why" if name == "routing_fallbacks" else "outcome",
                           model_group=group)


def probes(base: str, served: dict[str, bytes]) -> list[Probe]:
    """(messages, extra body, sizes of the images in order): every size once and resent, two images and a
    second turn that resends them with a third, an image after long text, a URL and its inline twin, a
    client's own pixel bounds (sent twice), an image after a shared system prompt."""
    images = [png(*size, seed=500 + i) for i, size in enumerate(SIZES)]
    rnd = random.Random(5)
    words = ["describe", "the", "picture", "compare", "colour", "shape", "left", "right", "count"]

    def sentence(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n))

    out: list[Probe] = []
    for i, size in enumerate(SIZES):  # each size, then the same request again
        msgs = [{"role": "user", "content": [inline(images[i]), text(sentence(8))]}]
        out += [(msgs, {}, [size])] * 2
    first = {"role": "user", "content": [inline(images[2]), inline(images[3]), text(sentence(10))]}
    out.append(([first], {}, [SIZES[2], SIZES[3]]))
    out.append(([first, {"role": "assistant", "content": "two pictures"},
                 {"role": "user", "content": [text(sentence(6)), inline(images[5])]}], {},
                [SIZES[2], SIZES[3], SIZES[5]]))
    out.append(([{"role": "user", "content": [text(sentence(40)), inline(images[4])]}], {}, [SIZES[4]]))
    served["twin.png"] = twin = png(640, 480, seed=600)
    url = {"type": "image_url", "image_url": {"url": f"{base}/twin.png"}}
    out.append(([{"role": "user", "content": [url, text("the same bytes twice")]}], {}, [(640, 480)]))
    out.append(([{"role": "user", "content": [inline(twin), text("the same bytes twice")]}], {}, [(640, 480)]))
    # A client's bounds reach the engine and are hashed with the uuid; the engine's own are not (merged in,
    # max_pixels would come first and give another identifier). Both are given, in the order the vision count
    # sends them: /litellm-kv/route hashes a client's kwargs as written, so a max_pixels alone would be
    # explained under another identifier than the call's (docs/kv-routing.md, "Image requests").
    msgs = [{"role": "user", "content": [inline(images[3]), text(sentence(7))]}]
    out += [(msgs, {"mm_processor_kwargs": {"min_pixels": MIN_PIXELS, "max_pixels": 50_000}}, [SIZES[3]])] * 2
    out.append(([{"role": "system", "content": "You are a careful describer. " * 20},
                 {"role": "user", "content": [inline(images[5]), text(sentence(5))]}], {}, [SIZES[5]]))
    return out


def test_mirrored_engine_bounds_route_images_exactly(stack: dict[str, Any]) -> None:
    """Every probe through ``vl-mirror``: no fallback, the decision's predicted cached tokens == the engine's
    ``cached_tokens``, the routed visual tokens == the engine's ``multimodal_tokens``, which are the engine
    bound's count and, for the larger images, fewer than the model default's."""
    proxy: Proxy = stack["proxy"]
    reset_prefix_caches([stack["engine"]])
    checks = probes(stack["base"], stack["served"])
    fb0 = metrics(proxy, "routing_fallbacks", MIRROR)
    engine_total = default_total = image_hits = cached_total = prompt_total = 0
    for n, (messages, extra, sizes) in enumerate(checks):
        body = {"model": MIRROR, "messages": messages, **extra}
        routed = explain(proxy, body)
        assert routed["fallback_why"] == "" and routed["exact"], (n, routed)
        pred0, img0 = metrics(proxy, "prediction_checks", MIRROR), metrics(proxy, "image_token_checks", MIRROR)
        r = chat(proxy, MIRROR, messages, **extra)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        details = usage["prompt_tokens_details"]
        engine_count = int(details["multimodal_tokens"]["image"])
        cached = int(details["cached_tokens"] or 0)
        bound = extra.get("mm_processor_kwargs", {}).get("max_pixels", ENGINE_MAX_PIXELS)
        assert engine_count == sum(visual_tokens("qwen2_5_vl", w, h, max_pixels=bound) for w, h in sizes), n
        assert routed["visual_tokens"] == engine_count, (n, routed["visual_tokens"], engine_count)
        assert routed["predicted_hit_tokens"] == cached, (n, routed["predicted_hit_tokens"], usage)
        assert delta(metrics(proxy, "prediction_checks", MIRROR), pred0) == {"exact": 1.0}, (n, usage)
        assert delta(metrics(proxy, "image_token_checks", MIRROR), img0) == {"exact": 1.0}, (n, usage)
        engine_total += engine_count
        cached_total += cached
        prompt_total += int(usage["prompt_tokens"])
        default_total += sum(visual_tokens("qwen2_5_vl", w, h) for w, h in sizes)
        if cached and messages[0]["role"] == "user" and messages[0]["content"][0]["type"] == "image_url":
            image_hits += 1  # block 0 holds the image's key: the engine used the uuid as sent
        until_indexed(proxy, body, int(usage["prompt_tokens"]))
    fb = delta(metrics(proxy, "routing_fallbacks", MIRROR), fb0)
    print(f"\n[engine kwargs] {len(checks)} probes on an engine with max_pixels={ENGINE_MAX_PIXELS}: all exact; "
          f"{engine_total} visual tokens (model default: {default_total}); {cached_total} of {prompt_total} prompt "
          f"tokens cached; {image_hits} hits through image blocks; fallbacks {fb}")
    assert fb == {}, fb
    assert engine_total < default_total  # the engine's bound changed the counts
    assert image_hits >= 8  # resent images and the URL twin hit blocks keyed by their identifier


def test_unmirrored_engine_bounds_turn_image_routing_off(stack: dict[str, Any]) -> None:
    """``vl-plain`` counts images at the model default: an image under the engine's bound checks exact, each
    image the engine shrank is a mismatch, and after ``IMAGE_MISMATCH_LIMIT`` mismatches image requests go by
    load (``multimodal_mismatch``) and ``/litellm-kv/health`` says so; ``vl-mirror`` is unaffected."""
    proxy: Proxy = stack["proxy"]
    before = proxy.kv_health(PLAIN)["images"]

    def send(size: tuple[int, int], seed: int) -> tuple[dict[str, Any], dict[str, float], dict[str, float], int]:
        """The decision (explained first), the call's image-token checks and fallbacks, the engine's count."""
        messages = [{"role": "user", "content": [inline(png(*size, seed=seed)), text("what is this")]}]
        routed = explain(proxy, {"model": PLAIN, "messages": messages})
        img0, fb0 = metrics(proxy, "image_token_checks", PLAIN), metrics(proxy, "routing_fallbacks", PLAIN)
        r = chat(proxy, PLAIN, messages)
        assert r.status_code == 200, r.text
        engine_count = int(r.json()["usage"]["prompt_tokens_details"]["multimodal_tokens"]["image"])
        return (routed, delta(metrics(proxy, "image_token_checks", PLAIN), img0),
                delta(metrics(proxy, "routing_fallbacks", PLAIN), fb0), engine_count)

    routed, checked, fb, engine_count = send((112, 84), seed=700)  # under the engine's bound: the counts agree
    assert checked == {"exact": 1.0} and fb == {} and routed["visual_tokens"] == engine_count == 12
    shrunk = [(640, 480), (896, 672), (300, 700)]
    assert len(shrunk) == IMAGE_MISMATCH_LIMIT
    for k, size in enumerate(shrunk):
        routed, checked, fb, engine_count = send(size, seed=701 + k)
        assert routed["fallback_why"] == "" and fb == {}, (k, routed, fb)  # still routed by cache until the limit
        assert routed["visual_tokens"] == visual_tokens("qwen2_5_vl", *size)
        assert engine_count == visual_tokens("qwen2_5_vl", *size, max_pixels=ENGINE_MAX_PIXELS)
        assert engine_count < routed["visual_tokens"]
        assert checked == {"mismatch": 1.0}, (k, checked)
    after = proxy.kv_health(PLAIN)["images"]
    assert after != before and "routed by load" in after, after

    routed, checked, fb, _ = send((784, 784), seed=710)
    assert routed["fallback_why"] == "multimodal_mismatch" and not routed["exact"], routed
    assert checked == {}  # routed by load: no count to check
    print(f"\n[engine kwargs] unmirrored group: image routing off after {IMAGE_MISMATCH_LIMIT} mismatches; "
          f"fallbacks {fb}; health: {after}")
    assert fb == {"multimodal_mismatch": 1.0}, fb
    assert proxy.kv_health(MIRROR)["images"] == before  # the other group over the same engine keeps routing
