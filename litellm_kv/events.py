"""Compatibility path for the public API: KV-event decoding lives in :mod:`litellm_kv.vllm.events`."""

from litellm_kv.vllm.events import *  # noqa: F403  (kept importable at its old path)
