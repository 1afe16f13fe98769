"""Inline base64: the size cap matches what the decoder accepts.

Protects ``max_image_bytes`` (``image.too_large``): the cap is on the decoded image, so wrapping the
base64 text in lines (MIME, 76 columns) must not make an image within the cap "too large", while a
payload over the cap stays refused however it is wrapped.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from litellm_kv.governance.images import (
    _CHUNK,
    DEFAULT_MAX_IMAGE_BYTES,
    ImageBounds,
    ImageError,
    ImagePart,
    decode_base64,
    measure,
)


def bmp_near_the_cap() -> bytes:
    """An uncompressed BMP just under the default 20 MiB cap."""
    buf = io.BytesIO()
    Image.new("RGB", (2580, 2700), (10, 20, 30)).save(buf, "BMP")
    raw = buf.getvalue()
    assert DEFAULT_MAX_IMAGE_BYTES - 100_000 < len(raw) <= DEFAULT_MAX_IMAGE_BYTES
    return raw


@pytest.fixture(scope="module")
def big_bmp() -> bytes:
    return bmp_near_the_cap()


def test_max_image_bytes_counts_decoded_bytes_not_line_breaks(big_bmp: bytes) -> None:
    mime = base64.encodebytes(big_bmp).decode()  # 76 columns, one "\n" per line
    for text in (mime, mime.replace("\n", "\r\n")):
        info = measure(ImagePart("messages[0].content[0]", "data:image/bmp;base64," + text, True))
        assert (info.format, info.width, info.height, info.size_bytes) == ("bmp", 2580, 2700, len(big_bmp))


def test_max_image_bytes_still_refuses_a_wrapped_payload_over_the_cap() -> None:
    raw = b"BM" + b"\x00" * 3000
    text = base64.encodebytes(raw).decode()
    with pytest.raises(ImageError) as err:
        measure(ImagePart("m", text, True, bare_base64=True), ImageBounds(max_bytes=2000))
    assert err.value.limit_name == "image.too_large"
    # Over the cap by less than one line: the exact check after decoding still refuses it.
    with pytest.raises(ImageError) as err:
        measure(ImagePart("m", base64.encodebytes(b"BM" + b"\x00" * 2001).decode(), True, bare_base64=True),
                ImageBounds(max_bytes=2000))
    assert err.value.limit_name == "image.too_large"


@pytest.mark.parametrize("text", ["QU\nJD\n", "QUJD\n\n", "Q\nU\nJ\nD", " QUJD "])
def test_max_image_bytes_wrapping_anywhere_decodes_the_same(text: str) -> None:
    assert bytes(decode_base64(text, "m", 100)) == b"ABC"


@pytest.mark.parametrize("text", ["QU=J", "QUI=\nQUJD", "QQ==QUJD", "QUJD====", "QUJDQ"])
def test_max_image_bytes_padding_inside_the_data_is_refused(text: str) -> None:
    with pytest.raises(ImageError) as err:
        decode_base64(text, "m", 100)
    assert err.value.limit_name == "image.invalid_base64"


def test_max_image_bytes_padding_across_decoding_steps() -> None:
    # The step size is 64 Ki characters: put padding and line breaks right at a step boundary.
    raw = bytes(range(256)) * 200
    text = base64.b64encode(raw).decode()
    for pad in range(0, 4):
        wrapped = text[:_CHUNK - pad] + "\n" * pad + text[_CHUNK - pad:]
        assert bytes(decode_base64(wrapped, "m", len(raw))) == raw
    short = base64.b64encode(b"x" * (_CHUNK // 4 * 3 - 1)).decode()  # ends in "=" inside the first step
    assert bytes(decode_base64(short + "\n" * 10, "m", _CHUNK)) == b"x" * (_CHUNK // 4 * 3 - 1)
    with pytest.raises(ImageError):
        decode_base64(short + "\nQUJD", "m", 10 * _CHUNK)
