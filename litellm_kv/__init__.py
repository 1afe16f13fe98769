"""litellm-kv: exact KV-cache-aware routing and per-key reasoning/vision governance for the LiteLLM proxy."""

__version__ = "0.1.0"
