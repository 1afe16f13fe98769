"""What a provider's prompt cache keeps: the shortest cached prefix and the step above it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from litellm_kv.routing.affinity.options import AffinitySettings


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


def profile_for(provider: str, options: AffinitySettings) -> CacheProfile:
    base = _PROVIDER_PROFILES.get(provider, _DEFAULT_PROFILE)
    return CacheProfile(
        min_tokens=base.min_tokens if options.min_prompt_tokens is None else options.min_prompt_tokens,
        increment=base.increment if options.cache_increment_tokens is None else options.cache_increment_tokens,
    )
