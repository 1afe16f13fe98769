"""Image sizes as the engine decodes them: differential tests against Pillow on crafted images.

vLLM opens every image with Pillow (``vllm/multimodal/media/image.py``: ``Image.open``, its pixel
check on ``image.size``, ``ImageOps.exif_transpose``, ``load``); :func:`engine_size` repeats those
steps, so a size litellm-kv reads from a header is checked against the size the engine's processor
gets. Every case protects the visual-token limits (``max_visual_tokens_per_request``, the period
budgets) and ``max_pixels_per_image``: an image counted smaller than it decodes passes them.
"""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from litellm_kv.governance.images import ImageError, image_info
from litellm_kv.governance.vision import FAMILIES, visual_tokens


def engine_size(raw: bytes) -> tuple[int, int] | None:
    """The size vLLM's image loader hands the processor, or None where it refuses the image."""
    try:
        with Image.open(io.BytesIO(raw)) as im:
            oriented = ImageOps.exif_transpose(im)
            oriented.load()
            return oriented.size
    except Exception:  # whatever Pillow refuses, the engine answers 400 for: nothing is spent
        return None


def our_size(raw: bytes) -> tuple[int, int] | None:
    try:
        info = image_info(raw)
    except ImageError:
        return None
    return info.width, info.height


def save(im: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


# -- GIF: the first frame may be larger than the logical screen ------------------------------------


def gif_descriptor(raw: bytes | bytearray) -> int:
    """Offset of the first image descriptor (walking the blocks, as a decoder does)."""
    pos = 13 + ((3 << ((raw[10] & 7) + 1)) if raw[10] & 0x80 else 0)
    while raw[pos] == 0x21:
        pos += 2
        while raw[pos]:
            pos += 1 + raw[pos]
        pos += 1
    assert raw[pos] == 0x2C
    return pos


def crafted_gif(frame: tuple[int, int], screen: tuple[int, int], offset: tuple[int, int] = (0, 0)) -> bytes:
    """A one-frame GIF whose logical screen and frame position are rewritten after encoding."""
    raw = bytearray(save(Image.new("P", frame), "GIF"))
    struct.pack_into("<HH", raw, 6, *screen)
    struct.pack_into("<HH", raw, gif_descriptor(raw) + 1, *offset)
    return bytes(raw)


def test_max_visual_tokens_gif_frame_larger_than_its_logical_screen() -> None:
    # The screen says 1x1 (4 tokens); Pillow decodes the 4000x4000 frame (16,384 tokens).
    raw = crafted_gif((4000, 4000), (1, 1))
    assert engine_size(raw) == (4000, 4000)
    assert our_size(raw) == (4000, 4000)
    assert visual_tokens("qwen2_5_vl", *our_size(raw)) == 16_384


def test_max_pixels_per_image_gif_frame_offset_grows_the_canvas() -> None:
    raw = crafted_gif((300, 200), (10, 10), offset=(100, 50))
    assert engine_size(raw) == our_size(raw) == (400, 250)


@settings(max_examples=40, deadline=None)
@given(frame=st.tuples(st.integers(1, 300), st.integers(1, 300)),
       screen=st.tuples(st.integers(0, 400), st.integers(0, 400)),
       offset=st.tuples(st.integers(0, 200), st.integers(0, 200)))
def test_max_visual_tokens_gif_sizes_match_pillow(frame: tuple[int, int], screen: tuple[int, int],
                                                  offset: tuple[int, int]) -> None:
    raw = crafted_gif(frame, screen, offset)
    decoded = engine_size(raw)
    if decoded is not None:
        assert our_size(raw) == decoded


def test_max_visual_tokens_animated_gif_counts_the_first_frame_canvas() -> None:
    # vLLM loads frame 0 only; later frames larger than the screen do not change what it decodes.
    frames = [Image.new("P", (64, 32)), Image.new("P", (64, 32), 3)]
    raw = save(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert engine_size(raw) == our_size(raw) == (64, 32)


# -- APNG and animated WebP: frames live inside the canvas --------------------------------------


def test_max_visual_tokens_apng_sizes_match_pillow() -> None:
    frames = [Image.new("RGB", (80, 60)), Image.new("RGB", (40, 30), (9, 9, 9)), Image.new("RGB", (80, 60))]
    raw = save(frames[0], "PNG", save_all=True, append_images=frames[1:])
    assert engine_size(raw) == our_size(raw) == (80, 60)


def test_max_visual_tokens_apng_with_frame_over_the_canvas_is_refused_by_the_engine() -> None:
    frames = [Image.new("RGB", (80, 60)), Image.new("RGB", (80, 60), (9, 9, 9))]
    raw = bytearray(save(frames[0], "PNG", save_all=True, append_images=frames[1:]))
    fctl = raw.index(b"fcTL")
    struct.pack_into(">II", raw, fctl + 8, 4000, 4000)  # first frame control: width, height
    import zlib

    struct.pack_into(">I", raw, fctl + 4 + 26, zlib.crc32(bytes(raw[fctl:fctl + 4 + 26])))
    # Pillow refuses a frame outside the canvas, so the canvas size we count cannot undercount.
    assert engine_size(bytes(raw)) in (None, our_size(bytes(raw)))


@pytest.mark.parametrize("lossless", [True, False])
def test_max_visual_tokens_animated_webp_sizes_match_pillow(lossless: bool) -> None:
    frames = [Image.new("RGB", (96, 48), (i * 60, 0, 0)) for i in range(3)]
    raw = save(frames[0], "WEBP", save_all=True, append_images=frames[1:], lossless=lossless)
    assert engine_size(raw) == our_size(raw) == (96, 48)


@pytest.mark.parametrize("animated", [True, False])
def test_max_visual_tokens_webp_canvas_smaller_than_its_frames(animated: bool) -> None:
    frames = [Image.new("RGB", (96, 48), (i * 60, 0, 0)) for i in range(2)]
    if animated:
        raw = bytearray(save(frames[0], "WEBP", save_all=True, append_images=frames[1:]))
    else:  # EXIF makes Pillow write the extended (VP8X) form around a still image
        raw = bytearray(save(frames[0], "WEBP", exif=b"Exif\x00\x00II*\x00\x08\x00\x00\x00\x00\x00"))
    vp8x = raw.index(b"VP8X")
    raw[vp8x + 12:vp8x + 18] = (0).to_bytes(3, "little") * 2  # canvas 1x1, frames still 96x48
    decoded = engine_size(bytes(raw))
    assert decoded is None or decoded == our_size(bytes(raw))


# -- EXIF orientation: vLLM transposes; every family's count is the same either way --------------


def with_orientation(fmt: str, size: tuple[int, int], orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return save(Image.new("RGB", size), fmt, exif=exif.tobytes())


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP", "PNG"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_max_visual_tokens_exif_orientation_counts_as_the_engine_sees_it(fmt: str, orientation: int) -> None:
    raw = with_orientation(fmt, (700, 220), orientation)
    decoded = engine_size(raw)
    ours = our_size(raw)
    assert decoded is not None and ours is not None
    # Orientations 5-8 swap the sides: litellm-kv reads the stored size, which counts the same.
    assert decoded == (ours if orientation < 5 else ours[::-1])
    for family in FAMILIES:
        for detail in (None, "low", "high"):
            assert visual_tokens(family, *ours, detail=detail, tokens_per_image=7) == visual_tokens(
                family, *decoded, detail=detail, tokens_per_image=7), (family, detail)
