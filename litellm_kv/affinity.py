"""Prompt-cache affinity: send a conversation back to the deployment whose prompt cache holds it.

For deployments that publish no KV events (OpenAI, Anthropic, Bedrock, Azure, a vLLM without
events) the only lever is to remember which deployment served a prefix. This module is the domain
part of that, with no LiteLLM import:

* :func:`conversation_prefixes` turns a chat request into chained digests, one per prefix
  boundary (tools, each message, each ``cache_control``-marked block), each with its token count.
  Turn N+1 of a conversation repeats turn N's whole prompt, so the digest of turn N's prompt is one
  of turn N+1's boundaries: no client cooperation is needed, and ``cache_control`` markers are
  stripped before hashing so moving them (automatic injection marks the last message) changes no key.
* :class:`CacheProfile` and :class:`TokenMeter` say which boundaries the provider would actually
  cache (minimum prompt length, increments); shorter prefixes create no pins.
* :class:`PinStore` (in-process :class:`MemoryPinStore`, shared :class:`RedisPinStore`) resolves a
  request atomically: follow the longest live pin, else claim every boundary for a proposed
  deployment *before* the call, so a burst of identical new prefixes lands on one deployment.
* :class:`LoadTracker` counts in-flight attempts per deployment and remembers recent failures.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import random
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NewType, Protocol

from litellm_kv.config import doc

# A chained digest of a prompt prefix (hex); the name keeps it apart from deployment ids.
PrefixDigest = NewType("PrefixDigest", str)
DeploymentId = NewType("DeploymentId", str)

Clock = Callable[[], float]
KEY_VERSION = b"litellm-kv-affinity/v1"


# -- options -------------------------------------------------------------------------------------
@dataclass(slots=True)
class AffinityOptions:
    """Options of ``litellm_kv.model_groups.<group>.affinity`` (groups with ``routing: affinity``)."""

    ttl_seconds: float = doc(
        "Inactivity TTL of a pin: how long a deployment keeps a conversation after its last request. "
        "Match the provider's cache lifetime (OpenAI and Anthropic default to 5 minutes). A deployment "
        "overrides it with model_info.affinity_ttl_seconds; a request's cache_control.ttl ('5m', '1h') or "
        "OpenAI prompt_cache_retention ('24h') overrides both. Every hit refreshes the TTL.",
        default=300.0,
    )
    follow_request_ttl: bool = doc(
        "Take the pin TTL from the request's cache_control.ttl / prompt_cache_retention when present.",
        default=True,
    )
    min_prompt_tokens: int | None = doc(
        "Shortest prefix the provider caches, in tokens; shorter prefixes create no pins. None: the "
        "provider's documented minimum (OpenAI/Azure 1024, Anthropic 1024, DeepSeek 64, Gemini 1024, "
        "hosted_vllm 16, others 1024).",
        default=None,
    )
    cache_increment_tokens: int | None = doc(
        "Granularity of the provider's cache above the minimum (OpenAI: 128). Used for the cached-token "
        "estimate of a pin. None: the provider's default.",
        default=None,
    )
    tokenizer: str = doc(
        "How prompt tokens are counted: 'auto' (tiktoken for OpenAI/Azure models, the DeepSeek tokenizer "
        "LiteLLM ships for deepseek, else the estimate), 'tiktoken:<encoding>', 'hf:<path to "
        "tokenizer.json>', or 'estimate' (characters / chars_per_token).",
        default="auto",
    )
    chars_per_token: float = doc(
        "Characters per token of the 'estimate' tokenizer (about 4 for English text on BPE tokenizers).",
        default=4.0,
    )
    follow_shared_prefix: bool = doc(
        "New conversations follow the pin of a prefix they share with others (tools + system prompt), "
        "so a common system prompt is cached once. False: only conversation-specific prefixes (up to "
        "and including the first non-system message) are pinned and new conversations spread by load.",
        default=True,
    )
    max_in_flight: int | None = doc(
        "Load cap: a pinned deployment with this many requests in flight from this proxy is bypassed "
        "(the pin stays). A deployment overrides it with model_info.affinity_max_in_flight. None: no cap.",
        default=None,
    )
    max_imbalance: int | None = doc(
        "Bypass the pinned deployment when its in-flight count exceeds the least-loaded healthy "
        "deployment's by more than this. None: off.",
        default=None,
    )
    avoid_failed_seconds: float = doc(
        "After a deployment fails a request (5xx, 408, 429, timeout, connection error), pins to it are "
        "moved for this long, and new pins avoid it.",
        default=30.0,
    )
    max_keys: int = doc(
        "Most prefix boundaries probed and refreshed per request (the longest ones; the shared prefix "
        "is always kept).",
        default=48,
    )
    store: Literal["auto", "memory", "redis"] = doc(
        "Where pins live: 'memory' (this process), 'redis' (shared by every proxy), 'auto' (redis when "
        "litellm_kv.mode is 'shared' or a redis_url is configured).",
        default="auto",
    )
    key_prefix: str = doc("Prefix of the Redis keys of pins.", default="litellm_kv:affinity")
    memory_max_pins: int = doc(
        "Capacity of the in-process store; the least recently used pins go first.", default=200_000
    )
    redis_timeout_seconds: float = doc(
        "Socket timeout of Redis calls; on timeout the request is routed by LiteLLM alone.", default=0.25
    )

    def validate(self) -> None:
        if self.ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        if self.chars_per_token <= 0:
            raise ValueError("chars_per_token must be positive")
        if self.max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        if self.tokenizer not in ("auto", "estimate") and not self.tokenizer.startswith(("tiktoken:", "hf:")):
            raise ValueError(f"tokenizer {self.tokenizer!r}: use auto, estimate, tiktoken:<enc> or hf:<path>")


# -- what the provider caches -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CacheProfile:
    """A provider's prompt cache: the shortest cached prefix and the step above it, in tokens."""

    min_tokens: int
    increment: int = 1

    def cacheable(self, tokens: int) -> int:
        """Tokens of a ``tokens``-long prefix the provider would cache (0 below the minimum)."""
        if tokens < self.min_tokens:
            return 0
        step = max(1, self.increment)
        return self.min_tokens + (tokens - self.min_tokens) // step * step


# provider -> (min tokens, increment). Sources: OpenAI prompt-caching guide (1024, then 128-token
# steps), Anthropic (1024 for Sonnet/Opus; cache at marked breakpoints), DeepSeek (64-token units),
# Gemini implicit caching (1024 for Flash), vLLM prefix caching (one 16-token block).
_PROVIDER_PROFILES: dict[str, CacheProfile] = {
    "openai": CacheProfile(1024, 128),
    "azure": CacheProfile(1024, 128),
    "azure_ai": CacheProfile(1024, 128),
    "text-completion-openai": CacheProfile(1024, 128),
    "anthropic": CacheProfile(1024, 1),
    "bedrock": CacheProfile(1024, 1),
    "vertex_ai": CacheProfile(1024, 1),
    "gemini": CacheProfile(1024, 1),
    "deepseek": CacheProfile(64, 64),
    "hosted_vllm": CacheProfile(16, 16),
}
_DEFAULT_PROFILE = CacheProfile(1024, 1)


def provider_of(litellm_params: Mapping[str, Any]) -> str:
    """The provider of a deployment: ``custom_llm_provider``, else the prefix of ``model``."""
    explicit = litellm_params.get("custom_llm_provider")
    if isinstance(explicit, str) and explicit:
        return explicit
    model = str(litellm_params.get("model") or "")
    return model.split("/", 1)[0] if "/" in model else "openai"


def profile_for(provider: str, options: AffinityOptions) -> CacheProfile:
    base = _PROVIDER_PROFILES.get(provider, _DEFAULT_PROFILE)
    return CacheProfile(
        min_tokens=base.min_tokens if options.min_prompt_tokens is None else options.min_prompt_tokens,
        increment=base.increment if options.cache_increment_tokens is None else options.cache_increment_tokens,
    )


# -- counting tokens ----------------------------------------------------------------------------
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
    """A Hugging Face ``tokenizer.json`` (``tokenizers`` package)."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(path)
        self.name = f"hf:{path}"

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


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


def make_meter(spec: str, options: AffinityOptions, provider: str, model: str) -> TokenMeter:
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


# -- conversation keys --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Prefix:
    """One prefix boundary of a request: its chained digest and the prompt tokens up to it."""

    digest: PrefixDigest
    tokens: int
    shared: bool  # True while the prefix holds only tools and system prompt (shared across conversations)


# Overhead tokens per message (role markers and separators), as OpenAI's chat format adds about 4.
_MESSAGE_OVERHEAD = 4
_IMAGE_TOKENS = 85  # OpenAI's low-detail base cost: a floor for an image we do not decode


def _strip_marks(value: Any) -> Any:
    """``value`` without ``cache_control`` anywhere: markers must not change a key."""
    if isinstance(value, Mapping):
        return {k: _strip_marks(v) for k, v in value.items() if k != "cache_control" and v is not None}
    if isinstance(value, list | tuple):
        return [_strip_marks(v) for v in value]
    return value


def _parts(content: Any) -> list[Any]:
    # A string and a one-text-block list are the same prompt to the provider.
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return list(content)
    return [content]


def _is_marked(part: Any) -> bool:
    return isinstance(part, Mapping) and isinstance(part.get("cache_control"), Mapping)


def _message_unit(message: Mapping[str, Any], parts: list[Any]) -> tuple[bytes, str, int]:
    """Canonical bytes, countable text and non-text token floor of a message (with ``parts`` as content)."""
    tool_calls = [
        [tc.get("id"), (tc.get("function") or {}).get("name"), (tc.get("function") or {}).get("arguments")]
        for tc in message.get("tool_calls") or []
        if isinstance(tc, Mapping)
    ]
    clean_parts = _strip_marks(parts)
    canonical = json.dumps(
        [message.get("role"), clean_parts, tool_calls, message.get("tool_call_id"), message.get("name")],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    ).encode()
    texts: list[str] = []
    extra = _MESSAGE_OVERHEAD
    for part in clean_parts:
        if isinstance(part, Mapping) and part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        elif isinstance(part, Mapping) and part.get("type") in ("image_url", "image", "input_image"):
            extra += _IMAGE_TOKENS
        else:
            texts.append(json.dumps(part, sort_keys=True, default=str))
    for call in tool_calls:
        texts.append(f"{call[1]} {call[2]}")
    return canonical, "\n".join(texts), extra


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


def _chain(previous: bytes, unit: bytes) -> bytes:
    return hashlib.blake2b(previous + hashlib.blake2b(unit, digest_size=32).digest(), digest_size=16).digest()


def conversation_prefixes(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None,
    *,
    namespace: str,
    meter: TokenMeter,
    memo: TokenMemo | None = None,
) -> list[Prefix]:
    """Every prefix boundary of a chat request, shortest first.

    Boundaries: after the tools, after each message, and inside a message after each block that
    carries ``cache_control`` (a marker refines the keys, it is never needed). ``namespace`` (model
    group, ``prompt_cache_key``) seeds the chain so unrelated groups never share pins.
    """
    memo = memo or TokenMemo()
    out: list[Prefix] = []
    state = _chain(KEY_VERSION, namespace.encode())
    tokens = 0
    shared = True
    if tools:
        canonical = json.dumps(_strip_marks(list(tools)), sort_keys=True, separators=(",", ":"), default=str).encode()
        tokens += memo.count(meter, canonical, canonical.decode())
        state = _chain(state, b"tools:" + canonical)
        out.append(Prefix(PrefixDigest(state.hex()), tokens, shared))
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        if message.get("role") not in ("system", "developer"):
            shared = False
        parts = _parts(message.get("content"))
        # Marked blocks before the last one of a message are boundaries of their own.
        for j, part in enumerate(parts[:-1]):
            if _is_marked(part):
                canonical, text, extra = _message_unit(message, parts[: j + 1])
                partial = _chain(state, b"partial:" + canonical)
                n = memo.count(meter, canonical, text) + extra
                out.append(Prefix(PrefixDigest(partial.hex()), tokens + n, shared))
        canonical, text, extra = _message_unit(message, parts)
        tokens += memo.count(meter, canonical, text) + extra
        state = _chain(state, b"message:" + canonical)
        out.append(Prefix(PrefixDigest(state.hex()), tokens, shared))
    return out


def select_keys(prefixes: Sequence[Prefix], profile: CacheProfile, options: AffinityOptions) -> list[Prefix]:
    """The boundaries worth a pin, longest first: cacheable by the provider, at most ``max_keys``."""
    usable = [p for p in prefixes if profile.cacheable(p.tokens) > 0]
    if not options.follow_shared_prefix:
        usable = [p for p in usable if not p.shared]
    usable.reverse()
    if len(usable) <= options.max_keys:
        return usable
    kept = usable[: options.max_keys - 1]
    shared = [p for p in usable[options.max_keys - 1 :] if p.shared]
    return kept + (shared[-1:] if shared else usable[-1:])


_TTL_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_TTL_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_ttl(value: Any) -> float | None:
    """Seconds of a cache TTL such as ``"5m"``, ``"1h"``, ``"24h"`` or ``300``; None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    if not isinstance(value, str):
        return None
    m = _TTL_RE.match(value)
    if m is None:
        return None
    seconds = float(m.group(1)) * _TTL_UNIT[m.group(2)]
    return seconds if seconds > 0 else None


def _marks(value: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        cc = value.get("cache_control")
        if isinstance(cc, Mapping):
            yield cc
        for k, v in value.items():
            if k != "cache_control":
                yield from _marks(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _marks(v)


def request_ttl(messages: Sequence[Any] | None, tools: Sequence[Any] | None, retention: Any = None) -> float | None:
    """The longest cache TTL a request asks the provider for (``cache_control.ttl``, ``prompt_cache_retention``).

    A marker without ``ttl`` means the provider default (5 minutes for Anthropic).
    """
    ttls = [parse_ttl(cc.get("ttl", "5m")) for cc in _marks([tools or [], messages or []])]
    if retention is not None:
        ttls.append(parse_ttl(retention))
    known = [t for t in ttls if t is not None]
    return max(known) if known else None


# -- load ---------------------------------------------------------------------------------------
class LoadTracker:
    """In-flight attempts per deployment (this process) and the time each deployment last failed."""

    def __init__(self, clock: Clock = time.monotonic, stale_after: float = 900.0) -> None:
        self.clock = clock
        self.stale_after = stale_after
        self._attempts: dict[str, tuple[DeploymentId, float]] = {}
        self._in_flight: dict[DeploymentId, int] = {}
        self._failed_at: dict[DeploymentId, float] = {}

    def start(self, attempt: str, deployment: DeploymentId) -> None:
        self.finish(attempt)
        self._attempts[attempt] = (deployment, self.clock())
        self._in_flight[deployment] = self._in_flight.get(deployment, 0) + 1
        if len(self._attempts) % 256 == 0:
            self._sweep()

    def finish(self, attempt: str) -> DeploymentId | None:
        entry = self._attempts.pop(attempt, None)
        if entry is None:
            return None
        dep = entry[0]
        self._in_flight[dep] = max(0, self._in_flight.get(dep, 0) - 1)
        return dep

    def _sweep(self) -> None:
        # An attempt whose end we never saw (a hook LiteLLM skipped) must not count forever.
        cutoff = self.clock() - self.stale_after
        for attempt in [a for a, (_, t) in self._attempts.items() if t < cutoff]:
            self.finish(attempt)

    def in_flight(self, deployment: DeploymentId) -> int:
        return self._in_flight.get(deployment, 0)

    def failed(self, deployment: DeploymentId) -> None:
        self._failed_at[deployment] = self.clock()

    def recently_failed(self, deployment: DeploymentId, window: float) -> bool:
        t = self._failed_at.get(deployment)
        return t is not None and self.clock() - t < window


# -- pins ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Candidates:
    """What the store may choose from for one request.

    ``ttl_ms``: every deployment that may serve the request, with the pin TTL it would get.
    ``busy``: deployments over their load cap (a pin to them is bypassed, not moved).
    ``failed``: deployments that failed this request or recently (a pin to them is moved).
    ``proposal``: the deployment to claim when no live pin exists.
    """

    ttl_ms: Mapping[str, int]
    proposal: str
    busy: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()


Outcome = Literal["hit", "new", "repin", "overloaded"]
_OUTCOMES: dict[str, Outcome] = {"hit": "hit", "new": "new", "repin": "repin", "overloaded": "overloaded"}


@dataclass(frozen=True, slots=True)
class Resolution:
    """The store's answer: the deployment to use and why.

    ``stale``: for a re-pin, why the old pin was moved ('failed' or 'unhealthy'). ``hit_index``: the
    position (0 = longest) of the key that was followed, -1 when none.
    """

    deployment: str
    outcome: Outcome
    hit_index: int = -1
    stale: str = ""


class PinStore(Protocol):
    """Pins of prefix keys to deployments, resolved and claimed in one atomic step."""

    async def resolve(self, keys: Sequence[str], candidates: Candidates) -> Resolution: ...

    async def get(self, key: str) -> str | None: ...

    async def close(self) -> None: ...


def _plan(values: Sequence[str | None], c: Candidates) -> tuple[Resolution, list[tuple[int, str]]]:
    """The resolve algorithm shared by both stores: the answer and the writes (index, 'set'|'touch')."""
    stale = ""
    hit = -1
    for i, v in enumerate(values):
        if v is None:
            continue
        if v in c.ttl_ms and v not in c.failed:
            if v in c.busy:
                return Resolution(c.proposal, "overloaded", i), []
            hit = i
            break
        if not stale:
            stale = "failed" if v in c.failed else "unhealthy"
    if hit >= 0:
        winner = values[hit]
        assert winner is not None
        res = Resolution(winner, "hit", hit, "")
    else:
        winner = c.proposal
        res = Resolution(winner, "repin" if stale else "new", -1, stale)
    writes: list[tuple[int, str]] = []
    for i, v in enumerate(values):
        if hit < 0 or i < hit:
            writes.append((i, "set"))  # missing or stale: claim for the winner
        elif i == hit or v == winner:
            writes.append((i, "touch"))  # inactivity TTL: every hit refreshes
        elif v is None or v not in c.ttl_ms or v in c.failed:
            writes.append((i, "set"))
        # a shorter prefix pinned to another live deployment keeps its pin
    return res, writes


class MemoryPinStore:
    """Pins in this process. ``resolve`` has no await inside, so it is atomic under asyncio."""

    def __init__(self, clock: Clock = time.monotonic, capacity: int = 200_000) -> None:
        self.clock = clock
        self.capacity = capacity
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def _live(self, key: str, now: float) -> str | None:
        entry = self._pins.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._pins[key]
            return None
        return entry[0]

    async def resolve(self, keys: Sequence[str], candidates: Candidates) -> Resolution:
        now = self.clock()
        values = [self._live(k, now) for k in keys]
        res, writes = _plan(values, candidates)
        ttl = candidates.ttl_ms[res.deployment] / 1000.0 if res.outcome != "overloaded" else 0.0
        for i, _op in writes:
            self._pins[keys[i]] = (res.deployment, now + ttl)
            self._pins.move_to_end(keys[i])
        while len(self._pins) > self.capacity:
            self._pins.popitem(last=False)
        return res

    async def get(self, key: str) -> str | None:
        return self._live(key, self.clock())

    async def close(self) -> None:
        return None

    def __len__(self) -> int:
        return len(self._pins)


# The same algorithm as _plan, in Lua, so lookup and claim are one atomic step on the server.
_RESOLVE_LUA = """
local c = cjson.decode(ARGV[1])
local values, stale, hit = {}, '', 0
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  values[i] = v
  if v and hit == 0 then
    if c.ttl[v] and not c.failed[v] then
      if c.busy[v] then return {c.proposal, 'overloaded', i, ''} end
      hit = i
    elseif stale == '' then
      if c.failed[v] then stale = 'failed' else stale = 'unhealthy' end
    end
  end
end
local winner, outcome = c.proposal, 'new'
if hit > 0 then winner = values[hit]; outcome = 'hit'; stale = ''
elseif stale ~= '' then outcome = 'repin' end
local ttl = c.ttl[winner]
for i, k in ipairs(KEYS) do
  local v = values[i]
  if hit == 0 or i < hit then
    redis.call('SET', k, winner, 'PX', ttl)
  elseif i == hit or v == winner then
    redis.call('PEXPIRE', k, ttl)
  elseif (not v) or (not c.ttl[v]) or c.failed[v] then
    redis.call('SET', k, winner, 'PX', ttl)
  end
end
return {winner, outcome, hit, stale}
"""


class RedisPinStore:
    """Pins in Redis, shared by every proxy; one Lua script per request (lookup, claim, refresh)."""

    def __init__(self, url: str, timeout: float | None = None) -> None:
        from litellm_kv.redis_client import RedisUse, connect

        self._redis = connect(url, RedisUse.PINS, timeout_s=timeout)
        self._script = self._redis.register_script(_RESOLVE_LUA)

    async def resolve(self, keys: Sequence[str], candidates: Candidates) -> Resolution:
        arg = json.dumps(
            {
                "ttl": dict(candidates.ttl_ms),
                "busy": {d: True for d in candidates.busy} or {"": False},
                "failed": {d: True for d in candidates.failed} or {"": False},
                "proposal": candidates.proposal,
            }
        )
        raw = await self._script(keys=list(keys), args=[arg])
        winner, outcome, hit, stale = (v.decode() if isinstance(v, bytes) else v for v in raw)
        known = _OUTCOMES.get(str(outcome))
        if known is None:
            raise RuntimeError(f"affinity script answered {raw!r}")
        return Resolution(str(winner), known, int(hit) - 1, str(stale or ""))

    async def get(self, key: str) -> str | None:
        v = await self._redis.get(key)
        return v.decode() if isinstance(v, bytes) else v

    async def close(self) -> None:
        await self._redis.aclose()


# -- the decision ---------------------------------------------------------------------------------
@dataclass(slots=True)
class Decision:
    """One request's affinity decision, kept for its failure hook and for metrics."""

    deployment: str | None
    reason: str  # hit | new | repin | overloaded | too_short | store_error
    keys: list[str] = field(default_factory=list)
    stale: str = ""
    cached_tokens_estimate: int = 0


class AffinityRouter:
    """Chooses a deployment for a request of one model group; owns nothing LiteLLM-specific."""

    def __init__(
        self,
        group: str,
        options: AffinityOptions,
        store: PinStore,
        load: LoadTracker,
        *,
        memo: TokenMemo | None = None,
        rng: Callable[[Sequence[str]], str] | None = None,
    ) -> None:
        self.group = group
        self.options = options
        self.store = store
        self.load = load
        self.memo = memo or TokenMemo()
        self._pick = rng or random.choice

    def key_name(self, digest: PrefixDigest) -> str:
        # The hash tag keeps a group's pins in one Redis Cluster slot (one script call per request).
        return f"{self.options.key_prefix}:{{{self.group}}}:{digest}"

    async def choose(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None,
        deployments: Sequence[tuple[str, str, str, Mapping[str, Any]]],
        *,
        failed_in_request: frozenset[str] = frozenset(),
        namespace_extra: str = "",
        retention: Any = None,
    ) -> Decision:
        """``deployments``: (id, provider, model, model_info) of the healthy deployments."""
        opts = self.options
        failed = set(failed_in_request)
        window = opts.avoid_failed_seconds
        failed.update(d for d, *_ in deployments if self.load.recently_failed(DeploymentId(d), window))
        allowed = [d for d in deployments if d[0] not in failed]
        if not allowed:
            allowed = [d for d in deployments if d[0] not in failed_in_request]
        if not allowed:
            return Decision(None, "no_deployment")
        _, provider, model, _ = allowed[0]
        profile = profile_for(provider, opts)
        meter = make_meter(opts.tokenizer, opts, provider, model)
        prefixes = conversation_prefixes(
            messages, tools, namespace=f"{self.group}\x00{namespace_extra}", meter=meter, memo=self.memo
        )
        chosen = select_keys(prefixes, profile, opts)
        if not chosen:
            return Decision(None, "too_short")
        keys = [self.key_name(p.digest) for p in chosen]
        req_ttl = request_ttl(messages, tools, retention) if opts.follow_request_ttl else None
        ttl_ms: dict[str, int] = {}
        busy: set[str] = set()
        least = min(self.load.in_flight(DeploymentId(d)) for d, *_ in allowed)
        for dep_id, _, _, info in allowed:
            dep_ttl = parse_ttl(info.get("affinity_ttl_seconds")) if info.get("affinity_ttl_seconds") else None
            ttl_ms[dep_id] = int(1000 * (req_ttl or dep_ttl or opts.ttl_seconds))
            cap = info.get("affinity_max_in_flight", opts.max_in_flight)
            n = self.load.in_flight(DeploymentId(dep_id))
            if (isinstance(cap, int) and n >= cap) or (
                opts.max_imbalance is not None and n - least > opts.max_imbalance
            ):
                busy.add(dep_id)
        if len(busy) == len(allowed):
            busy.clear()  # everyone is over the cap: bypassing would only move the queue
        free = [d for d, *_ in allowed if d not in busy]
        lightest = min(self.load.in_flight(DeploymentId(d)) for d in free)
        proposal = self._pick([d for d in free if self.load.in_flight(DeploymentId(d)) == lightest])
        candidates = Candidates(ttl_ms, proposal, frozenset(busy), frozenset(failed))
        res = await self.store.resolve(keys, candidates)
        hit_tokens = chosen[res.hit_index].tokens if res.outcome == "hit" else 0
        return Decision(res.deployment, res.outcome, keys, res.stale, profile.cacheable(hit_tokens))
