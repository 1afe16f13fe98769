"""Options of a model group routed by prompt-cache affinity (``routing: affinity``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from litellm_kv.config import doc


@dataclass(slots=True)
class AffinitySettings:
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
        "litellm_kv.mode is 'shared' or any Redis is configured: litellm_kv.redis, redis_url, "
        "LITELLM_KV_REDIS_URL or LiteLLM's cache Redis).",
        default="auto",
    )
    key_prefix: str = doc("Prefix of the Redis keys of pins.", default="litellm_kv:affinity")
    memory_max_pins: int = doc(
        "Capacity of the in-process store; the least recently used pins go first.", default=200_000
    )
    redis_timeout_seconds: float = doc(
        "Socket timeout of Redis calls; on timeout the request is routed by LiteLLM alone.", default=0.25
    )
    share_pins_across_tenants: bool = doc(
        "False: pins are kept per tenant (the verified key's team, else the key), so a request follows only "
        "pins its own tenant created and no tenant can tell from routing or the x-litellm-kv-affinity header "
        "whether another tenant sent the same prompt. True: every caller of the group shares the pins (a "
        "prompt common to several tenants is cached once), at the price of that cross-tenant signal.",
        default=False,
    )
    show_header: Literal["off", "admins", "everyone"] = doc(
        "Who gets the x-litellm-kv-affinity response header (hit, new, repin, overloaded, too_short, "
        "store_error): 'admins' (proxy_admin and proxy_admin_viewer keys), 'everyone', or 'off'. With "
        "share_pins_across_tenants, 'everyone' lets any caller learn that another sent a prompt.",
        default="admins",
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
