"""Fuzzing the image parser (hypothesis): only :class:`ImageError` may escape, and memory stays bounded.

Inputs are valid Pillow-written images of every supported format with random byte flips, cuts,
insertions and header rewrites, plus raw random bytes behind each format's magic number, plus
random data: URLs and base64 text. Memory is measured with tracemalloc around each call.
"""

from __future__ import annotations

import base64
import io
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from litellm_kv.governance.images import ImageBounds, ImageError, ImagePart, find_media, image_info, measure

MAGICS = [
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR", b"\xff\xd8\xff", b"RIFF\x00\x00\x00\x00WEBPVP8 ",
    b"RIFF\xff\xff\xff\x7fWEBPVP8L", b"RIFF\x10\x00\x00\x00WEBPVP8X", b"GIF89a", b"GIF87a", b"BM",
    b"II*\x00", b"<svg",
]


def _seed(fmt: str, mode: str, size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 77).save(buf, fmt)
    return buf.getvalue()


SEEDS = [
    _seed("PNG", "RGB", (37, 21)), _seed("JPEG", "RGB", (40, 33)), _seed("WEBP", "RGBA", (19, 64)),
    _seed("GIF", "P", (25, 9)), _seed("BMP", "RGB", (13, 7)), _seed("PNG", "P", (300, 2)),
]

BOUNDS = ImageBounds(max_bytes=256 * 1024, max_pixels=50_000_000)
#: Generous: the parser copies a few header slices; anything near the input size means it decodes.
PEAK_BUDGET = 64 * 1024


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "overwrite"]))
        pos = draw(st.integers(0, max(0, len(raw) - 1)))
        if op == "flip" and raw:
            raw[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del raw[pos:]
        elif op == "insert":
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "overwrite":
            chunk = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff", b"\x7f\xff\xff\xff"]))
            raw[pos:pos + len(chunk)] = chunk
    return bytes(raw)


magic_prefixed = st.builds(lambda m, tail: m + tail, st.sampled_from(MAGICS), st.binary(max_size=300))


def _bounded_call(raw: bytes) -> None:
    tracemalloc.start()
    try:
        image_info(raw, "fuzz", BOUNDS)
    except ImageError as exc:
        assert exc.status_code == 400 and exc.limit_name.startswith("image.")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < PEAK_BUDGET + len(raw) // 8, f"peak {peak} bytes for a {len(raw)}-byte input"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.one_of(mutated(), magic_prefixed, st.binary(max_size=512)))
def test_parser_only_raises_image_error_with_bounded_memory(raw: bytes) -> None:
    _bounded_call(raw)


@settings(max_examples=500, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=200),
        st.builds(lambda b: base64.b64encode(b).decode(), st.one_of(mutated(), st.binary(max_size=200))),
        st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef0123456789+/=\n ", max_size=300),
    ),
    prefix=st.sampled_from(["data:image/png;base64,", "data:,", "data:image/png,", "data:;base64,", "", "data:"]),
)
def test_data_urls_only_raise_image_error(text: str, prefix: str) -> None:
    part = ImagePart("fuzz", prefix + text, True, bare_base64=not prefix)
    try:
        measure(part, BOUNDS)
    except ImageError as exc:
        assert exc.status_code == 400


@settings(max_examples=300, deadline=None)
@given(body=st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
              st.sampled_from(["image_url", "image", "input_image", "video_url", "data:image/png;base64,AAAA",
                               "https://x/y.png", "base64", "url"])),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(["type", "image_url", "url", "source", "data", "content", "detail",
                                         "messages", "role", "input"]), children, max_size=4),
    ),
    max_leaves=30,
))
def test_request_scanner_only_raises_image_error(body: object) -> None:
    if not isinstance(body, dict):
        body = {"messages": [{"role": "user", "content": [body]}]}
    try:
        find_media(body)
    except ImageError as exc:
        assert exc.status_code == 400


def test_large_valid_image_decodes_with_bounded_overhead() -> None:
    # A 2 MB BMP: decoding base64 costs the payload itself (~2 MB), parsing adds almost nothing.
    raw = _seed("BMP", "RGB", (1000, 700))
    part = ImagePart("big", base64.b64encode(raw).decode(), True, bare_base64=True)
    tracemalloc.start()
    try:
        info = measure(part, ImageBounds(max_bytes=4 * 1024 * 1024))
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert (info.width, info.height) == (1000, 700)
    assert peak < len(raw) * 2.2, f"peak {peak} for {len(raw)} bytes"
