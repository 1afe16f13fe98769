"""The tiny vision-language test model (``tools/engine/build_vl_model.py``) against litellm-kv's counts.

These tests check the model's own files with transformers in the engine venv, without an engine: its
image processor turns each image into exactly the visual-token count ``litellm_kv.governance.vision``
computes, and its chat template and tokenizer give one ``<|image_pad|>`` per image between the
vision markers. The engine-level checks (usage, ``cached_tokens``, KV-event extra keys) are in
``test_vl_engine.py``, on the vision-language engine venv (built by the test command) (docs/hashing.md, "Images").
"""

from __future__ import annotations

import json
import subprocess

import pytest

from litellm_kv.governance.vision import visual_tokens
from tools.harness.engines import ENGINE_PY, ensure_vl_model

pytestmark = pytest.mark.slow

SIZES = [(112, 84), (28, 28), (640, 480), (1001, 37), (3000, 20), (56, 5000)]
PIXEL_BOUNDS = [(None, None), (None, 200_000), (100_000, None)]

# Runs in the engine venv: the model's own processor config, loaded by transformers.
PROBE = r"""
import json, sys
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer
model, cases = sys.argv[1], json.loads(sys.argv[2])
proc = AutoImageProcessor.from_pretrained(model)
merge = proc.merge_size
grids = []
for w, h, lo, hi in cases:
    kw = {}
    if lo is not None:
        kw["min_pixels"] = lo
    if hi is not None:
        kw["max_pixels"] = hi
    thw = proc(images=[Image.new("RGB", (w, h), (9, 99, 199))], return_tensors="np", **kw)["image_grid_thw"][0]
    grids.append(int(thw[0]) * int(thw[1]) * int(thw[2]) // (merge * merge))
tok = AutoTokenizer.from_pretrained(model)
msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {"url": "y"}}]}]
ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
names = {t: tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")}
print(json.dumps({"grids": grids, "ids": list(ids), "names": names}))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    model = ensure_vl_model()
    cases = [[w, h, lo, hi] for w, h in SIZES for lo, hi in PIXEL_BOUNDS]
    out = subprocess.run([str(ENGINE_PY), "-c", PROBE, str(model), json.dumps(cases)], check=True,
                         capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["cases"] = cases
    return result


def test_image_processor_count_is_visual_tokens(probe: dict) -> None:
    want = [visual_tokens("qwen2_5_vl", w, h, min_pixels=lo, max_pixels=hi) for w, h, lo, hi in probe["cases"]]
    assert probe["grids"] == want
    assert len(set(want)) > 5  # the cases really differ


def test_chat_template_emits_one_placeholder_per_image(probe: dict) -> None:
    ids, names = probe["ids"], probe["names"]
    start, pad, end = names["<|vision_start|>"], names["<|image_pad|>"], names["<|vision_end|>"]
    assert len({start, pad, end}) == 3
    runs = [i for i, t in enumerate(ids) if t == start]
    assert len(runs) == 2
    for i in runs:
        assert ids[i + 1 : i + 3] == [pad, end]
    assert ids.count(pad) == 2
