"""Options of KV-aware routing for one model group (``litellm_kv.model_groups.<g>.kv``)."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from litellm_kv.config import doc

HashAlgo = typing.Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


@dataclass(slots=True)
class KVRoutingSettings:
    """KV-aware routing of one model group whose deployments are vLLM replicas."""

    shadow: bool = doc(
        "Shadow mode: compute and record the decision and its predicted hit, but let LiteLLM route as it "
        "would have. Metrics then show what routing would have achieved (the mirrored-traffic trial).",
        default=False,
    )
    tokenizer: typing.Literal["auto", "engine", "local"] = doc(
        "How prompts are tokenized. 'engine': POST /tokenize on a replica (exact, one round trip). 'local': "
        "tokenizer_path's tokenizer.json + chat template, verified against /tokenize at start-up. 'auto': "
        "local when tokenizer_path is set and verification passed, else engine.",
        default="auto",
    )
    tokenizer_path: str | None = doc(
        "Directory of the served model's tokenizer (tokenizer.json, tokenizer_config.json with chat_template).",
        default=None,
    )
    fast_bpe: bool = doc(
        "Encode byte-level BPE models (GPT-2, Qwen2, Llama 3 families) with tiktoken's core instead of "
        "tokenizers: the same ids, 4-7x faster on a never-seen prompt. Used only when the model's "
        "tokenizer.json has a shape where both agree and a self-check at load passes; /litellm-kv/health "
        "shows 'fast BPE on' or why it is off. The local tokenizer is verified against /tokenize either way.",
        default=True,
    )
    tokenizer_memo_tokens: int = doc(
        "Bound on the token ids held by the local tokenizer's memo, which keeps each text segment's ids (a "
        "message's text between special tokens) so that a conversation's next turn tokenizes only its new "
        "messages. About 34 bytes a token (~70 MB at the default); the least recently used segments are dropped "
        "beyond it. 0 keeps none.",
        default=2**21,
    )
    early_tokenize_chars: int = doc(
        "With a verified local tokenizer, encode each segment of a chat prompt (a message's text between special "
        "tokens) of at least this many characters that the memo lacks in a worker thread as soon as the request's "
        "body arrives, before LiteLLM's authentication and hooks, so that the routing decision finds its tokens "
        "ready (docs/performance.md). Only requests that carry an API key and a Content-Length are looked at; one "
        "thread, a few segments queued at most. 0: off (the decision encodes the whole prompt itself).",
        default=4096,
    )
    early_lookup_max_age_ms: float = doc(
        "Shared mode, with early_tokenize_chars on: as soon as a chat body arrives, also hash its prompt and make "
        "the decision's round trip to Redis (the index lookup with the load) while LiteLLM authenticates it; the "
        "decision takes that answer when its own hashing inputs are the same and the answer is at most this old, "
        "and looks up again otherwise. What the answer can miss is what other processes wrote meanwhile (KV events, "
        "other proxies' load), by at most this age (docs/performance.md). 0: off.",
        default=50.0,
    )
    verify_every: int = doc(
        "With a local tokenizer, compare its tokens with the engine's /tokenize on 1 request in N "
        "(in the background). A mismatch switches the group to the engine path. 0 disables sampling.",
        default=100,
    )
    block_size: int | None = doc(
        "KV block size of the replicas. None: read from each replica's vllm:cache_config_info "
        "(never assumed). When set and a replica reports another value, the group is marked not exact.",
        default=None,
    )
    hash_algo: HashAlgo | None = doc(
        "The engines' --prefix-caching-hash-algo. None: read from vllm:cache_config_info.", default=None
    )
    hash_seed: str | None = doc(
        "The engines' PYTHONHASHSEED, if they run with one (it seeds NONE_HASH). It cannot be read from "
        "the engine: a wrong value makes every prediction miss, which the exactness check then reports.",
        default=None,
    )
    mm_hasher_algorithm: typing.Literal["blake3", "sha256", "sha512"] = doc(
        "The engines' --mm-hasher-algorithm. Used for image requests that carry mm_processor_kwargs (a "
        "client's pixel bounds or a vision downscale), whose image identifiers vLLM hashes with them; "
        "without kwargs the proxy-set identifier is used verbatim and this does not matter.",
        default="blake3",
    )
    report_mode_full: bool | typing.Literal["auto"] = doc(
        "Inject vllm_xargs.kv_cache_report_mode='full', with which an engine re-announces the blocks of each "
        "cache hit: the only way an index that missed a replica's events (a subscriber or indexer that joined "
        "after the engine's replay buffer moved on, lost batches, a skipped malformed event, a Redis that "
        "deletes keys) learns the blocks that replica still holds. It costs the engine and the index work on "
        "every hit. 'auto': only while the index may lack blocks (a ready replica's event stream was not "
        "followed whole, or the index may lose entries; /litellm-kv/health's reannounce); true: always; "
        "false: never.",
        default="auto",
    )
    tenant_isolation: typing.Literal["none", "team", "key"] = doc(
        "Inject a cache_salt derived (HMAC) from the caller's team or key so tenants never share prefix "
        "blocks (closes the prefix-cache timing side channel). Routing hashes with the same salt.",
        default="none",
    )
    lora_paths: dict[str, str] = doc(
        "LoRA adapter name -> path exactly as the engine resolved it (--lora-modules). Adapters not listed "
        "are looked up in the replica's /v1/models (its 'root' field).",
        default_factory=dict,
    )
    scrape_interval_s: float = doc(
        "How often each replica's /metrics is scraped for load gauges (waiting, running, KV usage).",
        default=1.0,
    )
    scrape_aging: bool = doc(
        "Take this proxy's own requests that have left a replica's queue (or ended) since its last scrape off "
        "the scraped waiting (running) count, so a scrape taken while they were queued does not count them "
        "until the next one (docs/routing.md). false: the scraped counts as they are.",
        default=True,
    )
    discovery_interval_s: float = doc(
        "How often replicas that are not ready (unreachable, no event source) are retried.", default=5.0
    )
    heartbeat_ttl_s: float = doc(
        "A replica whose subscriber saw nothing (no batch, no successful scrape) for this long is expired "
        "from the index.",
        default=60.0,
    )
    exactness_sample_every: int = doc(
        "Recompute the hash chain of 1 in N BlockStored events from their token ids and compare "
        "(0 disables). A mismatch marks the replica not exact.",
        default=10,
    )
    engine_timeout_s: float = doc("Timeout of HTTP calls to replicas (tokenize, metrics, discovery).", default=2.0)
    inflight_ttl_s: float = doc(
        "In-flight load counted for a request is released after this long even if no completion was seen.",
        default=600.0,
    )
    cost_model: typing.Literal["ttft", "blocks"] = doc(
        "The routing cost. 'ttft': each replica's predicted time to first token in seconds (queued prefill, "
        "this request's uncached prefill, decode slowdown) at rates learned from its engine's metrics and the "
        "measured TTFTs (the 'kv.ttft' section; docs/routing.md). 'blocks': the token-equivalent cost of hits "
        "against load (the 'kv.cost' weights), the model litellm-kv shipped first.",
        default="ttft",
    )
    ttft: dict[str, Any] = doc(
        "TTFT cost-model options (see the 'kv.ttft' section: default rates before calibration, weights, "
        "learning half-lives).",
        default_factory=dict,
    )
    cost: dict[str, Any] = doc(
        "Cost-model weights (see docs/routing.md: hit credit per tier, load weights, anti-starvation, "
        "imbalance guard, temperature, sibling TTL).",
        default_factory=dict,
    )

    load: dict[str, Any] = doc(
        "Router-tracked load options (see the 'kv.load' section: recent-work half-life, shared-mode TTL).",
        default_factory=dict,
    )
    siblings: dict[str, Any] = doc(
        "Sibling-prediction options (see the 'kv.siblings' section: TTL and bound of the side index).",
        default_factory=dict,
    )

    def validate(self) -> None:
        if self.block_size is not None and self.block_size <= 0:
            raise ValueError("block_size must be positive")
        if self.verify_every < 0 or self.exactness_sample_every < 0:
            raise ValueError("sampling rates must be >= 0")
        if self.inflight_ttl_s <= 0:
            raise ValueError("inflight_ttl_s must be positive")
        if self.tokenizer_memo_tokens < 0:
            raise ValueError("tokenizer_memo_tokens must be >= 0")
        if self.early_tokenize_chars < 0:
            raise ValueError("early_tokenize_chars must be >= 0 (0: off)")
        if not 0 <= self.early_lookup_max_age_ms <= 10_000:
            raise ValueError("early_lookup_max_age_ms must be between 0 (off) and 10000")
        if self.tokenizer == "local" and not self.tokenizer_path:
            raise ValueError("tokenizer: local needs tokenizer_path")
