"""Prompt tokens exactly as the engine will see them.

Two ways, both exact when they agree with the engine:

* **engine**: ``POST /tokenize`` on a replica (the engine's own renderer and tokenizer). Always
  right, but one HTTP round trip on the request path.
* **local**: the model's ``tokenizer.json`` (Hugging Face ``tokenizers``) and its chat template
  rendered with Jinja the way ``transformers.apply_chat_template`` renders it. Fast, and cheap for a
  growing conversation: text is split at special tokens (which the tokenizer never merges across)
  and each segment's ids are memoised, so turn N+1 only tokenizes its new messages. Byte-level BPE
  models (GPT-2, Qwen2, Llama 3 families) are encoded through tiktoken's core when it provably gives
  the same ids (``litellm_kv.vllm.bpe``), several times faster than ``tokenizers`` on a cold prompt.

A local tokenizer is trusted only after it matched ``/tokenize`` on sample conversations at
start-up, and it keeps being compared on a sample of live requests; any mismatch switches the group
to the engine path and is reported (``/litellm-kv/health``, metric, log). Never an estimate
presented as exact.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from litellm_kv.errors import ConfigError
from litellm_kv.vllm.bpe import FastBPE, FastBPEUnavailable


class TemplateError(Exception):
    """The chat template raised or could not render this request (caller falls back to the engine)."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # transformers overrides Jinja's tojson (which HTML-escapes) with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _special_text(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping):
        content = entry.get("content")
        return content if isinstance(content, str) else None
    return None


class PromptTooLong(Exception):
    """A rendered prompt provably longer, in tokens, than the engines accept: there is no cache to route it to, and
    tokenizing it would hold the proxy's event loop for nothing (a few megabytes take hundreds of milliseconds)."""


def longest_token_chars(spec: Mapping[str, Any]) -> int:
    """The most characters one token of a ``tokenizer.json`` can stand for: the longest vocabulary entry or added
    token. A byte-level entry has one character per byte, and a byte holds at most one character of text, so a text of
    ``n`` characters has at least ``n / longest`` tokens. 0 when the vocabulary cannot be read."""
    model = spec.get("model")
    vocab = model.get("vocab") if isinstance(model, Mapping) else None
    if isinstance(vocab, Mapping):
        pieces: list[Any] = list(vocab)
    elif isinstance(vocab, list):  # Unigram: [piece, score] pairs
        pieces = [v[0] for v in vocab if isinstance(v, (list, tuple)) and v]
    else:
        return 0
    pieces += [t.get("content") for t in spec.get("added_tokens") or [] if isinstance(t, Mapping)]
    return max((len(p) for p in pieces if isinstance(p, str)), default=0)


class LocalChatTokenizer:
    """Chat template + tokenizer of one model, loaded from a Hugging Face model directory."""

    def __init__(self, model_dir: str | Path, segment_cache_size: int = 8192, content_format: str = "string",
                 fast_bpe: bool = True, segment_cache_tokens: int = 2**21) -> None:
        """``segment_cache_size`` and ``segment_cache_tokens`` bound the segment memo in segments and in token
        ids (about 34 bytes each: a never-seen 8K-token system prompt holds ~280 KB)."""
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        d = Path(model_dir)
        try:
            spec_text = (d / "tokenizer.json").read_text()
            self._tok = Tokenizer.from_str(spec_text)
            cfg = json.loads((d / "tokenizer_config.json").read_text())
        except (OSError, ValueError, Exception) as exc:
            raise ConfigError(f"cannot load tokenizer from {d}: {exc}") from exc
        template = cfg.get("chat_template")
        tmpl_file = d / "chat_template.jinja"
        if template is None and tmpl_file.exists():
            template = tmpl_file.read_text()
        if not isinstance(template, str):
            raise ConfigError(f"{d}: no chat_template (named templates are not supported)")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(template)
        self._specials = {
            name: text for name in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (text := _special_text(cfg.get(name))) is not None
        }
        spec = json.loads(spec_text)
        #: See :func:`longest_token_chars`; bounds how long a prompt can be before it is certainly too long.
        self.max_token_chars = longest_token_chars(spec) if isinstance(spec, Mapping) else 0
        # The fast path (tiktoken's BPE core, litellm_kv.vllm.bpe) when it provably gives the same ids.
        self._fast: FastBPE | None = None
        self.fast_bpe_state = "off (disabled)"
        if fast_bpe:
            try:
                self._fast = FastBPE(spec, reference=self._tok)
                self.fast_bpe_state = "on"
            except FastBPEUnavailable as exc:
                self.fast_bpe_state = f"off ({exc})"
            except Exception as exc:  # a tiktoken build error: the slower path is still exact
                self.fast_bpe_state = f"off ({type(exc).__name__}: {exc})"
        # Added tokens are cut out of the text before encoding (the tokenizer never merges across them):
        # special ones always, and every added token on the fast path, which does not know them.
        decoder = self._tok.get_added_tokens_decoder().values()
        added = [t.content for t in decoder if t.special or self._fast is not None]
        added = sorted(set(added), key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(a) for a in added) + ")") if added else None
        self._special_ids = {a: self._tok.token_to_id(a) for a in added}
        # Values are tuples: the collector untracks a tuple of ints the first time it meets one, unlike a list (a
        # full memo of lists made collections, and so the proxy's p99, slow); and a hit extends the prompt with the
        # memo's own ints (an array of uint32 would take 4 bytes a token but make every hit ~10x slower).
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_size = segment_cache_size
        self._cache_tokens = segment_cache_tokens
        self.memo_tokens = 0  # token ids held by the memo
        self.model_dir = str(d)
        self.content_format = content_format

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        ctx: dict[str, Any] = dict(self._specials)
        ctx.update(chat_template_kwargs or {})
        ctx.update(messages=list(messages), tools=list(tools) if tools else None,
                   add_generation_prompt=add_generation_prompt)
        try:
            return self._template.render(**ctx)
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc

    def _encode_segment(self, text: str, memo: bool = True) -> tuple[int, ...]:
        ids = self.memo_get(text) if memo else None
        if ids is not None:
            return ids
        if self._fast is not None:
            try:
                ids = tuple(self._fast.encode(text))
            except Exception:  # e.g. a lone surrogate tiktoken cannot encode: let tokenizers decide
                ids = tuple(self._tok.encode(text, add_special_tokens=False).ids)
        else:
            ids = tuple(self._tok.encode(text, add_special_tokens=False).ids)
        if memo:
            self.remember(text, ids)
        return ids

    def encode(self, text: str, memo: bool = True) -> list[int]:
        """Token ids of ``text`` without added BOS/EOS (as vLLM tokenizes a rendered chat). ``memo=False`` neither
        reads nor writes the segment memo, which only the event loop's thread may touch: for an encode run in
        another thread."""
        out: list[int] = []
        for piece in self.pieces(text):
            if isinstance(piece, int):
                out.append(piece)
            else:
                out.extend(self._encode_segment(piece, memo))
        return out

    def pieces(self, text: str) -> list[str | int]:
        """``text`` cut at its added tokens: the id of each added token, the text of each segment between them
        (which the tokenizer never merges across, so each encodes on its own)."""
        if self._split is None:
            return [text] if text else []
        out: list[str | int] = []
        for piece in self._split.split(text):
            if piece:
                sid = self._special_ids.get(piece)
                out.append(piece if sid is None else sid)
        return out

    def encode_segment(self, text: str) -> tuple[int, ...]:
        """One segment's ids (no added token in it), without the memo: safe in any thread."""
        return self._encode_segment(text, memo=False)

    def memo_get(self, text: str) -> tuple[int, ...] | None:
        """The memo's ids for a segment, or None (the event loop's thread only)."""
        ids = self._cache.get(text)
        if ids is not None:
            self._cache.move_to_end(text)
        return ids

    def memo_has(self, text: str) -> bool:
        return text in self._cache

    def remember(self, text: str, ids: tuple[int, ...]) -> None:
        """Keep a segment's ids encoded elsewhere in the memo, within its bounds (the event loop's thread only)."""
        if text in self._cache:
            self._cache.move_to_end(text)
            return
        if len(ids) <= self._cache_tokens:
            self._cache[text] = ids
            self.memo_tokens += len(ids)
            while len(self._cache) > self._cache_size or self.memo_tokens > self._cache_tokens:
                self.memo_tokens -= len(self._cache.popitem(last=False)[1])

    def chat_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        content_format: str | None = None,
        max_tokens: int | None = None,
    ) -> list[int]:
        """The prompt's token ids; ``content_format`` overrides the verified one (image requests are rendered
        in the OpenAI form, which is what vLLM gives a template that renders images). Raises
        :class:`PromptTooLong`, before encoding, when the rendered text has more than twice the characters
        ``max_tokens`` tokens can stand for (twice: room for a normaliser that shortens text)."""
        return self.encode(self.render_chat(messages, tools, add_generation_prompt, chat_template_kwargs,
                                            content_format, max_tokens))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        content_format: str | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """The text :meth:`chat_tokens` encodes (rendering is cheap: a few milliseconds for megabytes, where
        encoding them takes hundreds), with the same checks."""
        msgs = normalise_messages(messages, content_format or self.content_format)
        text = self.render(msgs, tools, add_generation_prompt, chat_template_kwargs)
        if max_tokens and self.max_token_chars and len(text) > 2 * self.max_token_chars * max_tokens:
            raise PromptTooLong(f"the prompt has {len(text)} characters: more than {max_tokens} tokens of "
                                f"at most {self.max_token_chars} characters each, twice over")
        return text


def chat_template_kwargs_for(request: Mapping[str, Any]) -> dict[str, Any]:
    """The template kwargs the engine derives for a chat request (vllm-contract.md §6):
    the caller's ``chat_template_kwargs`` plus ``enable_thinking`` from ``reasoning_effort``."""
    kwargs = dict(request.get("chat_template_kwargs") or {})
    effort = request.get("reasoning_effort")
    if effort is not None and "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = effort != "none"
    return kwargs


CONTENT_FORMATS = ("string", "openai")


def normalise_messages(messages: Sequence[Mapping[str, Any]], content_format: str = "string") -> list[dict[str, Any]]:
    """Messages as vLLM hands them to the chat template.

    vLLM inspects the template: one that loops over ``message.content`` gets the OpenAI form (a list of
    parts; a plain string becomes one text part), any other gets strings (text parts joined by newlines).
    Which form a template gets is settled by verification against ``/tokenize``, not guessed.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m.get("content")
        if content_format == "string" and isinstance(content, list):
            texts = [str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
            m = {**m, "content": "\n".join(texts)}
        elif content_format == "openai" and isinstance(content, str):
            m = {**m, "content": [{"type": "text", "text": content}]}
        out.append(dict(m))
    return out


# Sample conversations checked against the engine's /tokenize before a local tokenizer is trusted.
VERIFY_SAMPLES: tuple[dict[str, Any], ...] = (
    {"messages": [{"role": "user", "content": "Hello there! How are you?"}]},
    {"messages": [
        {"role": "system", "content": "You are a careful assistant.\nAnswer briefly."},
        {"role": "user", "content": "What is 2+2?  Explain   with spaces\tand tabs."},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "Ünïcödé, emoji 🚀, 中文, and code: def f(x): return x**2"},
    ]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"}],
     "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]},
)
