"""Image placeholder expansion, block extra keys and identifiers (litellm_kv.vllm.multimodal).

The engine-side proof (the same hashes as a real vision-language engine's KV events) is
tests/vllm/test_vl_engine.py (test_predicted_hashes_and_hits_equal_the_engine); these check the
expansion logic on its own.
"""

from __future__ import annotations

import hashlib

import pytest

from litellm_kv.vllm.hashing import BlockHasher, MMFeature
from litellm_kv.vllm.multimodal import (
    _B3_MEMO,
    _B3_MEMO_SIZE,
    ExpandedPrompt,
    IdentifierUnavailable,
    ImageExpansionError,
    ImageItem,
    blake3_hex,
    engine_identifier,
    event_extra_keys,
    expand_images,
    image_block_hashes,
    image_identifier,
)

PAD = 99


def test_expand_replaces_each_placeholder_by_its_run() -> None:
    ids = [1, 2, 8, PAD, 7, 3, 8, PAD, 7, 4]
    out = expand_images(ids, PAD, [ImageItem("a", 3), ImageItem("b", 5)])
    assert out.token_ids == [1, 2, 8, PAD, PAD, PAD, 7, 3, 8] + [PAD] * 5 + [7, 4]
    assert out.features == (MMFeature("a", 3, 3), MMFeature("b", 9, 5))


def test_expand_without_images_is_the_prompt() -> None:
    assert expand_images([1, 2, 3], PAD, []) == ExpandedPrompt([1, 2, 3], ())


@pytest.mark.parametrize(("ids", "images"), [
    ([1, PAD, 2], []),  # a placeholder the request has no image for (e.g. spelled in the text)
    ([1, 2], [ImageItem("a", 3)]),  # an image the template did not render
    ([PAD, PAD], [ImageItem("a", 3)]),
    ([PAD], [ImageItem("a", 0)]),
])
def test_expand_refuses_a_mismatch(ids: list[int], images: list[ImageItem]) -> None:
    with pytest.raises(ImageExpansionError):
        expand_images(ids, PAD, images)


def test_event_keys_cover_every_block_the_run_overlaps() -> None:
    # Block size 4: run a at [3, 6) overlaps blocks 0 and 1; run b at [6, 13) blocks 1, 2 and 3.
    feats = (MMFeature("a", 3, 3), MMFeature("b", 6, 7))
    assert event_extra_keys(feats, 20, 4) == [
        (("a", 3),), (("a", -1), ("b", 2)), (("b", -2),), (("b", -6),), None]


def test_image_block_hashes_carry_the_keys() -> None:
    """Same tokens, different identifier: the blocks before the image are shared, the rest differ;
    and the first block after the image differs too (the chain carries the image)."""
    hasher = BlockHasher("sha256", block_size=4)
    ids = [1, 2, 3, 4, 5, PAD, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    one = image_block_hashes(hasher, expand_images(ids, PAD, [ImageItem("x", 2)]))
    two = image_block_hashes(hasher, expand_images(ids, PAD, [ImageItem("y", 2)]))
    assert len(one) == len(two) == 4
    assert one[0] == two[0] and all(a != b for a, b in zip(one[1:], two[1:], strict=True))
    python = BlockHasher("sha256", block_size=4, native=False, memo_tokens=0)
    assert image_block_hashes(python, expand_images(ids, PAD, [ImageItem("x", 2)])) == one


def test_identifier_is_the_sha256_of_the_bytes() -> None:
    raw = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    ident = image_identifier(raw)
    assert ident == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert image_identifier(bytearray(raw)) == ident and image_identifier(raw + b"\x00") != ident


@pytest.mark.parametrize(("data", "want"), [
    # BLAKE3's published test vectors (input byte i is i % 251) and the hash of "abc".
    (b"", "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"),
    (b"abc", "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"),
    (bytes(i % 251 for i in range(1024)), "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"),
])
def test_blake3_vectors(data: bytes, want: str) -> None:
    assert blake3_hex(data) == want


def test_blake3_refuses_more_than_one_chunk() -> None:
    with pytest.raises(IdentifierUnavailable):
        blake3_hex(bytes(1025))


def test_engine_identifier_without_kwargs_is_the_uuid() -> None:
    for kwargs in (None, {}, {"videos_kwargs": {"fps": 1}, "audio_kwargs": {}}):
        assert engine_identifier("sha256:ab", "/m", kwargs) == "sha256:ab"
    with_kwargs = engine_identifier("sha256:ab", "/m", {"max_pixels": 50_000})
    assert len(with_kwargs) == 64 and with_kwargs != engine_identifier("sha256:ab", "/m", {"max_pixels": 50_001})
    assert with_kwargs != engine_identifier("sha256:ab", "/other", {"max_pixels": 50_000})
    assert len(engine_identifier("sha256:ab", "/m", {"max_pixels": 1}, "sha512")) == 128


@pytest.mark.parametrize("kwargs", [
    {"max_pixels": 2**63}, {"x": object()}, {"x": "\ud800"}, {"x": "y" * 2000}, {"x": "nested"},
])
def test_engine_identifier_refuses_what_it_cannot_reproduce(kwargs: dict[str, object]) -> None:
    if kwargs == {"x": "nested"}:
        kwargs = {"x": _nested(40)}
    with pytest.raises(IdentifierUnavailable):
        engine_identifier("u", "/m", kwargs)
    with pytest.raises(IdentifierUnavailable):
        engine_identifier("u", "/m", {"max_pixels": 1}, "md5")


def _nested(depth: int) -> list[object]:
    out: list[object] = []
    for _ in range(depth):
        out = [out]
    return out


def test_blake3_identifiers_are_remembered_within_a_bound() -> None:
    first = engine_identifier("u", "/m", {"max_pixels": 7})
    for i in range(_B3_MEMO_SIZE + 10):
        engine_identifier("u", "/m", {"max_pixels": 1000 + i})
    assert len(_B3_MEMO) <= _B3_MEMO_SIZE
    assert engine_identifier("u", "/m", {"max_pixels": 7}) == first  # recomputed after being dropped
