"""Counting tokens of text: an exact tokenizer where one is available offline, else an estimate.

Affinity meters prompt prefixes with these; the reasoning handler counts reasoning text with :class:`HFMeter`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from litellm_kv.routing.affinity.options import AffinitySettings


class TokenMeter(Protocol):
    """Counts tokens of a piece of prompt text (an exact tokenizer or an estimate)."""

    name: str

    def count(self, text: str) -> int: ...


@dataclass(slots=True)
class EstimateMeter:
    """``ceil(len(text) / chars_per_token)``: the documented estimate for providers without a tokenizer."""

    chars_per_token: float = 4.0
    name: str = "estimate"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)


class TiktokenMeter:
    """OpenAI's tokenizers through ``tiktoken``, offline from the files LiteLLM ships."""

    def __init__(self, encoding: str) -> None:
        _point_tiktoken_at_litellm_files()
        import tiktoken

        self._enc = tiktoken.get_encoding(encoding)
        self.name = f"tiktoken:{encoding}"

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))


class HFMeter:
    """A Hugging Face ``tokenizer.json`` (``tokenizers`` package); the one Hugging Face counter of the package.

    Special tokens are not added: a piece of prompt or reasoning text is counted as the model reads
    it inside a conversation. Loading raises when the file is missing or unreadable; each caller
    decides what to fall back to.
    """

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))
        self.name = f"hf:{path}"

    @classmethod
    def of_model(cls, path: str | Path) -> HFMeter:
        """The tokenizer at ``path``: a ``tokenizer.json``, or a model directory holding one."""
        p = Path(path)
        return cls(p / "tokenizer.json" if p.is_dir() else p)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids) if text else 0


def _litellm_tokenizer_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


def _point_tiktoken_at_litellm_files() -> None:
    # tiktoken downloads encodings unless TIKTOKEN_CACHE_DIR holds them; LiteLLM ships cl100k/o200k.
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        folder = _litellm_tokenizer_dir()
        if folder is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)


def openai_encoding(model: str) -> str:
    """tiktoken encoding of an OpenAI model name (o200k for 4o/4.1/5/o-series, cl100k for older)."""
    name = model.rsplit("/", 1)[-1].lower()
    if name.startswith(("gpt-4-", "gpt-3.5")) or name == "gpt-4":
        return "cl100k_base"
    return "o200k_base"


_meters: dict[str, TokenMeter] = {}


def make_meter(spec: str, options: AffinitySettings, provider: str, model: str) -> TokenMeter:
    """Resolve ``options.tokenizer`` for a deployment; falls back to the estimate if a tokenizer is missing."""
    if spec == "auto":
        if provider in ("openai", "azure", "azure_ai", "text-completion-openai"):
            spec = f"tiktoken:{openai_encoding(model)}"
        elif provider == "deepseek" and (folder := _litellm_tokenizer_dir()) is not None:
            spec = f"hf:{folder / 'deepseek_tokenizer.json'}"
        else:
            spec = "estimate"
    if spec == "estimate":
        return EstimateMeter(options.chars_per_token)
    meter = _meters.get(spec)
    if meter is None:
        try:
            meter = TiktokenMeter(spec[len("tiktoken:"):]) if spec.startswith("tiktoken:") else HFMeter(spec[3:])
        except Exception:
            return EstimateMeter(options.chars_per_token)
        _meters[spec] = meter
    return meter


class TokenMemo:
    """Token counts of canonical units by digest, so a growing conversation is not recounted."""

    def __init__(self, capacity: int = 50_000) -> None:
        self.capacity = capacity
        self._counts: OrderedDict[tuple[str, bytes], int] = OrderedDict()

    def count(self, meter: TokenMeter, canonical: bytes, text: str) -> int:
        key = (meter.name, hashlib.blake2b(canonical, digest_size=16).digest())
        hit = self._counts.get(key)
        if hit is not None:
            self._counts.move_to_end(key)
            return hit
        n = meter.count(text)
        self._counts[key] = n
        if len(self._counts) > self.capacity:
            self._counts.popitem(last=False)
        return n
