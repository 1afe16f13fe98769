"""Block hashes of prompts with images, exactly as vLLM computes them (docs/hashing.md, "Images").

The chat template renders each image as one placeholder token (Qwen2-VL family:
``<|vision_start|><|image_pad|><|vision_end|>``); vLLM's processor replaces that token by a run of
as many copies as the image has visual tokens, and every full block that overlaps the run carries
``("mm", identifier, run_start - block_start)`` in its hash (``vllm-contract.md`` §2). Given the
rendered token ids, the per-image visual-token counts (``litellm_kv.governance.vision.visual_tokens``)
and the per-image identifiers, :func:`expand_images` returns the engine's token ids and the
:class:`~litellm_kv.vllm.hashing.MMFeature` list that :class:`~litellm_kv.vllm.hashing.BlockHasher`
hashes.

The identifier is set by the proxy, not computed the way vLLM would without one: each image part
gets ``"uuid": image_identifier(raw_bytes)``. With no per-request processor kwargs the engine uses a
part's uuid verbatim as the identifier, so no pixels are decoded and no second hash function is
needed, and the same bytes inline or by URL hash alike. Requests with ``mm_processor_kwargs`` are not
covered here: vLLM then hashes the uuid with the kwargs (``MultiModalHasher``, blake3).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from litellm_kv.vllm.hashing import BlockHasher, MMFeature

IDENTIFIER_PREFIX: Final = "sha256:"
"""The form of :func:`image_identifier`: ``sha256:`` and 64 lowercase hex digits (71 ASCII chars)."""


class ImageExpansionError(ValueError):
    """The rendered prompt does not match the request's images (the caller routes by load).

    Raised when the placeholder tokens in the rendered ids are not one per image, e.g. a client
    text that spells the placeholder token itself, or a template this module does not know.
    """


@dataclass(frozen=True, slots=True)
class ImageItem:
    """One image of a request, in prompt order: its identifier and its visual-token count."""

    identifier: str
    tokens: int


@dataclass(frozen=True, slots=True)
class ExpandedPrompt:
    """The prompt as the engine holds it: placeholder runs expanded, one feature per image."""

    token_ids: list[int]
    features: tuple[MMFeature, ...]


def image_identifier(raw: bytes | bytearray | memoryview) -> str:
    """The uuid the proxy sets on an image part: a digest of the image's encoded bytes (as sent
    inline, or as fetched from its URL), never of its pixels. Equal bytes give equal identifiers,
    so the same image inline and by URL, or resent on a later turn, keys the same blocks."""
    return IDENTIFIER_PREFIX + hashlib.sha256(raw).hexdigest()


def expand_images(token_ids: Sequence[int], placeholder_id: int, images: Sequence[ImageItem]) -> ExpandedPrompt:
    """Replace the ``i``-th ``placeholder_id`` token of ``token_ids`` by ``images[i].tokens`` copies.

    Each feature's offset is the run's first index in the expanded ids and its length the run's
    length (vLLM's ``PlaceholderRange`` for a Qwen2-VL family image). Raises
    :class:`ImageExpansionError` when the rendered ids hold another number of placeholders than
    there are images, or a count is not positive.
    """
    out: list[int] = []
    features: list[MMFeature] = []
    n = 0
    start = 0
    ids = token_ids if isinstance(token_ids, list) else list(token_ids)
    for i, tok in enumerate(ids):
        if tok != placeholder_id:
            continue
        if n >= len(images):
            raise ImageExpansionError(f"the prompt holds more image placeholders than its {len(images)} images")
        item = images[n]
        if isinstance(item.tokens, bool) or item.tokens <= 0:
            raise ImageExpansionError(f"image {n} has {item.tokens} visual tokens")
        out.extend(ids[start:i])
        features.append(MMFeature(item.identifier, len(out), item.tokens))
        out.extend([placeholder_id] * item.tokens)
        start = i + 1
        n += 1
    if n != len(images):
        raise ImageExpansionError(f"the prompt holds {n} image placeholders for {len(images)} images")
    out.extend(ids[start:])
    return ExpandedPrompt(out, tuple(features))


def image_block_hashes(hasher: BlockHasher, prompt: ExpandedPrompt) -> list[int]:
    """The wire hashes of ``prompt``'s full blocks, as the engine's ``BlockStored`` events carry them."""
    return hasher.wire_hashes(prompt.token_ids, mm=prompt.features)


def event_extra_keys(features: Sequence[MMFeature], num_tokens: int, block_size: int) -> list[Any]:
    """Per full block, what ``BlockStored.extra_keys`` publishes for these images: None for a block
    no image overlaps, else the ``(identifier, run_start - block_start)`` pairs in offset order
    (the untagged form of the hash's ``("mm", …)`` keys; for checks and for explaining a route)."""
    ordered = sorted(features, key=lambda f: f.offset)
    out: list[Any] = []
    for start in range(0, num_tokens // block_size * block_size, block_size):
        end = start + block_size
        keys = tuple((f.identifier, f.offset - start) for f in ordered
                     if f.offset < end and start < f.offset + f.length)
        out.append(keys or None)
    return out
