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
part's uuid verbatim as the identifier, so no pixels are decoded and the same bytes inline or by URL
hash alike. With ``mm_processor_kwargs`` vLLM hashes the uuid with the kwargs (``MultiModalHasher``):
:func:`engine_identifier` reproduces that, with blake3 (vLLM's default ``--mm-hasher-algorithm``,
in pure Python here for inputs of one chunk), sha256 or sha512.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from litellm_kv.vllm.hashing import BlockHasher, MMFeature

IDENTIFIER_PREFIX: Final = "sha256:"
"""The form of :func:`image_identifier`: ``sha256:`` and 64 lowercase hex digits (71 ASCII chars)."""


MM_HASHER_ALGOS: Final = ("blake3", "sha256", "sha512")
"""vLLM's ``--mm-hasher-algorithm`` choices (blake3 is its default)."""

# Processor-kwargs keys vLLM scopes to one modality (``_HF_MODALITY_PROCESSOR_KWARGS``): an image's
# identifier leaves out the other modalities' ones.
_OTHER_MODALITY_KWARGS: Final = frozenset({"videos_kwargs", "audio_kwargs"})
_INT64: Final = (-(1 << 63), (1 << 63) - 1)


class IdentifierUnavailable(ValueError):
    """The engine's identifier for this item cannot be computed here (the caller routes by load): a
    processor-kwargs value of a kind this module does not serialise, or an input too long for it."""


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


def engine_identifier(uuid: str, model_id: str, mm_processor_kwargs: Mapping[str, Any] | None = None,
                      algorithm: str = "blake3") -> str:
    """The identifier the engine gives an image part carrying ``uuid`` in a request with these
    ``mm_processor_kwargs``: ``uuid`` itself without kwargs, else vLLM's
    ``MultiModalHasher.hash_kwargs(algorithm, model_id=model_id, image=uuid,
    mm_processor_kwargs=kwargs)``, the kwargs less the other modalities' scoped keys.

    ``model_id`` is the model as the engine was given it (its path for a local model, not the
    served name). Covers the request's own kwargs with no ``media_io_kwargs``. Raises
    :class:`IdentifierUnavailable` for values other than str, int (64-bit), float, bool, None, lists,
    tuples and str-keyed mappings of them, and for a blake3 input over one BLAKE3 chunk (1 KiB).
    """
    kwargs = {k: v for k, v in (mm_processor_kwargs or {}).items() if k not in _OTHER_MODALITY_KWARGS}
    if not kwargs:
        return uuid
    fields = {"image": uuid, "mm_processor_kwargs": kwargs, "model_id": model_id}
    chunks: list[bytes] = []
    for key in sorted(fields):
        chunks += _framed(_utf8(key))
        chunks += _value_chunks(fields[key], 0)
    data = b"".join(chunks)
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    if algorithm == "sha512":
        return hashlib.sha512(data).hexdigest()
    if algorithm == "blake3":  # pure Python: remembered, as an image is resent with the same kwargs
        ident = _B3_MEMO.get(data)
        if ident is None:
            ident = _B3_MEMO[data] = blake3_hex(data)
            if len(_B3_MEMO) > _B3_MEMO_SIZE:
                del _B3_MEMO[next(iter(_B3_MEMO))]
        return ident
    raise IdentifierUnavailable(f"unknown mm hasher algorithm {algorithm!r}; vLLM has {', '.join(MM_HASHER_ALGOS)}")


# -- BLAKE3 (the default of vLLM's multimodal hasher), for inputs of one chunk -----------------------------

_B3_IV: Final = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_B3_PERM: Final = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_B3_CHUNK: Final = 1024
_CHUNK_START: Final = 1
_CHUNK_END: Final = 2
_ROOT: Final = 8
_M32: Final = 0xFFFFFFFF
_B3_MEMO: dict[bytes, str] = {}  # hash input -> identifier, oldest first (FIFO bound)
_B3_MEMO_SIZE: Final = 4096


def blake3_hex(data: bytes) -> str:
    """BLAKE3's 32-byte digest of ``data`` in hex, for ``data`` of at most one chunk (1 KiB): the
    chunk is the root, so no tree is needed. Longer input raises :class:`IdentifierUnavailable`
    (processor kwargs that long are not expected; such a request is routed by load)."""
    if len(data) > _B3_CHUNK:
        raise IdentifierUnavailable(f"a {len(data)}-byte multimodal hash input is over one BLAKE3 chunk")
    cv = list(_B3_IV)
    n_blocks = max(1, -(-len(data) // 64))
    out: list[int] = []
    for b in range(n_blocks):
        block = data[b * 64 : b * 64 + 64]
        flags = (_CHUNK_START if b == 0 else 0) | (_CHUNK_END | _ROOT if b == n_blocks - 1 else 0)
        words = list(struct.unpack("<16I", block.ljust(64, b"\x00")))
        out = _b3_compress(cv, words, len(block), flags)
        cv = out[:8]
    return struct.pack("<8I", *out[:8]).hex()


def _b3_compress(cv: list[int], m: list[int], block_len: int, flags: int) -> list[int]:
    s = [*cv, *_B3_IV[:4], 0, 0, block_len, flags]  # counter 0: the only chunk
    for rnd in range(7):
        if rnd:
            m = [m[i] for i in _B3_PERM]
        for a, b, c, d, x, y in ((0, 4, 8, 12, 0, 1), (1, 5, 9, 13, 2, 3), (2, 6, 10, 14, 4, 5),
                                 (3, 7, 11, 15, 6, 7), (0, 5, 10, 15, 8, 9), (1, 6, 11, 12, 10, 11),
                                 (2, 7, 8, 13, 12, 13), (3, 4, 9, 14, 14, 15)):
            sa = (s[a] + s[b] + m[x]) & _M32
            sd = s[d] ^ sa
            sd = ((sd >> 16) | (sd << 16)) & _M32
            sc = (s[c] + sd) & _M32
            sb = s[b] ^ sc
            sb = ((sb >> 12) | (sb << 20)) & _M32
            sa = (sa + sb + m[y]) & _M32
            sd ^= sa
            sd = ((sd >> 8) | (sd << 24)) & _M32
            sc = (sc + sd) & _M32
            sb ^= sc
            s[a], s[b], s[c], s[d] = sa, ((sb >> 7) | (sb << 25)) & _M32, sc, sd
    return [s[i] ^ s[i + 8] for i in range(8)] + [s[i + 8] ^ cv[i] for i in range(8)]


def _framed(chunk: bytes) -> Iterator[bytes]:
    yield len(chunk).to_bytes(8, "little")
    yield chunk


def _value_chunks(obj: object, depth: int) -> Iterator[bytes]:
    """vLLM's ``iter_value_to_bytes``: containers tagged with their kind and length, leaves framed."""
    if depth > 32:
        raise IdentifierUnavailable("mm_processor_kwargs nest too deep")
    if obj is None:
        yield b"\x00"
    elif isinstance(obj, list | tuple):
        yield b"\x01" + len(obj).to_bytes(8, "little")
        for elem in obj:
            yield from _value_chunks(elem, depth + 1)
    elif isinstance(obj, Mapping):
        yield b"\x02" + len(obj).to_bytes(8, "little")
        for k, v in obj.items():
            if not isinstance(k, str):
                raise IdentifierUnavailable(f"mm_processor_kwargs key {k!r} is not a string")
            yield from _framed(_utf8(k))
            yield from _value_chunks(v, depth + 1)
    else:
        yield b"\x03"
        yield from _framed(_leaf_bytes(obj))


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: vLLM's own hashing fails on it too
        raise IdentifierUnavailable("mm_processor_kwargs hold a string that is not valid UTF-8") from exc


def _leaf_bytes(obj: object) -> bytes:
    """``MultiModalHasher.serialize_item`` for the leaves JSON can carry: a str's UTF-8, and
    ``numpy.array(x).tobytes()`` for numbers (bool: 1 byte; int: int64; float: float64; little-endian)."""
    if isinstance(obj, str):
        return _utf8(obj)
    if isinstance(obj, bool):
        return b"\x01" if obj else b"\x00"
    if isinstance(obj, int):
        if not _INT64[0] <= obj <= _INT64[1]:
            raise IdentifierUnavailable(f"mm_processor_kwargs integer {obj} is outside int64")
        return obj.to_bytes(8, "little", signed=True)
    if isinstance(obj, float):
        return struct.pack("<d", obj)
    raise IdentifierUnavailable(f"mm_processor_kwargs value of type {type(obj).__name__} is not supported")
