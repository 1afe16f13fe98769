"""The public API stays importable where users import it from, whatever the package layout inside."""

from __future__ import annotations

import importlib

import pytest

PUBLIC = [
    ("litellm_kv.hashing", "BlockHasher"),
    ("litellm_kv.events", "decode_event_batch"),
    ("litellm_kv.events", "to_block_ops"),
    ("litellm_kv.index.memory", "InMemoryIndex"),
    ("litellm_kv.index.redis", "RedisIndex"),
    ("litellm_kv.vision", "visual_tokens"),
    ("litellm_kv.integration.callback", "proxy_handler"),
]


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_public_name_is_importable(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name, None) is not None


def test_compatibility_paths_are_the_real_objects() -> None:
    """The old paths re-export the moved objects themselves, not copies."""
    from litellm_kv import events, hashing, vision
    from litellm_kv.governance import vision as real_vision
    from litellm_kv.vllm import events as real_events
    from litellm_kv.vllm import hashing as real_hashing

    assert hashing.BlockHasher is real_hashing.BlockHasher
    assert events.decode_event_batch is real_events.decode_event_batch
    assert vision.visual_tokens is real_vision.visual_tokens
