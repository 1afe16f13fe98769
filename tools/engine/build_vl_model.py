"""Build the tiny vision-language test model the real vLLM image tests serve.

A randomly initialised ``Qwen2_5_VLForConditionalGeneration`` (2 text layers, 2 vision blocks,
tiny widths) with Qwen2.5-VL's real image-processor settings (patch 14, merge 2, temporal
patch 2, ``min_pixels``/``max_pixels`` as in Qwen/Qwen2.5-VL-*-Instruct), and the text test
model's tokenizer (``build_model.py``) extended with Qwen's vision special tokens and a ChatML
template that renders each image part as ``<|vision_start|><|image_pad|><|vision_end|>``.
Everything is local and deterministic (fixed seeds, no hub). Generated text is garbage; tokens,
placeholder expansion, multimodal hashes, blocks, KV events and ``cached_tokens`` are real.

Run with the engine venv::

    .venv-engine/bin/python tools/engine/build_vl_model.py [--out .artifacts/tiny-vl-model]

A directory that already holds a model of the same :data:`VERSION` is left as is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_model  # the text model's tokenizer is the base of this one

# Bump when anything below changes the produced files.
VERSION = "tiny-qwen2_5_vl-v2"
MARKER = build_model.MARKER
DEFAULT_OUT = build_model.ROOT / ".artifacts" / "tiny-vl-model"
SEED = 4321

# Qwen2.5-VL's vision markers, all special (as in the real tokenizer), in the real order.
VISION_TOKENS = [
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]

# Qwen/Qwen2.5-VL-*-Instruct preprocessor_config.json (the values litellm_kv.governance.vision uses).
PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 16384

# Qwen2-VL style ChatML: every image part becomes one placeholder run the processor expands.
CHAT_TEMPLATE = r"""{%- macro render(content) %}
{%- if content is string %}{{- content }}
{%- elif content %}{%- for part in content %}
{%- set is_image = part.type in ('image', 'image_url') or 'image' in part or 'image_url' in part %}
{%- if is_image %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}
{%- elif part.type == 'video' or 'video' in part %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}
{%- elif part.type == 'text' %}{{- part.text }}
{%- endif %}
{%- endfor %}{%- endif %}
{%- endmacro %}
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' + render(message.content) + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""


def extend_tokenizer(out: Path) -> dict[str, int]:
    """Add the vision tokens to the text model's tokenizer in ``out``; returns their ids."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    ids = {t: int(tok.token_to_id(t)) for t in VISION_TOKENS}
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    for t, tid in ids.items():
        cfg["added_tokens_decoder"][str(tid)] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["processor_class"] = "Qwen2_5_VLProcessor"
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return ids


def write_processor_configs(out: Path) -> None:
    common = {
        "patch_size": PATCH_SIZE,
        "merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "rescale_factor": 0.00392156862745098,
        "resample": 3,
    }
    image = {**common, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}
    video = {**common, "video_processor_type": "Qwen2VLVideoProcessor", "processor_class": "Qwen2_5_VLProcessor"}
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2, sort_keys=True))
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2, sort_keys=True))


def build_vl_model(out: Path, vocab_size: int, ids: dict[str, int], eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(SEED)
    padded = (vocab_size + 63) // 64 * 64
    head_dim = 64
    text = {
        "vocab_size": padded,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        # M-RoPE: temporal/height/width sections of head_dim / 2 rotary pairs (Qwen2.5-VL's 16:24:24 ratio).
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [8, 12, 12]},
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": text["hidden_size"],
        "fullatt_block_indexes": [1],
        "window_size": 112,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "in_channels": 3,
        "tokens_per_second": 2,
    }
    cfg = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = Qwen2_5_VLForConditionalGeneration(cfg).to(torch.float32)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False).save_pretrained(str(out))


def processor_loads(out: Path) -> None:
    """Fail the build unless transformers' image processor loads and turns an image into patches.

    (The full ``Qwen2_5_VLProcessor`` also loads a video processor, which needs torchvision; the
    engine venv has none, see scripts/setup.sh.)
    """
    from PIL import Image
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(str(out))
    enc = proc(images=[Image.new("RGB", (112, 84), (200, 30, 30))], return_tensors="pt")
    t, h, w = (int(x) for x in enc["image_grid_thw"][0])
    if t * h * w // (MERGE_SIZE * MERGE_SIZE) == 0:
        raise SystemExit(f"image processor gave an empty grid {t, h, w}")


def build(out: Path, force: bool = False) -> Path:
    marker = out / MARKER
    if not force and marker.exists() and marker.read_text().strip() == VERSION:
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build_model.build_tokenizer(tmp)
    ids = extend_tokenizer(tmp)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    write_processor_configs(tmp)
    build_vl_model(tmp, vocab, ids, eos_id=tok.token_to_id("<|im_end|>"), pad_id=tok.token_to_id("<|endoftext|>"))
    build_model.engine_tokenizer_agrees(tmp)
    processor_loads(tmp)
    (tmp / MARKER).write_text(VERSION + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="rebuild even if the version marker matches")
    args = ap.parse_args(argv)
    print(build(args.out, args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
