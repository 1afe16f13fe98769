"""Byte-level BPE through tiktoken's core: the same ids as a model's ``tokenizer.json``, several times faster.

Hugging Face ``tokenizers`` spends most of a cold encode in its pre-tokenizer regex (Oniguruma) and
in building an ``Encoding`` (offsets, token strings). For the common byte-level BPE family (GPT-2,
Qwen2, Llama 3 and their derivatives) tiktoken's engine computes the same ids from the same vocabulary
and split pattern much faster, and a cold encode is most of a never-seen prompt's routing decision
(figures in docs/performance.md).

Two BPE algorithms only agree when the model is built the way tiktoken works, so this module is
strict about when it accepts a model, and checks itself:

* **Shape** (read from ``tokenizer.json``): a ``BPE`` model without byte fallback, dropout, unknown
  token or subword affixes; all 256 byte tokens present; merges ordered as the ranks of the tokens
  they make (tiktoken merges by rank); normalizer none or NFC (applied here); pre-tokenizer byte-level
  with one of :data:`KNOWN_PATTERNS` (patterns that match every character, so no text is dropped);
  added tokens without strip or single-word rules (the caller splits them out of the text first).
* **Self-check**: at load, :data:`SELF_CHECK_TEXTS` and a seeded sample of the vocabulary's own
  pieces are encoded both ways; one difference and the model is refused (reason given).

Anything refused uses ``tokenizers`` as before. Either way the chat tokenizer above this module is
still verified against the engine's ``/tokenize`` at start-up and on sampled live requests.
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

# Pre-tokenizer split patterns whose alternatives together match every character.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
KNOWN_PATTERNS = {"gpt2": GPT2_PATTERN, "qwen2": QWEN2_PATTERN, "llama3": LLAMA3_PATTERN}

SELF_CHECK_TEXTS = (
    "Hello there! How are you?",
    "What is 2+2?  Explain   with spaces\tand tabs.\n\n\nNew paragraph\r\nwindows line 12345 67.89",
    "Ünïcödé, emoji 🚀🚀, 中文文本, Ελληνικά, русский, عربى, e\u0301 (combining), ﬁ ligature",
    "def f(x):\n    return x**2  # it's, we'll, they're, I'M, you'VE\n\t\tindented\n",
    "   leading and trailing   \n \n  \t\n",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} [1, 2, 3] <tag attr="v"/>',
)


class FastBPEUnavailable(Exception):
    """This model cannot be encoded by the fast path with certainty (the message says why)."""


def _bytes_to_unicode() -> dict[int, str]:
    # The GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to code points >= 256.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in _bytes_to_unicode().items()}


def _pattern(pre: Any) -> str:
    if not isinstance(pre, Mapping):
        raise FastBPEUnavailable("no pre-tokenizer")
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            raise FastBPEUnavailable("ByteLevel pre-tokenizer with add_prefix_space or without its regex")
        return GPT2_PATTERN
    if kind == "Sequence":
        parts = pre.get("pretokenizers") or []
        if len(parts) == 2 and parts[0].get("type") == "Split" and parts[1].get("type") == "ByteLevel":
            split, level = parts
            regex = (split.get("pattern") or {}).get("Regex")
            if split.get("behavior") != "Isolated" or split.get("invert"):
                raise FastBPEUnavailable("Split pre-tokenizer is not 'Isolated'")
            if level.get("add_prefix_space") or level.get("use_regex"):
                raise FastBPEUnavailable("ByteLevel after Split must not add a prefix space or split again")
            if regex in KNOWN_PATTERNS.values():
                return str(regex)
            raise FastBPEUnavailable("split pattern is not one of the known byte-level patterns")
    raise FastBPEUnavailable(f"pre-tokenizer {kind!r} is not byte-level BPE")


def _normalizer(norm: Any) -> bool:
    """True when NFC must be applied; raises for anything else but none."""
    if norm is None:
        return False
    if isinstance(norm, Mapping):
        if norm.get("type") == "NFC":
            return True
        if norm.get("type") == "Sequence" and not norm.get("normalizers"):
            return False
    raise FastBPEUnavailable(f"normalizer {norm!r} is not supported")


class FastBPE:
    """Ids of plain text (no added tokens in it) for one byte-level BPE ``tokenizer.json``."""

    def __init__(self, spec: Mapping[str, Any], reference: Any = None, sample_seed: int = 0) -> None:
        """``spec``: the parsed ``tokenizer.json``. ``reference``: its ``tokenizers.Tokenizer``, for
        the self-check (skipped when None; callers that encode for real always pass it)."""
        import tiktoken

        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise FastBPEUnavailable(f"model type {model.get('type')!r} is not BPE")
        for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise FastBPEUnavailable(f"BPE {key}={model.get(key)!r}")
        if model.get("byte_fallback"):
            raise FastBPEUnavailable("BPE byte_fallback")
        self.nfc = _normalizer(spec.get("normalizer"))
        pattern = _pattern(spec.get("pre_tokenizer"))
        for tok in spec.get("added_tokens") or []:
            if tok.get("lstrip") or tok.get("rstrip") or tok.get("single_word"):
                raise FastBPEUnavailable(f"added token {tok.get('content')!r} has strip/single-word rules")
        vocab: Mapping[str, int] = model.get("vocab") or {}
        added = [str(t.get("content")) for t in spec.get("added_tokens") or []]
        to_byte = _unicode_to_bytes()
        ranks: dict[bytes, int] = {}
        try:
            for piece, rank in vocab.items():
                # Added tokens are cut out of the text by the caller; tokenizers' BPE has no merge that
                # makes them, so tiktoken (which merges any pair whose join has a rank) must not know them.
                if piece in added and len(piece) > 1:
                    continue
                ranks[bytes(to_byte[c] for c in piece)] = int(rank)
        except KeyError as exc:
            raise FastBPEUnavailable(f"vocabulary piece outside the byte-level alphabet: {exc}") from exc
        if any(bytes([b]) not in ranks for b in range(256)):
            raise FastBPEUnavailable("not every byte has a token")
        if len(set(ranks.values())) != len(ranks):
            raise FastBPEUnavailable("two vocabulary pieces share an id")
        previous = -1
        for merge in model.get("merges") or []:
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            made = vocab.get(left + right)
            if made is None or made < previous:
                raise FastBPEUnavailable("merges are not ordered by the ranks of the tokens they make")
            previous = made
        self._enc = tiktoken.Encoding("litellm-kv-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        self.pattern = pattern
        if reference is not None:
            self._self_check(reference, [p for p in vocab if p not in added], added, sample_seed)

    def encode(self, text: str) -> list[int]:
        if self.nfc and not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        return self._enc.encode_ordinary(text)

    def _self_check(self, reference: Any, pieces: Sequence[str], added: Sequence[str], seed: int) -> None:
        rng = random.Random(seed)
        from_unicode = _unicode_to_bytes()
        samples = list(SELF_CHECK_TEXTS)
        # Runs of the vocabulary's own pieces glued together: the inputs where two BPE orders could differ.
        for _ in range(64):
            raw = b"".join(bytes(from_unicode[c] for c in rng.choice(pieces)) for _ in range(rng.randint(4, 64)))
            samples.append(raw.decode("utf-8", "replace"))
        for text in samples:
            if any(a in text for a in added):
                continue  # the caller splits added tokens out before encoding
            want = reference.encode(text, add_special_tokens=False).ids
            if self.encode(text) != want:
                raise FastBPEUnavailable(f"self-check differs from tokenizers on {text[:40]!r}")
