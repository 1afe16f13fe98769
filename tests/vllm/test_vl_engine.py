"""The tiny vision-language model served by a real vLLM CPU engine: what it counts, caches and publishes.

Engine: one replica from the vision-language engine venv (``.venv-engine-vl``, built by scripts/test.sh or
``LITELLM_KV_VL_ENGINE=1 scripts/setup.sh``; without it these tests skip and say so, or fail in scripts/test.sh's
run: tests/support/vl_engine.py), block size 32, prefix caching, KV events over ZMQ (ipc). Images are generated
PNGs sent as ``data:`` URLs in ``/v1/chat/completions``. These are the engine facts issue 19's image routing is
built on: the engine's visual-token count is ``litellm_kv.governance.vision.visual_tokens``'s, a repeated image
request hits the cache up to the last full block, and every stored block that overlaps an image's placeholder run
carries ``(identifier, offset from the block start)`` in its event ``extra_keys``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from PIL import Image

from litellm_kv.governance.images import image_info
from litellm_kv.governance.vision import visual_tokens
from litellm_kv.vllm.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_event_batch
from litellm_kv.vllm.hashing import BlockHasher, predicted_hit_tokens, wire_from_event_hash
from litellm_kv.vllm.multimodal import (
    ExpandedPrompt,
    ImageItem,
    event_extra_keys,
    expand_images,
    image_block_hashes,
    image_identifier,
)
from litellm_kv.vllm.tokenization import LocalChatTokenizer
from tests.support.image_server import image_server
from tests.support.vl_engine import require_vl_engine
from tools.harness.engines import SERVED_NAME, VL_ENGINE_PY, EngineReplica, start_vl_replica

pytestmark = [pytest.mark.engine]

BLOCK = 32
TEXT = {"type": "text", "text": "describe the picture in detail please " * 3}
# <|im_start|> user \n <|vision_start|>: the image's placeholder run starts at this index.
IMAGE_OFFSET = 4


@dataclass
class Events:
    """BlockStored events of one replica, collected by a SUB socket on a thread."""

    stored: list[BlockStored] = field(default_factory=list)
    log: list[Any] = field(default_factory=list)  # every event, in order (stored, removed, cleared)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def listen(self, endpoint: str) -> None:
        sock = zmq.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        try:
            while not self.stop.is_set():
                if sock.poll(100):
                    _topic, _seq, payload = sock.recv_multipart()
                    batch = decode_event_batch(payload).events
                    with self.lock:
                        self.log += batch
                        self.stored += [e for e in batch if isinstance(e, BlockStored)]
        finally:
            sock.close(0)

    def since(self, n: int, quiet_s: float = 0.3, timeout_s: float = 10.0) -> list[BlockStored]:
        """The events after the first ``n``, once none has arrived for ``quiet_s`` (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        seen = -1
        while time.monotonic() < deadline:
            now = self.count()
            if now == seen and now > n:
                break
            seen = now
            time.sleep(quiet_s)
        with self.lock:
            return self.stored[n:]

    def count(self) -> int:
        with self.lock:
            return len(self.stored)

    def held(self) -> set[int]:
        """The wire hashes the replica holds now, replayed from its events."""
        out: set[int] = set()
        with self.lock:
            log = list(self.log)
        for ev in log:
            if isinstance(ev, BlockStored):
                out.update(wire_from_event_hash(h) for h in ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                out.difference_update(wire_from_event_hash(h) for h in ev.block_hashes)
            elif isinstance(ev, AllBlocksCleared):
                out.clear()
        return out


@dataclass
class VL:
    engine: EngineReplica
    http: httpx.Client
    events: Events

    def chat(self, parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        resp = self.http.post(self.engine.url + "/v1/chat/completions", json={
            "model": SERVED_NAME, "max_tokens": 2, "messages": [{"role": "user", "content": parts}], **extra})
        assert resp.status_code == 200, resp.text
        return dict(resp.json()["usage"])


@pytest.fixture(scope="module")
def vl() -> Iterator[VL]:
    require_vl_engine()
    engine = start_vl_replica(block_size=BLOCK, extra_args=["--trust-request-mm-kwargs"])
    events = Events()
    thread = threading.Thread(target=events.listen, args=(engine.subscribe_endpoint,), daemon=True)
    thread.start()
    time.sleep(1.0)  # the SUB socket joins before the first request
    try:
        with httpx.Client(timeout=120) as http:
            yield VL(engine, http, events)
    finally:
        events.stop.set()
        thread.join(5)
        engine.stop()


def png(w: int, h: int, colour: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(buf, format="PNG")
    return buf.getvalue()


def image_part(w: int, h: int, colour: tuple[int, int, int], uuid: str | None = None) -> dict[str, Any]:
    data = base64.b64encode(png(w, h, colour)).decode()
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def image_keys(stored: list[BlockStored]) -> list[Any]:
    """The per-block extra keys of the stored blocks, in block order (one request's store)."""
    keys: list[Any] = []
    for ev in stored:
        assert ev.block_size == BLOCK
        keys += list(ev.extra_keys or [None] * len(ev.block_hashes))
    return keys


def expected_keys(ident: str, n_blocks: int, run: int) -> list[Any]:
    """What vLLM puts on each full block: the identifier and the run's start relative to the block,
    for every block overlapping ``[IMAGE_OFFSET, IMAGE_OFFSET + run)``, else nothing."""
    out: list[Any] = []
    for b in range(n_blocks):
        start = b * BLOCK
        overlaps = start < IMAGE_OFFSET + run and start + BLOCK > IMAGE_OFFSET
        out.append(((ident, IMAGE_OFFSET - start),) if overlaps else None)
    return out


@pytest.mark.parametrize("size", [(112, 84), (448, 448), (640, 480), (1001, 37), (300, 700)])
def test_image_count_cache_hit_and_event_keys(vl: VL, size: tuple[int, int]) -> None:
    w, h = size
    part = image_part(w, h, (w % 256, h % 256, 77))
    want = visual_tokens("qwen2_5_vl", w, h)
    n0 = vl.events.count()
    first = vl.chat([part, TEXT])
    stored = vl.events.since(n0)
    again = vl.chat([part, TEXT])

    details = first["prompt_tokens_details"]
    assert details["multimodal_tokens"] == {"image": want}
    assert details["cached_tokens"] == 0
    full_blocks = first["prompt_tokens"] // BLOCK
    assert again["prompt_tokens_details"]["cached_tokens"] == (first["prompt_tokens"] - 1) // BLOCK * BLOCK > 0

    keys = image_keys(stored)
    assert len(keys) >= full_blocks  # the prompt's full blocks (a generated token may complete one more)
    ident = keys[0][0][0]
    assert isinstance(ident, str) and len(ident) == 64 and int(ident, 16) >= 0  # blake3 hex of the image
    assert keys[:full_blocks] == expected_keys(ident, full_blocks, want)
    # The stored tokens hold the expanded placeholder run: exactly ``want`` copies of one token id.
    tokens = [t for ev in stored for t in ev.token_ids]
    pad = tokens[IMAGE_OFFSET]
    run = tokens[IMAGE_OFFSET:]
    run_len = next((i for i, t in enumerate(run) if t != pad), len(run))
    assert tokens[IMAGE_OFFSET - 1] != pad
    assert run_len == want or (run_len < want and run_len == len(run))


def test_client_uuid_is_the_identifier_verbatim(vl: VL) -> None:
    n0 = vl.events.count()
    usage = vl.chat([image_part(448, 448, (1, 2, 3), uuid="my-image-1"), TEXT])
    keys = image_keys(vl.events.since(n0))
    full_blocks = usage["prompt_tokens"] // BLOCK
    assert keys[:full_blocks] == expected_keys("my-image-1", full_blocks, visual_tokens("qwen2_5_vl", 448, 448))


def test_same_pixels_other_uuid_misses(vl: VL) -> None:
    """The identifier, not the pixels, keys the blocks: the same image under two uuids shares only
    the blocks before the image (none here), so the second request hits nothing."""
    part = image_part(448, 448, (4, 5, 6), uuid="first-name")
    vl.chat([part, TEXT])
    usage = vl.chat([{**part, "uuid": "second-name"}, TEXT])
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_text_only_blocks_carry_no_keys(vl: VL) -> None:
    n0 = vl.events.count()
    usage = vl.chat([TEXT, {"type": "text", "text": " and nothing else" * 8}])
    keys = image_keys(vl.events.since(n0))
    assert usage["prompt_tokens_details"]["multimodal_tokens"] is None
    assert len(keys) >= usage["prompt_tokens"] // BLOCK > 0
    assert set(keys) == {None}


@pytest.mark.parametrize(("size", "max_pixels"), [((640, 480), 50_000), ((448, 448), 100_000), ((1001, 37), 20_000)])
def test_request_max_pixels_count(vl: VL, size: tuple[int, int], max_pixels: int) -> None:
    """Per-request ``mm_processor_kwargs`` (the engine runs with ``--trust-request-mm-kwargs``)."""
    w, h = size
    part = image_part(w, h, (3, w % 256, h % 256))
    kwargs = {"mm_processor_kwargs": {"max_pixels": max_pixels}}
    first = vl.chat([part, TEXT], **kwargs)
    again = vl.chat([part, TEXT], **kwargs)
    want = visual_tokens("qwen2_5_vl", w, h, max_pixels=max_pixels)
    assert want < visual_tokens("qwen2_5_vl", w, h)
    assert first["prompt_tokens_details"]["multimodal_tokens"] == {"image": want}
    assert again["prompt_tokens_details"]["cached_tokens"] == (first["prompt_tokens"] - 1) // BLOCK * BLOCK > 0


# Runs in the vision-language engine venv: vLLM's own identifier for each case, computed in-process.
ORACLE = r"""
import base64, io, json, sys
from PIL import Image
from vllm.multimodal.hasher import MultiModalHasher
from vllm.multimodal.media import MediaWithBytes
model, cases = sys.argv[1], json.loads(sys.argv[2])
out = []
for c in cases:
    factors = {"mm_processor_kwargs": c["kwargs"]} if c["kwargs"] else {}
    if c["uuid"] is not None and not factors:
        out.append(c["uuid"])
        continue
    if c["uuid"] is not None:
        item = c["uuid"]
    else:
        raw = base64.b64decode(c["png"])
        image = Image.open(io.BytesIO(raw))
        image.load()
        item = MediaWithBytes(image, raw)
    out.append(MultiModalHasher.hash_kwargs("blake3", model_id=model, image=item, **factors))
print(json.dumps(out))
"""


def test_identifiers_are_vllm_hasher_digests(vl: VL) -> None:
    """The identifier in the events is vLLM's ``MultiModalHasher`` digest of the model path, the image's
    original bytes (or the client's uuid) and the per-request processor kwargs; a uuid with no kwargs is
    used verbatim. So a router can compute it from the request's bytes without decoding pixels."""
    cases = [
        {"size": (200, 150), "uuid": None, "kwargs": None},
        {"size": (200, 150), "uuid": None, "kwargs": {"max_pixels": 20_000}},
        {"size": (200, 150), "uuid": "client-id-7", "kwargs": {"max_pixels": 20_000}},
        {"size": (200, 150), "uuid": "client-id-8", "kwargs": None},
    ]
    seen = []
    for i, c in enumerate(cases):
        w, h = c["size"]
        raw = png(w, h, (i, 200, 100))
        c["png"] = base64.b64encode(raw).decode()
        part = image_part(w, h, (i, 200, 100), uuid=c["uuid"])
        extra = {"mm_processor_kwargs": c["kwargs"]} if c["kwargs"] else {}
        n0 = vl.events.count()
        vl.chat([part, TEXT], **extra)
        seen.append(image_keys(vl.events.since(n0))[0][0][0])
    out = subprocess.run(
        [str(VL_ENGINE_PY), "-c", ORACLE, str(vl.engine.model_dir),
         json.dumps([{k: v for k, v in c.items() if k != "size"} for c in cases])],
        check=True, capture_output=True, text=True, timeout=120)
    assert seen == json.loads(out.stdout.strip().splitlines()[-1])
    assert seen[3] == "client-id-8" and len(set(seen)) == 4


# -- Predicted block hashes for requests with images (litellm_kv.vllm.multimodal) --------------------

PAD_TOKEN = "<|image_pad|>"


@dataclass(frozen=True)
class Img:
    """A generated PNG; the proxy would set ``uuid = image_identifier(bytes)`` on its part."""

    w: int
    h: int
    colour: tuple[int, int, int]

    @property
    def raw(self) -> bytes:
        return png(self.w, self.h, self.colour)

    def part(self, url: str | None = None) -> dict[str, Any]:
        raw = self.raw
        url = url or "data:image/png;base64," + base64.b64encode(raw).decode()
        return {"type": "image_url", "image_url": {"url": url}, "uuid": image_identifier(raw)}


@dataclass
class Predictor:
    """What litellm-kv computes for a request: the engine's prompt ids, block hashes and hit."""

    tokenizer: LocalChatTokenizer
    hasher: BlockHasher
    pad_id: int

    def predict(self, messages: list[dict[str, Any]]) -> tuple[ExpandedPrompt, list[int]]:
        items = [ImageItem(image_identifier(_part_bytes(p)), visual_tokens("qwen2_5_vl", *_part_size(p)))
                 for m in messages if isinstance(m["content"], list) for p in m["content"]
                 if p.get("type") == "image_url"]
        prompt = expand_images(self.tokenizer.chat_tokens(messages), self.pad_id, items)
        return prompt, image_block_hashes(self.hasher, prompt)


_SENT: dict[str, bytes] = {}  # identifier -> bytes of every image the tests sent (URL parts carry no data)


def _part_bytes(part: dict[str, Any]) -> bytes:
    url = part["image_url"]["url"]
    if url.startswith("data:"):
        return base64.b64decode(url.split(",", 1)[1])
    return _SENT[part["uuid"]]


def _part_size(part: dict[str, Any]) -> tuple[int, int]:
    info = image_info(_part_bytes(part))
    return info.width, info.height


@pytest.fixture(scope="module")
def predictor(vl: VL) -> Predictor:
    tok = LocalChatTokenizer(vl.engine.model_dir, content_format="openai")
    pad = tok.encode(PAD_TOKEN)
    assert len(pad) == 1
    return Predictor(tok, BlockHasher("sha256", block_size=BLOCK), pad[0])


@pytest.fixture(scope="module")
def url_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A local HTTP server the engine fetches image URLs from (``/<name>.png``)."""
    files: dict[str, bytes] = {}

    with image_server(files.get) as base:
        yield base, files


def _user(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "content": [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]}


def test_predicted_hashes_and_hits_equal_the_engine(vl: VL, predictor: Predictor,
                                                    url_server: tuple[str, dict[str, bytes]]) -> None:
    """For each request (text only, one image, several, the same image twice, at another position, on a
    later turn, by URL, other sizes), sent with the proxy-style ``uuid`` on every image part: the
    predicted prompt length and visual count equal the engine's usage, the predicted block hashes of the
    blocks the engine newly stores equal its ``BlockStored`` hashes (and extra keys), and the predicted
    hit, from the blocks the engine's events say it holds, equals ``cached_tokens``."""
    base, files = url_server
    a, b, c = Img(448, 448, (10, 20, 30)), Img(112, 84, (40, 50, 60)), Img(300, 700, (70, 80, 90))
    d, e = Img(640, 480, (11, 22, 33)), Img(1001, 37, (44, 55, 66))
    for img in (a, b, c, d, e):
        _SENT[image_identifier(img.raw)] = img.raw
    files["a.png"] = a.raw
    text = "describe the picture in detail please " * 3
    more = "and then compare it with the previous one, carefully " * 2
    convs: list[list[dict[str, Any]]] = [
        [_user("just text, no image at all. " * 6)],
        [_user("just text, no image at all. " * 6, more)],
        [_user(a.part(), text)],
        [_user(a.part(), text)],  # repeated
        [_user(a.part(), text, more)],  # extended
        [_user(text, a.part())],  # the same image at another position
        [_user(a.part(), b.part(), c.part(), text)],  # several images
        [_user(a.part(), b.part(), c.part(), text), {"role": "assistant", "content": "three"}, _user(more)],
        [_user(b.part(), b.part(), text)],  # the same image twice, both runs in one block
        [_user(b.part(), b.part(), b.part(), more)],
        [_user(d.part(), text)],
        [_user(e.part(), text)],
        [_user(e.part(), d.part(), text)],
        [_user(a.part(base + "/a.png"), text)],  # the same bytes by URL: hits the inline request's blocks
        [_user(a.part(), text), {"role": "assistant", "content": "a square"}, _user(c.part(), more)],  # turn 2
        [_user(a.part(), "a second turn follows"), {"role": "assistant", "content": "ok"}, _user(c.part(), more)],
    ]
    results = []
    for messages in convs:
        prompt, predicted = predictor.predict(messages)
        held = vl.events.held()
        leading = next((i for i, h in enumerate(predicted) if h not in held), len(predicted))
        n0 = vl.events.count()
        resp = vl.http.post(vl.engine.url + "/v1/chat/completions",
                            json={"model": SERVED_NAME, "max_tokens": 2, "messages": messages})
        assert resp.status_code == 200, resp.text
        usage = resp.json()["usage"]
        stored = vl.events.since(n0)
        new = [wire_from_event_hash(h) for ev in stored for h in ev.block_hashes]
        new_keys = image_keys(stored)
        n_full = len(prompt.token_ids) // BLOCK
        visual = sum(f.length for f in prompt.features)
        assert usage["prompt_tokens"] == len(prompt.token_ids)
        assert usage["prompt_tokens_details"]["multimodal_tokens"] == ({"image": visual} if visual else None)
        assert new[: n_full - leading] == predicted[leading:n_full]
        assert new_keys[: n_full - leading] == event_extra_keys(prompt.features, len(prompt.token_ids), BLOCK)[leading:]
        hit = predicted_hit_tokens(leading, len(prompt.token_ids), BLOCK)
        assert usage["prompt_tokens_details"]["cached_tokens"] == hit
        results.append(hit)
    print(f"\n[vl] {len(convs)} requests, predicted hits equal cached_tokens on all: {results}")
    # The cases are not vacuous: repeats, extensions, the URL request and resent turns hit the cache.
    assert results[3] > 0 and results[4] > 0 and results[7] > 0 and results[13] > 0 and results[14] > 0


# Runs in the vision-language engine venv (it has blake3 and vLLM): litellm_kv's engine_identifier beside
# vLLM's own MultiModalHasher, for each case.
KWARGS_ORACLE = r"""
import json, sys
from vllm.multimodal.hasher import MultiModalHasher
from vllm.multimodal.processing.inputs import _HF_MODALITY_PROCESSOR_KWARGS as SCOPED
from litellm_kv.vllm.multimodal import engine_identifier
model, cases = sys.argv[1], json.loads(sys.argv[2])
out = []
for algo, uuid, kwargs in cases:
    ours = engine_identifier(uuid, model, kwargs, algo)
    # get_mm_hashes for an image: other modalities' scoped keys dropped; no factors left -> the uuid.
    kept = {k: v for k, v in kwargs.items() if k not in SCOPED.values() or k == SCOPED["image"]}
    theirs = (MultiModalHasher.hash_kwargs(algo, model_id=model, image=uuid, mm_processor_kwargs=kept)
              if kept else uuid)
    out.append([ours, theirs])
print(json.dumps(out))
"""


def _kwargs_identifiers(model: str, cases: list[list[Any]]) -> list[list[str]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([str(VL_ENGINE_PY), "-c", KWARGS_ORACLE, model, json.dumps(cases)],
                         check=True, capture_output=True, text=True, timeout=180, env=env)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_identifier_with_processor_kwargs_equals_the_engine(vl: VL, predictor: Predictor) -> None:
    """With ``mm_processor_kwargs`` (what the governance downscale sets), ``engine_identifier`` of the
    proxy's uuid equals vLLM's ``MultiModalHasher`` (blake3, its default, and sha256/sha512) on odd
    values too, and on the real engine: the predicted hashes of requests with kwargs (the count
    following ``max_pixels``/``min_pixels``) equal its ``BlockStored`` hashes, and a repeat hits."""
    model = str(vl.engine.model_dir)
    img = Img(640, 480, (99, 98, 97))
    uuid = image_identifier(img.raw)
    _SENT[uuid] = img.raw
    odd = [{"max_pixels": 50_000, "flag": True, "scale": 0.5, "neg": -3, "none": None, "name": "ü",
            "nested": {"a": [1, 2.5, "x", [False]], "b": {}}, "t": []},
           {"images_kwargs": {"max_pixels": 1}, "videos_kwargs": {"fps": 2}},
           {"videos_kwargs": {"fps": 2}, "audio_kwargs": {}}]
    engine_cases = [{"max_pixels": 20_000}, {"min_pixels": 3136, "max_pixels": 50_000},
                    {"max_pixels": 50_000, "min_pixels": 3136}]
    cases = [[algo, uuid, kw] for algo in ("blake3", "sha256", "sha512") for kw in odd + engine_cases]
    pairs = _kwargs_identifiers(model, cases)
    assert all(ours == theirs for ours, theirs in pairs), pairs
    blake = {json.dumps(kw): ours for (algo, _u, kw), (ours, _t) in zip(cases, pairs, strict=True) if algo == "blake3"}
    assert blake[json.dumps(odd[2])] == uuid  # only other modalities' kwargs: no factors, the uuid verbatim
    assert len(set(blake.values())) == len(blake)

    text = "describe the picture in detail please " * 3
    seen_ids = set()
    for kw in engine_cases:
        ident = blake[json.dumps(kw)]
        seen_ids.add(ident)
        messages = [_user(img.part(), text)]
        count = visual_tokens("qwen2_5_vl", img.w, img.h, min_pixels=kw.get("min_pixels"), max_pixels=kw["max_pixels"])
        prompt = expand_images(predictor.tokenizer.chat_tokens(messages), predictor.pad_id, [ImageItem(ident, count)])
        predicted = image_block_hashes(predictor.hasher, prompt)
        held = vl.events.held()
        leading = next((i for i, h in enumerate(predicted) if h not in held), len(predicted))
        for attempt in range(2):
            n0 = vl.events.count()
            usage = vl.chat(messages[0]["content"], mm_processor_kwargs=kw)
            stored = vl.events.since(n0)
            n_full = len(prompt.token_ids) // BLOCK
            assert usage["prompt_tokens"] == len(prompt.token_ids)
            assert usage["prompt_tokens_details"]["multimodal_tokens"] == {"image": count}
            new = [wire_from_event_hash(h) for ev in stored for h in ev.block_hashes]
            assert new[: n_full - leading] == predicted[leading:n_full]
            assert usage["prompt_tokens_details"]["cached_tokens"] == predicted_hit_tokens(
                leading, len(prompt.token_ids), BLOCK)
            if attempt == 0:
                leading = n_full
    # The two orders of the same kwargs are two identifiers (vLLM hashes the mapping in its order).
    assert len(seen_ids) == 3
