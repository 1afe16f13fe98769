"""Image header parsing and request scanning, against images written by Pillow (the decoder vLLM uses)."""

from __future__ import annotations

import base64
import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from litellm_kv.governance.images import (
    ImageBounds,
    ImageError,
    ImagePart,
    find_media,
    image_info,
    measure,
)

FORMATS = [
    ("PNG", "RGB", {}), ("PNG", "RGBA", {}), ("PNG", "P", {}), ("PNG", "L", {}),
    ("JPEG", "RGB", {}), ("JPEG", "L", {}), ("JPEG", "RGB", {"progressive": True}),
    ("JPEG", "RGB", {"exif": b"Exif\x00\x00" + b"\x00" * 4000}),
    ("WEBP", "RGB", {"lossless": False}), ("WEBP", "RGBA", {"lossless": True}),
    ("WEBP", "RGBA", {"exif": b"Exif\x00\x00II*\x00"}),  # VP8X
    ("GIF", "P", {}), ("GIF", "RGB", {}),
    ("BMP", "RGB", {}), ("BMP", "P", {}), ("BMP", "1", {}),
]


def encode(fmt: str, mode: str, size: tuple[int, int], **kw: object) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, fmt, **kw)
    return buf.getvalue()


def data_url(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(FORMATS), w=st.integers(1, 700), h=st.integers(1, 700))
def test_size_from_header_matches_pillow(spec: tuple[str, str, dict[str, object]], w: int, h: int) -> None:
    fmt, mode, kw = spec
    raw = encode(fmt, mode, (w, h), **kw)
    info = image_info(raw)
    assert (info.format, info.width, info.height) == (fmt.lower(), w, h)
    assert info.width, info.height == Image.open(io.BytesIO(raw)).size


def test_animated_images_report_canvas_size() -> None:
    frames = [Image.new("RGB", (64, 32), (i * 40, 0, 0)) for i in range(3)]
    for fmt in ("GIF", "WEBP", "PNG"):
        buf = io.BytesIO()
        frames[0].save(buf, fmt, save_all=True, append_images=frames[1:])
        assert (image_info(buf.getvalue()).width, image_info(buf.getvalue()).height) == (64, 32)


def test_bmp_top_down_and_core_header() -> None:
    raw = bytearray(encode("BMP", "RGB", (10, 7)))
    struct.pack_into("<i", raw, 22, -7)  # top-down rows
    assert image_info(bytes(raw)).height == 7
    # OS/2 BITMAPCOREHEADER (12 bytes): 16-bit sizes.
    core = b"BM" + struct.pack("<IHHI", 26 + 3 * 4 * 2, 0, 0, 26) + struct.pack("<IHHHH", 12, 3, 2, 1, 24)
    assert (image_info(core + b"\x00" * 24).width, image_info(core + b"\x00" * 24).height) == (3, 2)


# -- every bad-input class is one error type with its kind ----------------------------------------


def kind_of(fn: object) -> str:
    with pytest.raises(ImageError) as err:
        fn()  # type: ignore[operator]
    assert err.value.status_code == 400
    return err.value.limit_name


def test_invalid_base64() -> None:
    part = ImagePart("m[0]", "data:image/png;base64,@@not base64!!", True)
    assert kind_of(lambda: measure(part)) == "image.invalid_base64"
    part = ImagePart("m[0]", "data:image/png;base64,abcde", True)  # impossible length
    assert kind_of(lambda: measure(part)) == "image.invalid_base64"
    assert kind_of(lambda: measure(ImagePart("m", "ünïcode", True, bare_base64=True))) == "image.invalid_base64"


def test_base64_with_line_breaks_and_missing_padding_is_accepted() -> None:
    raw = encode("PNG", "RGB", (5, 3))
    text = base64.b64encode(raw).decode()
    wrapped = "\n".join(text[i:i + 76] for i in range(0, len(text), 76))
    assert measure(ImagePart("m", wrapped, True, bare_base64=True)).width == 5
    assert measure(ImagePart("m", text.rstrip("="), True, bare_base64=True)).height == 3


@pytest.mark.parametrize("fmt,mode", [("PNG", "RGB"), ("JPEG", "RGB"), ("WEBP", "RGB"), ("GIF", "P"), ("BMP", "RGB")])
def test_truncated(fmt: str, mode: str) -> None:
    import random

    rng = random.Random(fmt)
    raw = encode(fmt, mode, (300, 200), **({"quality": 95} if fmt == "JPEG" else {}))
    # Header-only and mid-data cuts are both caught.
    for cut in [12, 40, len(raw) // 2, len(raw) - 3]:
        assert kind_of(lambda c=cut: image_info(raw[:c])) in {"image.truncated", "image.corrupt"}, cut
    for _ in range(20):
        cut = rng.randint(1, len(raw) - 1)
        try:
            image_info(raw[:cut])
        except ImageError as exc:
            assert exc.limit_name in {"image.truncated", "image.corrupt", "image.unsupported_format"}


def test_corrupt_png_checksum() -> None:
    raw = bytearray(encode("PNG", "RGB", (8, 8)))
    raw[17] ^= 0xFF  # inside IHDR: width changes, CRC no longer matches
    assert kind_of(lambda: image_info(bytes(raw))) == "image.corrupt"


@pytest.mark.parametrize("fmt", ["TIFF", "ICO", "PDF"])
def test_unsupported_formats_named(fmt: str) -> None:
    raw = encode(fmt, "RGB", (16, 16))
    with pytest.raises(ImageError) as err:
        image_info(raw)
    assert err.value.limit_name == "image.unsupported_format"
    assert fmt.lower() in err.value.message


def test_unsupported_svg_and_unknown_and_text_data_urls() -> None:
    assert kind_of(lambda: image_info(b"<svg xmlns='http://www.w3.org/2000/svg'/>")) == "image.unsupported_format"
    assert kind_of(lambda: image_info(b"hello world")) == "image.unsupported_format"
    part = ImagePart("m", "data:image/svg+xml,<svg/>", True)
    assert kind_of(lambda: measure(part)) == "image.unsupported_format"


def test_decompression_bomb_headers() -> None:
    # A valid 1x1 PNG whose IHDR claims 100000 x 100000 (checksum fixed up): never decoded.
    import zlib

    raw = bytearray(encode("PNG", "L", (1, 1)))
    struct.pack_into(">II", raw, 16, 100_000, 100_000)
    struct.pack_into(">I", raw, 29, zlib.crc32(bytes(raw[12:29])))
    with pytest.raises(ImageError) as err:
        image_info(bytes(raw))
    assert err.value.limit_name == "image.too_many_pixels"
    assert "100000x100000" in err.value.message
    # The cap is configurable.
    small = encode("PNG", "L", (100, 100))
    assert kind_of(lambda: image_info(small, bounds=ImageBounds(max_pixels=9_999))) == "image.too_many_pixels"


def test_oversized_payload_rejected_before_decoding() -> None:
    huge = "A" * (8 * 1024 * 1024)
    part = ImagePart("messages[0].content[1]", "data:image/png;base64," + huge, True)
    with pytest.raises(ImageError) as err:
        measure(part, ImageBounds(max_bytes=1024 * 1024))
    assert err.value.limit_name == "image.too_large"
    assert "messages[0].content[1]" in err.value.message


# -- finding images in requests -----------------------------------------------------------------


def test_find_media_in_openai_anthropic_and_responses_shapes() -> None:
    png = data_url(encode("PNG", "RGB", (4, 4)))
    b64 = base64.b64encode(encode("JPEG", "RGB", (4, 4))).decode()
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": png, "detail": "low"}},
                {"type": "image_url", "image_url": "https://example.com/cat.png"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64}},
                {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/x.jpg"}},
                ]},
            ]},
        ],
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": png}]}],
    }
    images, videos = find_media(body)
    assert [(p.where, p.inline, p.detail) for p in images] == [
        ("messages[1].content[1]", True, "low"),
        ("messages[1].content[2]", False, None),
        ("messages[1].content[3]", True, None),
        ("messages[2].content[0].content[0]", False, None),
        ("input[0].content[0]", True, None),
    ]
    assert [v.where for v in videos] == ["messages[1].content[4]"]
    assert measure(images[2]).format == "jpeg"


def test_find_media_rejects_bad_urls() -> None:
    for url in ("file:///etc/passwd", "ftp://x/y.png", ""):
        with pytest.raises(ImageError) as err:
            find_media({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
        assert err.value.limit_name == "image.invalid_url"


def test_text_only_requests_cost_nothing() -> None:
    assert find_media({"messages": [{"role": "user", "content": "hi"}]}) == ([], [])
    assert find_media({"prompt": "hi"}) == ([], [])
