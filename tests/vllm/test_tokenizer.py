"""The local chat tokenizer and its fast BPE path (litellm_kv.vllm.bpe).

Differential tests: the fast path must give exactly the ids of Hugging Face ``tokenizers`` (which the
engine uses) for every pre-tokenizer family it accepts, and refuse every shape it cannot prove.
The last test compares the whole local pipeline with a real vLLM engine's ``/tokenize``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from litellm_kv.vllm.bpe import KNOWN_PATTERNS, FastBPE, FastBPEUnavailable
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.tokenization import VERIFY_SAMPLES, LocalChatTokenizer, PromptTooLong, longest_token_chars


def _spec(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "tokenizer.json").read_text())


def _with_pattern(spec: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    if name == "gpt2":
        out["normalizer"] = None
        out["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                "use_regex": True}
    else:
        out["normalizer"] = {"type": "NFC"}
        out["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": KNOWN_PATTERNS[name]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]}
    return out


def _fuzz_texts(reference: Tokenizer, spec: dict[str, Any], n: int, seed: int) -> list[str]:
    """Runs of vocabulary pieces as text (where two BPE merge orders could differ), random bytes, and
    odd whitespace, digits, contractions and combining marks (where pre-tokenizer patterns differ)."""
    rng = random.Random(seed)
    added = {t["content"] for t in spec.get("added_tokens", [])}
    ids = [i for p, i in spec["model"]["vocab"].items() if p not in added]
    alphabet = " \t\n\r\u00a0\u3000'sStTlLdD0123456789aé中🚀.,!?-_(){}[]\"\\/\u0301"
    texts = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            texts.append(reference.decode([rng.choice(ids) for _ in range(rng.randint(1, 120))],
                                          skip_special_tokens=False))
        elif kind == 1:
            texts.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))).decode("utf-8", "replace"))
        else:
            texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200))))
    return [t for t in texts if not any(a in t for a in added)]


@pytest.mark.parametrize("pattern", sorted(KNOWN_PATTERNS))
def test_fast_bpe_equals_tokenizers(engine_model: Path, pattern: str) -> None:
    spec = _with_pattern(_spec(engine_model), pattern)
    reference = Tokenizer.from_str(json.dumps(spec))
    fast = FastBPE(spec, reference=reference)
    texts = _fuzz_texts(reference, spec, 3000, seed=len(pattern))
    assert len(texts) > 2500
    differing = [t for t in texts if fast.encode(t) != reference.encode(t, add_special_tokens=False).ids]
    assert not differing, f"{len(differing)} of {len(texts)} texts differ, first {differing[0]!r}"


def _refused(spec: dict[str, Any], reference: Any = None) -> str:
    with pytest.raises(FastBPEUnavailable) as err:
        FastBPE(spec, reference=reference)
    return str(err.value)


def test_fast_bpe_refuses_shapes_it_cannot_prove(engine_model: Path) -> None:
    base = _spec(engine_model)

    s = copy.deepcopy(base)
    s["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|\s+"  # not known to cover all text
    assert "known" in _refused(s)

    s = copy.deepcopy(base)
    s["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    assert "Metaspace" in _refused(s)

    s = copy.deepcopy(base)
    s["model"]["byte_fallback"] = True
    assert "byte_fallback" in _refused(s)

    s = copy.deepcopy(base)
    s["model"]["type"] = "WordPiece"
    assert "not BPE" in _refused(s)

    s = copy.deepcopy(base)
    s["normalizer"] = {"type": "Lowercase"}
    assert "normalizer" in _refused(s)

    s = copy.deepcopy(base)
    s["model"]["merges"] = list(reversed(s["model"]["merges"]))
    assert "ordered" in _refused(s)

    s = copy.deepcopy(base)
    s["added_tokens"][0]["lstrip"] = True
    assert "strip" in _refused(s)

    s = copy.deepcopy(base)
    s["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}
    assert "prefix" in _refused(s)


def test_self_check_refuses_a_reference_that_disagrees(engine_model: Path) -> None:
    spec = _spec(engine_model)
    # The reference splits with GPT-2's pattern while the spec says Qwen2's: digits and whitespace runs
    # tokenize differently, and the self-check must notice.
    other = _with_pattern(spec, "gpt2")
    msg = _refused(spec, reference=Tokenizer.from_str(json.dumps(other)))
    assert "self-check" in msg


def test_local_tokenizer_reports_why_fast_path_is_off(engine_model: Path, tmp_path: Path) -> None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(engine_model / name, tmp_path / name)
    spec = _spec(engine_model)
    spec["model"]["merges"] = list(reversed(spec["model"]["merges"]))
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    slow = LocalChatTokenizer(tmp_path)
    assert slow.fast_bpe_state.startswith("off (") and "ordered" in slow.fast_bpe_state
    assert LocalChatTokenizer(engine_model, fast_bpe=False).fast_bpe_state == "off (disabled)"
    assert LocalChatTokenizer(engine_model).fast_bpe_state == "on"


def test_segment_memo_is_bounded_in_tokens(engine_model: Path) -> None:
    """The memo keeps a conversation's segments so its next turn tokenizes only new text, but never more
    token ids than its bound (a bound in segments alone let never-seen 8K-token prompts grow it to gigabytes);
    the least recently used go first, and the ids are the same with or without the memo."""
    rng = random.Random(3)
    texts = [" ".join(f"w{rng.randrange(10**6)}" for _ in range(150)) for _ in range(12)]
    plain = LocalChatTokenizer(engine_model, segment_cache_tokens=0)
    sizes = [len(plain.encode(t)) for t in texts]
    assert plain.memo_tokens == 0 and min(sizes) > 300
    bound = 3 * max(sizes)
    tok = LocalChatTokenizer(engine_model, segment_cache_tokens=bound)
    for t in texts:
        assert tok.encode(t) == plain.encode(t)
        tok.encode(texts[0])  # kept warm: the least recently used others go first
        assert tok.memo_tokens <= bound
        assert tok.memo_tokens == sum(len(ids) for ids in tok._cache.values())
    assert texts[0] in tok._cache and texts[1] not in tok._cache and texts[-1] in tok._cache
    huge = " ".join(texts[:4])  # longer than the whole bound: tokenized, not kept
    assert tok.encode(huge) == plain.encode(huge) and huge not in tok._cache


def test_longest_token_bounds_the_characters_of_every_token(engine_model: Path) -> None:
    """Each token of the test model stands for at most ``max_token_chars`` characters of text, so a text of n
    characters has at least n / max_token_chars tokens (what a prompt too long for the engine is told by)."""
    tok = LocalChatTokenizer(engine_model)
    spec = _spec(engine_model)
    assert tok.max_token_chars == longest_token_chars(spec) > 1
    reference = Tokenizer.from_str(json.dumps(spec))
    texts = [" " * 300, "#" * 500, "\n" + " " * 90, *_fuzz_texts(reference, spec, 60, seed=9)]
    for text in texts:
        ids = tok.encode(text)
        assert len(ids) * tok.max_token_chars >= len(text), text[:40]
    assert longest_token_chars({"model": {"vocab": [["▁hello", -1.0], ["x", -2.0]]}}) == 6  # Unigram pairs
    assert longest_token_chars({"model": {"type": "WordLevel"}}) == 0  # no vocabulary read: no bound


def test_a_prompt_longer_than_any_engine_accepts_is_refused_before_it_is_encoded(engine_model: Path) -> None:
    """``max_tokens`` (the engines' ``max_model_len``): a rendered prompt with more than twice the characters that
    many tokens can stand for raises :class:`PromptTooLong` without being encoded; shorter ones are encoded as
    before, and ``memo=False`` (an encode in a worker thread) gives the same ids without touching the memo."""
    tok = LocalChatTokenizer(engine_model)
    long_text = "routing cache " * (tok.max_token_chars * 20)
    msgs = [{"role": "user", "content": long_text}]
    with pytest.raises(PromptTooLong):
        tok.chat_tokens(msgs, max_tokens=10)
    assert tok.memo_tokens == 0  # refused before encoding
    ids = tok.chat_tokens(msgs, max_tokens=10**6)
    assert ids == tok.chat_tokens(msgs)
    fresh = LocalChatTokenizer(engine_model)
    assert fresh.encode(tok.render_chat(msgs), memo=False) == ids and fresh.memo_tokens == 0


def _conversations() -> list[dict[str, Any]]:
    rng = random.Random(11)
    words = ["cache", "block", "Prefix", "router's", "2048", "x**2", "\t", "  ", "\n\n", "émigré", "中文", "🚀",
             "<think>", "</think>", "<tool_call>", "def", "(x):", "—", "it'LL", "3.14159"]
    convs: list[dict[str, Any]] = [dict(s) for s in VERIFY_SAMPLES]
    for i in range(40):
        msgs = [{"role": "system", "content": " ".join(rng.choice(words) for _ in range(rng.randint(5, 300)))}]
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": "".join(rng.choice(words) + rng.choice(" \n\t") for _ in
                                                             range(rng.randint(1, 60)))})
            msgs.append({"role": "assistant", "content": " ".join(rng.choice(words) for _ in range(20))})
        msgs.pop()
        conv: dict[str, Any] = {"messages": msgs}
        if i % 5 == 0:
            conv["tools"] = VERIFY_SAMPLES[2]["tools"]
        convs.append(conv)
    return convs


def test_local_tokenizer_equals_engine_tokenize(engines: list[Any], engine_model: Path) -> None:
    """Real vLLM engine: the local pipeline (template, added tokens, fast BPE, memo) gives /tokenize's ids.

    Also proves the test model's tokenizer.json is the one the engine uses (tools/engine/build_model.py),
    so the proxies in the other tests run the fast local path, not the engine fallback."""
    fast = LocalChatTokenizer(engine_model)
    slow = LocalChatTokenizer(engine_model, fast_bpe=False)
    assert fast.fast_bpe_state == "on"
    convs = _conversations()

    async def engine_ids() -> list[list[int]]:
        client = EngineClient(engines[0].url)
        try:
            return [list(await client.tokenize_chat(c["messages"], tools=c.get("tools"))) for c in convs]
        finally:
            await client.aclose()

    wanted = asyncio.run(engine_ids())
    for conv, want in zip(convs, wanted, strict=True):
        assert fast.chat_tokens(conv["messages"], conv.get("tools")) == want
        assert slow.chat_tokens(conv["messages"], conv.get("tools")) == want
    # the memo: asked again (segments now cached), still the same ids
    assert [fast.chat_tokens(c["messages"], c.get("tools")) for c in convs] == wanted
