"""The tiny vision-language model served by a real vLLM CPU engine: what it counts, caches and publishes.

Engine: one replica from the vision-language engine venv (``.venv-engine-vl``, built by scripts/test.sh or
``LITELLM_KV_VL_ENGINE=1 scripts/setup.sh``; without it these tests skip and say so), block size 32,
prefix caching, KV events over ZMQ (ipc). Images are generated PNGs sent as ``data:`` URLs in
``/v1/chat/completions``. These are the engine facts issue 19's image routing is built on: the
engine's visual-token count is ``litellm_kv.governance.vision.visual_tokens``'s, a repeated image
request hits the cache up to the last full block, and every stored block that overlaps an image's
placeholder run carries ``(identifier, offset from the block start)`` in its event ``extra_keys``.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import zmq
from PIL import Image

from litellm_kv.governance.vision import visual_tokens
from litellm_kv.vllm.events import BlockStored, decode_event_batch
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
                    with self.lock:
                        self.stored += [e for e in decode_event_batch(payload).events if isinstance(e, BlockStored)]
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
    if not VL_ENGINE_PY.exists():
        pytest.skip(f"{VL_ENGINE_PY} is missing (built by scripts/test.sh or LITELLM_KV_VL_ENGINE=1 scripts/setup.sh)")
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
