"""Compatibility path for the public API: vLLM-exact block hashing lives in :mod:`litellm_kv.vllm.hashing`."""

from litellm_kv.vllm.hashing import *  # noqa: F403  (kept importable at its old path)
