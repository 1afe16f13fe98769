"""Image requests routed by cache, end to end: a real ``litellm`` proxy with litellm-kv (embedded index) in front of
three real vLLM CPU replicas of the tiny Qwen2.5-VL model (``.venv-engine-vl``; without it these tests skip and say
so, or fail in scripts/test.sh's run: tests/support/vl_engine.py), each with a 6 MiB KV cache (192 blocks of 32
tokens).

The vision count (``model_groups.<g>.vision``) gives every image its identifier (a digest of its bytes, sent
to the engine as the part's ``uuid``) and its visual tokens; routing expands each placeholder to that count
and hashes the blocks with the engine's extra keys. Checked here, per request, against what the engines
report: the predicted cached tokens equal ``cached_tokens`` and the visual tokens equal
``multimodal_tokens``, over a probe set that mixes text-only prompts, one and several images, the same image
at another position and on a later turn, inline and by URL, sizes and ``max_pixels``, with enough traffic to
evict. Then image conversations are replayed through the KV group and through LiteLLM's ``simple-shuffle``
over the same replicas, and the counts used for routing, for the limits and for the charge are compared.
"""

from __future__ import annotations

import base64
import io
import json
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.support.image_server import image_server
from tests.support.vl_engine import require_vl_engine
from tools.harness.engines import EngineReplica, reset_prefix_caches, start_vl_replicas
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy

pytestmark = [pytest.mark.engine, pytest.mark.proxy]

BLOCK = 32
# Three replicas: with two, simple-shuffle lands a conversation's next turn on its holder half the time and its
# cached ratio varies too much over 36 requests for a fixed bar (one CI run drew 0.48 against the usual ~0.38).
REPLICAS = 3
KV_CACHE = "6M"
BLOCKS_PER_REPLICA = 192
KV = "vl-kv"
SHUFFLE = "vl-shuffle"
HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}
KEYS = {"sk-vision": {"key_alias": "vision-user", "metadata": {"litellm_kv": {"vision": {
    "max_visual_tokens_per_request": 4000, "tokens_per_day": 1_000_000}}}}}


def png(w: int, h: int, seed: int) -> bytes:
    """A noisy image (so PNG bytes differ per seed and compress little)."""
    rnd = random.Random(seed)
    img = Image.new("RGB", (w, h), (rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
    for _ in range(30):
        x, y = rnd.randrange(w), rnd.randrange(h)
        img.putpixel((x, y), (rnd.randrange(256), rnd.randrange(256), rnd.randrange(256)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def inline(raw: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(raw).decode()}}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


@pytest.fixture(scope="module")
def files() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A local HTTP server for image URLs (``/<name>.png``); the proxy may fetch from 127.0.0.1."""
    served: dict[str, bytes] = {}

    with image_server(served.get) as base:
        yield base, served


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    require_vl_engine()
    engines: list[EngineReplica] = []
    proxy: Proxy | None = None
    try:
        engines = start_vl_replicas(REPLICAS, name_prefix="vl-route-", block_size=BLOCK, kv_cache_bytes=KV_CACHE,
                                    extra_args=["--trust-request-mm-kwargs"], env={"VLLM_SERVER_DEV_MODE": "1"})
        model_dir = str(engines[0].model_dir)
        capture = Path(tempfile.mkdtemp(prefix="litellm-kv-images-")) / "spend.jsonl"
        vision = {"family": "qwen2_5_vl", "fetch": {"allow_hosts": ["127.0.0.1"]}}
        model_list = [
            {"model_name": group, "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base,
                                                     "api_key": "none"},
             "model_info": {"id": f"{group}-{i}"}}
            for group in (KV, SHUFFLE) for i, r in enumerate(engines)
        ]
        config = {
            "model_list": model_list,
            "router_settings": {"routing_strategy": "simple-shuffle"},
            "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler",
                                               "tests.support.spend_capture.capture"], "request_timeout": 120},
            "litellm_kv": {"mode": "embedded", "model_groups": {
                KV: {"routing": "kv", "vision": vision, "kv": {
                    "tokenizer_path": model_dir, "scrape_interval_s": 0.5, "discovery_interval_s": 1.0}},
                SHUFFLE: {"vision": vision},
            }},
        }
        proxy = start_proxy(config, name="litellm-images", keys=KEYS,
                            env={"LITELLM_KV_SPEND_CAPTURE": str(capture), "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        health = proxy.wait_kv_exact(KV, 90)
        yield {"proxy": proxy, "engines": engines, "capture": capture, "health": health}
    finally:
        if proxy is not None:
            proxy.stop()
        for e in engines:
            e.stop()


def metrics(proxy: Proxy, name: str) -> dict[str, float]:
    """``litellm_kv_<name>_total`` samples of the KV group, keyed by their outcome (fallbacks: why) label."""
    return proxy.metric_by(f"litellm_kv_{name}_total", "why" if name == "routing_fallbacks" else "outcome",
                           model_group=KV)


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def explain(proxy: Proxy, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{proxy.url}/litellm-kv/route", json=body, headers=HEADERS, timeout=30)
    r.raise_for_status()
    return dict(r.json())


def until_indexed(proxy: Proxy, body: dict[str, Any], prompt_tokens: int, timeout_s: float = 15.0) -> None:
    """Wait (bounded) until the index holds every block of a request just answered: the next decision must
    see it (on a busy machine its events can lag the response)."""
    want = (prompt_tokens - 1) // BLOCK * BLOCK
    deadline = time.monotonic() + timeout_s
    while True:
        seen = explain(proxy, body)
        if max(seen.get("hit_tokens", {}).values(), default=0) >= want:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the index did not receive the request's {want} cached tokens within {timeout_s} s: {seen}")
        time.sleep(0.05)


def chat(proxy: Proxy, group: str, messages: list[dict[str, Any]], key: str = MASTER_KEY,
         **extra: Any) -> httpx.Response:
    body = {"model": group, "max_tokens": 2, "temperature": 0, "messages": messages, **extra}
    return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"})


def probes(base: str, served: dict[str, bytes]) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """(messages, extra body) of the probe set: 12 images of 7 sizes (4 to 784 visual tokens), seeded;
    conversations that resend their images; URL twins of inline images; ``max_pixels`` on some requests."""
    rnd = random.Random(19)
    sizes = [(448, 448), (112, 84), (896, 672), (300, 700), (784, 784), (640, 480), (1001, 37)]
    images = [png(*sizes[i % len(sizes)], seed=i) for i in range(12)]
    for i, raw in enumerate(images):
        served[f"img{i}.png"] = raw
    words = ["describe", "the", "picture", "in", "detail", "compare", "colour", "shape", "left", "right", "count"]

    def sentence(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n))

    def img(i: int, url: bool = False) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": f"{base}/img{i}.png"}} if url else inline(images[i])

    out: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    step = 0
    while len(out) < 130:
        kind = step % 8  # by step, not by len(out): kinds that add two probes must not skip the next kind
        step += 1
        i, j = rnd.randrange(12), rnd.randrange(12)
        if kind == 0:  # text only
            out.append(([{"role": "user", "content": sentence(rnd.randrange(20, 120))}], {}))
        elif kind == 1:  # one image, then the same request again (a full hit up to the last block)
            msgs = [{"role": "user", "content": [img(i), text(sentence(12))]}]
            out += [(msgs, {}), (msgs, {})]
        elif kind == 2:  # several images, then a second turn that resends them
            first = {"role": "user", "content": [img(i), img(j), text(sentence(10))]}
            out.append(([first], {}))
            out.append(([first, {"role": "assistant", "content": "two pictures"},
                         {"role": "user", "content": [text(sentence(8)), img((i + 1) % 12)]}], {}))
        elif kind == 3:  # the same image at another position
            out.append(([{"role": "user", "content": [text(sentence(15)), img(i)]}], {}))
        elif kind == 4:  # the same bytes by URL (fetched by the proxy, counted and identified as inline)
            out.append(([{"role": "user", "content": [img(i, url=True), text(sentence(12))]}], {}))
            out.append(([{"role": "user", "content": [img(i), text(sentence(12))]}], {}))
        elif kind == 5:  # a client's max_pixels (identifiers then hash the processor kwargs, as vLLM does)
            msgs = [{"role": "user", "content": [img(i), text(sentence(10))]}]
            out += [(msgs, {"mm_processor_kwargs": {"max_pixels": 50_000}})] * 2
        elif kind == 6:  # the same image twice in one message
            out.append(([{"role": "user", "content": [img(i), img(i), text(sentence(6))]}], {}))
        else:  # a long text prefix shared by many, with an image after it
            out.append(([{"role": "system", "content": "You are a careful describer. " * 30},
                         {"role": "user", "content": [img(j), text(sentence(5))]}], {}))
    assert sum(1 for _, extra in out if extra) >= 8, "the client max_pixels probes are missing"
    assert sum(1 for m, _ in out if len(m) == 3) >= 8, "the second-turn probes are missing"
    return out


def test_image_requests_are_predicted_exactly(stack: dict[str, Any], files: tuple[str, dict[str, bytes]]) -> None:
    """Every probe: routed by cache (no fallback), predicted cached tokens == the engine's cached_tokens,
    predicted visual tokens == the engine's multimodal_tokens; the caches overflow (eviction happens)."""
    proxy: Proxy = stack["proxy"]
    base, served = files
    reset_prefix_caches(stack["engines"])
    checks = probes(base, served)
    pred0, img0, fb0 = metrics(proxy, "prediction_checks"), metrics(proxy, "image_token_checks"), \
        metrics(proxy, "routing_fallbacks")
    hits: list[int] = []
    images_seen = prompt_total = 0
    for n, (messages, extra) in enumerate(checks):
        before = metrics(proxy, "prediction_checks")
        r = chat(proxy, KV, messages, **extra)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        outcome = delta(metrics(proxy, "prediction_checks"), before)
        assert outcome == {"exact": 1.0}, (n, outcome, usage, messages if len(str(messages)) < 400 else "…")
        hits.append(int(usage["prompt_tokens_details"]["cached_tokens"] or 0))
        prompt_total += int(usage["prompt_tokens"])
        if usage["prompt_tokens_details"].get("multimodal_tokens"):
            images_seen += 1
        until_indexed(proxy, {"model": KV, "messages": messages, **extra}, int(usage["prompt_tokens"]))
    pred, img, fb = (delta(metrics(proxy, "prediction_checks"), pred0), delta(metrics(proxy, "image_token_checks"),
                     img0), delta(metrics(proxy, "routing_fallbacks"), fb0))
    for e in stack["engines"]:  # the caches are the size the eviction bound below assumes
        info = httpx.get(e.url + "/metrics", timeout=10).text
        assert f'num_gpu_blocks="{BLOCKS_PER_REPLICA}"' in info
    capacity = REPLICAS * BLOCKS_PER_REPLICA * BLOCK
    print(f"\n[images] {len(checks)} probes ({images_seen} with images, {prompt_total} prompt tokens through "
          f"{capacity} cached-token slots): predictions {pred}, visual-token checks {img}, fallbacks {fb}; "
          f"{sum(1 for h in hits if h)} hit, {sum(hits)} cached tokens, {prompt_total - sum(hits)} computed")
    assert len(checks) >= 100 and pred == {"exact": float(len(checks))}
    assert img == {"exact": float(images_seen)} and images_seen >= 70
    assert not fb.get("multimodal") and not fb.get("multimodal_mismatch"), fb
    # Eviction: the engines stored more full blocks (at least the computed tokens less one partial block per
    # request) than the caches hold together.
    assert prompt_total - sum(hits) - len(checks) * BLOCK > capacity
    assert sum(1 for h in hits if h) >= 30  # repeats, turns, URL twins and the shared prefix did hit


def test_explain_marks_the_image_blocks(stack: dict[str, Any]) -> None:
    raw = png(448, 448, seed=99)
    body = {"model": KV, "messages": [{"role": "user", "content": [text("what is this"), inline(raw)]}]}
    seen = explain(stack["proxy"], body)
    assert seen["reason"] != "fallback", seen
    assert seen["visual_tokens"] == 256
    (image,) = seen["images"]
    assert image["tokens"] == 256 and image["identifier"].startswith("sha256:")
    assert image["blocks"] == [image["offset"] // BLOCK, (image["offset"] + 255) // BLOCK]


def _conversations(n: int, seed: int) -> list[list[tuple[list[dict[str, Any]], int]]]:
    """``n`` image conversations of 3 turns; each turn resends the history (images included)."""
    rnd = random.Random(seed)
    out = []
    for c in range(n):
        raw = png(*rnd.choice([(784, 784), (896, 672), (640, 480)]), seed=1000 * seed + c)
        first = {"role": "user", "content": [inline(raw), text(f"conversation {c}: describe")]}
        history: list[dict[str, Any]] = [first]
        turns = []
        for t in range(3):
            turns.append(([dict(m) for m in history], c))
            history += [{"role": "assistant", "content": f"turn {t} answer"},
                        {"role": "user", "content": [text(f"and now detail {t} of it, please")]}]
        out.append(turns)
    return out


def _replay(proxy: Proxy, group: str,
            convs: list[list[tuple[list[dict[str, Any]], int]]]) -> tuple[int, int, list[float]]:
    """Turn by turn across conversations (interleaved); (cached tokens, prompt tokens, latencies)."""
    cached = prompt = 0
    latencies: list[float] = []
    for t in range(3):
        for conv in convs:
            messages, _c = conv[t]
            t0 = time.perf_counter()
            r = chat(proxy, group, messages)
            latencies.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            u = r.json()["usage"]
            cached += int(u["prompt_tokens_details"]["cached_tokens"] or 0)
            prompt += int(u["prompt_tokens"])
            if group == KV:
                until_indexed(proxy, {"model": KV, "messages": messages}, int(u["prompt_tokens"]))
            else:
                time.sleep(0.1)
    return cached, prompt, latencies


#: Image conversations replayed per group: their distinct tokens (about 1K each on the first turn) overflow
#: one replica's cache (6,144 tokens) but fit the fleet's (18,432), the regime where routing decides the hits.
CONVERSATIONS = 12


def test_image_conversations_follow_their_cache(stack: dict[str, Any]) -> None:
    """Image conversations (3 turns, images resent every turn) through the KV group and through
    ``simple-shuffle`` over the same three replicas, each from empty caches: the KV group's cached-token
    ratio is at least 1.5x shuffle's."""
    proxy: Proxy = stack["proxy"]
    ratios, mean_ms = {}, {}
    for group, seed in ((SHUFFLE, 1), (KV, 2)):
        reset_prefix_caches(stack["engines"])
        cached, prompt, latencies = _replay(proxy, group, _conversations(CONVERSATIONS, seed))
        ratios[group] = cached / prompt
        mean_ms[group] = 1000 * sum(latencies) / len(latencies)
    # Latency is printed, not asserted: one request at a time on three CPU replicas (docs/kv-routing.md).
    print(f"\n[images] cached/prompt over {CONVERSATIONS} image conversations x 3 turns: kv {ratios[KV]:.3f}, "
          f"simple-shuffle {ratios[SHUFFLE]:.3f} ({ratios[KV] / max(ratios[SHUFFLE], 1e-9):.2f}x); mean latency "
          f"kv {mean_ms[KV]:.0f} ms, simple-shuffle {mean_ms[SHUFFLE]:.0f} ms")
    assert ratios[KV] >= 1.5 * ratios[SHUFFLE], ratios


def test_routing_limits_and_charge_use_one_count(stack: dict[str, Any]) -> None:
    """One image request under a key with visual-token limits: the count routing expanded the placeholders
    with (``/litellm-kv/route`` and the per-response check against the engine), the count the limits were
    checked with (``x-litellm-kv-visual-tokens``) and the count charged (usage ``image_tokens`` and the spend
    log) are one number, and it is the engine's ``multimodal_tokens``."""
    proxy: Proxy = stack["proxy"]
    raws = [png(640, 480, seed=7), png(300, 700, seed=8)]
    messages = [{"role": "user", "content": [inline(raws[0]), text("compare"), inline(raws[1])]}]
    routed = explain(proxy, {"model": KV, "messages": messages})["visual_tokens"]
    checks0 = metrics(proxy, "image_token_checks")
    rows0 = stack["capture"].read_text().count("\n") if stack["capture"].exists() else 0
    r = chat(proxy, KV, messages, key="sk-vision")
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    limit_count = int(r.headers["x-litellm-kv-visual-tokens"])
    engine_count = usage["prompt_tokens_details"]["multimodal_tokens"]["image"]
    charged = usage["prompt_tokens_details"]["image_tokens"]
    assert delta(metrics(proxy, "image_token_checks"), checks0) == {"exact": 1.0}
    deadline = time.monotonic() + 15
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not rows:
        lines = stack["capture"].read_text().splitlines() if stack["capture"].exists() else []
        rows = [json.loads(x) for x in lines[rows0:] if x.strip()]
        time.sleep(0.2)
    assert rows, "no spend-log row was written"
    logged = rows[-1]["spend_logs_metadata"]["litellm_kv"]["vision"]["visual_tokens"]
    print(f"\n[images] routed {routed}, limit {limit_count}, engine {engine_count}, charged {charged}, "
          f"spend log {logged}")
    assert routed == limit_count == engine_count == charged == logged > 0
