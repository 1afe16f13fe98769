"""Build the tiny test model and tokenizer the real vLLM test engines serve.

Everything is made locally and deterministically (fixed seeds, no hub): a byte-level BPE
tokenizer trained on a seeded synthetic corpus plus Python stdlib sources, a ChatML chat
template (Qwen3 style: renders ``tools``, honours ``enable_thinking``), and a randomly
initialised 2-layer ``Qwen2ForCausalLM``. The generated text is garbage; tokens, blocks,
hashes, KV events, metrics and ``cached_tokens`` are all real.

Run with the engine venv (it has torch and transformers)::

    .venv-engine/bin/python tools/engine/build_model.py [--out .artifacts/tiny-model] [--variant tiny|ttft]

A directory that already holds a model of the same variant version is left as is.

Variants (same tokenizer and chat template, different network):

* ``tiny`` (default, ``.artifacts/tiny-model``): 2 layers, width 128, 4K context: the fast tests.
* ``ttft`` (``.artifacts/ttft-model``): the TTFT testbed's model (docs/kv-routing.md, "A testbed shaped
  like GPU serving"): the same narrow network with a 16K context, so 2K-8K-token prompts fit. Chosen by
  ``tools/engine/calibrate.py``, which measures on the engine what 1,024 uncached prompt tokens cost in
  single-sequence decode steps.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Bump when anything below changes the produced files.
VERSION = "tiny-qwen2-v4"
MARKER = "litellm_kv_model_version.txt"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # litellm_kv.vllm.bpe (stdlib only at import) from the engine venv

from litellm_kv.vllm.bpe import QWEN2_PATTERN  # noqa: E402  (what transformers' Qwen2Tokenizer installs)

DEFAULT_OUT = ROOT / ".artifacts" / "tiny-model"


@dataclass(frozen=True, slots=True)
class Variant:
    """One network shape over the shared tokenizer."""

    version: str  # written to MARKER; bump when the produced files change
    out: Path
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int


VARIANTS = {
    "tiny": Variant(VERSION, DEFAULT_OUT, hidden=128, intermediate=256, layers=2, heads=2, kv_heads=1,
                    head_dim=64, context=4096),
    "ttft": Variant("ttft-qwen2-v1", ROOT / ".artifacts" / "ttft-model", hidden=128, intermediate=256, layers=2,
                    heads=2, kv_heads=1, head_dim=64, context=16384),
}

VOCAB_SIZE = 4096
SEED = 1234
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Reasoning markers: added (single-token) but *not* special, as in Qwen3, so they survive
# detokenisation and vLLM's qwen3/deepseek_r1 reasoning parsers find them in the vocab.
THINK_TOKENS = ["<think>", "</think>"]
EXTRA_ADDED = ["<tool_call>", "</tool_call>"]

# Qwen3-style ChatML template. Tools are rendered into the system turn so they change the
# prompt tokens; enable_thinking=false appends an empty think block to the generation prompt.
CHAT_TEMPLATE = r"""{%- macro text(content) %}
{%- if content is string %}{{- content }}
{%- elif content %}{%- for part in content %}{%- if part.type == 'text' %}{{- part.text }}{%- endif %}{%- endfor %}
{%- endif %}
{%- endmacro %}
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- text(messages[0].content) + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object inside <tool_call></tool_call> tags.<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + text(message.content) + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + text(message.content) }}
{%- if message.tool_calls %}
{%- for tc in message.tool_calls %}
{%- set fn = tc.function if tc.function is defined else tc %}
{{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
{{- fn.arguments if fn.arguments is string else fn.arguments | tojson }}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""

_WORD_TEXT = (
    "the a an of to in for on with cache block token prefix router replica engine model request "
    "prompt reply system user assistant tool budget reasoning image vision think answer fast slow "
    "red green blue data index hash chain event stream queue load cost credit tier memory disk "
    "python code function value list dict string number error retry config proxy key team spend"
)
WORDS = _WORD_TEXT.split()


def synthetic_corpus(rng: random.Random, lines: int) -> list[str]:
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice([".", "?", "!", ""]))
    return out


def stdlib_corpus(limit_bytes: int) -> list[str]:
    """Python stdlib sources, in sorted order so the corpus (and the BPE merges) are stable."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(lib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit_bytes:
            break
    return texts


def build_tokenizer(out: Path, context: int = 4096) -> int:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    rng = random.Random(SEED)
    corpus = synthetic_corpus(rng, 20_000) + stdlib_corpus(3_000_000)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # Save the pre-tokenizer the engine will use. transformers 5 loads this model as Qwen2Tokenizer,
    # which replaces the file's pre-tokenizer with Qwen2's split pattern and adds NFC; writing the same
    # here makes tokenizer.json agree with the engine's /tokenize, so a proxy's local tokenizer passes
    # verification (checked by engine_tokenizer_agrees below).
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS + EXTRA_ADDED])
    tok.save(str(out / "tokenizer.json"))

    added = {}
    for t in SPECIAL_TOKENS + THINK_TOKENS + EXTRA_ADDED:
        tid = tok.token_to_id(t)
        assert tid is not None, t
        added[str(tid)] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": t in SPECIAL_TOKENS,
        }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2)
    )
    return int(tok.get_vocab_size(with_added_tokens=True))


def engine_tokenizer_agrees(out: Path) -> None:
    """Fail the build unless transformers (as the engine loads it) and tokenizer.json give the same ids."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    engine = AutoTokenizer.from_pretrained(str(out))
    local = Tokenizer.from_file(str(out / "tokenizer.json"))
    texts = [
        "What is 2+2?  Explain   with spaces\tand tabs.\n\n12345 67.89",
        "Ünïcödé, emoji 🚀, 中文, e\u0301, and code: def f(x): return x**2\n    it's done",
        "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>\n\n<tool_call>{}</tool_call>",
        *synthetic_corpus(random.Random(SEED + 1), 50),
    ]
    for text in texts:
        want = engine(text, add_special_tokens=False)["input_ids"]
        got = local.encode(text, add_special_tokens=False).ids
        if want != got:
            raise SystemExit(f"tokenizer.json disagrees with transformers' tokenizer on {text[:40]!r}")


def build_model(out: Path, vocab_size: int, eos_id: int, pad_id: int, v: Variant = VARIANTS["tiny"]) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    # Round the embedding table up so the added tokens fit and the size is SIMD friendly.
    padded = (vocab_size + 63) // 64 * 64
    cfg = Qwen2Config(
        vocab_size=padded,
        hidden_size=v.hidden,
        intermediate_size=v.intermediate,
        num_hidden_layers=v.layers,
        num_attention_heads=v.heads,
        num_key_value_heads=v.kv_heads,
        head_dim=v.head_dim,
        max_position_embeddings=v.context,
        tie_word_embeddings=True,
        torch_dtype="float32",
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
    )
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False).save_pretrained(str(out))


def build(out: Path, force: bool = False, variant: str = "tiny") -> Path:
    v = VARIANTS[variant]
    marker = out / MARKER
    if not force and marker.exists() and marker.read_text().strip() == v.version:
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vocab = build_tokenizer(tmp, v.context)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    build_model(tmp, vocab, eos_id=tok.token_to_id("<|im_end|>"), pad_id=tok.token_to_id("<|endoftext|>"), v=v)
    engine_tokenizer_agrees(tmp)
    (tmp / MARKER).write_text(v.version + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="tiny")
    ap.add_argument("--out", type=Path, default=None, help="default: the variant's folder under .artifacts")
    ap.add_argument("--force", action="store_true", help="rebuild even if the version marker matches")
    args = ap.parse_args(argv)
    path = build(args.out or VARIANTS[args.variant].out, args.force, args.variant)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
