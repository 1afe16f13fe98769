"""Conversation keys: a chat request as chained digests, one per prefix boundary.

Turn N+1 of a conversation repeats turn N's whole prompt, so the digest of turn N's prompt is one
of turn N+1's boundaries: no client cooperation is needed, and ``cache_control`` markers are
stripped before hashing so moving them (automatic injection marks the last message) changes no key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from litellm_kv.routing.affinity.meters import TokenMemo, TokenMeter
from litellm_kv.routing.affinity.options import AffinitySettings
from litellm_kv.routing.affinity.profiles import CacheProfile

# A chained digest of a prompt prefix (hex); the name keeps it apart from deployment ids.
PrefixDigest = NewType("PrefixDigest", str)
# Versions every digest: a change of the canonical form must not reuse old pins.
KEY_VERSION = b"litellm-kv-affinity/v1"


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


def select_keys(prefixes: Sequence[Prefix], profile: CacheProfile, options: AffinitySettings) -> list[Prefix]:
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
