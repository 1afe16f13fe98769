"""Images in a request: where they are, and their size read from the header, never the pixels.

:func:`find_media` walks a chat/messages/responses request body and returns every image part
(OpenAI ``image_url`` and ``input_image`` parts, typed or not, in every message role, Anthropic
``image`` blocks, also inside ``tool_result`` blocks) and every video part, deciding what a part is
by the engine's own rule (:func:`part_kind`). :func:`measure` gives an inline image's format and
size by parsing its header: PNG, JPEG, WebP (VP8, VP8L, VP8X), GIF and BMP, at the size Pillow
(what vLLM decodes with) opens it at.

Every problem with an image is one error type, :class:`ImageError` (HTTP 400), whose
``limit_name`` says which kind: ``image.invalid_base64``, ``image.invalid_url``, ``image.too_large``
(payload over the byte cap), ``image.unsupported_format``, ``image.truncated``, ``image.corrupt``
and ``image.too_many_pixels`` (a header declaring absurd dimensions: a decompression bomb).
Work and memory are bounded: the encoded length is checked before decoding, decoding is one
pass over at most ``max_bytes``, and header parsers only move forward through the bytes.
"""

from __future__ import annotations

import binascii
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from litellm_kv.errors import PolicyViolation

SUPPORTED_FORMATS: Final = ("png", "jpeg", "webp", "gif", "bmp")
#: Pillow's MAX_IMAGE_PIXELS: above it Pillow (and so vLLM) warns of a decompression bomb.
DEFAULT_MAX_IMAGE_PIXELS: Final = 89_478_485
DEFAULT_MAX_IMAGE_BYTES: Final = 20 * 1024 * 1024

ErrorKind = Literal[
    "invalid_base64", "invalid_url", "too_large", "unsupported_format", "truncated", "corrupt", "too_many_pixels",
]


class ImageError(PolicyViolation):
    """A request image that cannot be accepted; always HTTP 400, ``limit_name`` = ``image.<kind>``."""

    @classmethod
    def of(cls, kind: ErrorKind, where: str, problem: str, value: object = None) -> ImageError:
        return cls(400, f"{where}: {problem}", limit_name=f"image.{kind}", value=value, source="request")


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the header of one image says."""

    format: str
    width: int
    height: int
    size_bytes: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True, slots=True)
class ImagePart:
    """One image in a request. ``where`` names it for errors (``messages[1].content[0]``)."""

    where: str
    #: ``data:`` URL or bare base64 text (inline), or an http(s) URL (remote).
    source: str
    inline: bool
    detail: str | None = None
    #: Anthropic blocks carry base64 without the ``data:`` prefix.
    bare_base64: bool = False
    #: The content part itself (found by :func:`find_media`): where the proxy sets the image's ``uuid``.
    ref: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class VideoPart:
    where: str
    ref: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ImageBounds:
    """Bounds on what is read: encoded payload size and declared pixel count."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS


# -- finding images in a request ------------------------------------------------------------

_VIDEO_TYPES: Final = frozenset({"video_url", "video", "input_video", "video_embeds"})
#: The keys vLLM looks for, in its order, in a part without ``type`` or with a ``uuid``.
_ENGINE_KEYS: Final = ("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
                       "audio_url", "input_audio", "video_url", "tool_reference")
#: Image parts that carry no image to measure: their token count is set by the client.
_UNCOUNTABLE: Final = frozenset({"image_embeds", "image_pil"})


def find_media(data: Mapping[str, Any]) -> tuple[list[ImagePart], list[VideoPart]]:
    """Every image and video part in ``messages`` (chat, Anthropic messages; every role), Anthropic ``system``
    blocks and ``input`` (responses, function-call outputs included)."""
    images: list[ImagePart] = []
    videos: list[VideoPart] = []
    system = data.get("system")
    if isinstance(system, list):
        _walk(system, "system", images, videos, depth=0)
    for top in ("messages", "input"):
        items = data.get(top)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                continue
            for key in ("content", "output"):
                content = item.get(key)
                if isinstance(content, list):
                    _walk(content, f"{top}[{i}].{key}", images, videos, depth=0)
    return images, videos


def content_parts(messages: object) -> Iterator[Mapping[str, Any]]:
    """Every content part of ``messages``, nested tool-result content included (4 levels at most), whatever
    its type; anything that is not a list of mappings is skipped (tolerant of any shape)."""
    def walk(parts: object, depth: int) -> Iterator[Mapping[str, Any]]:
        if depth > 4 or not isinstance(parts, list):
            return
        for part in parts:
            if isinstance(part, Mapping):
                yield part
                yield from walk(part.get("content"), depth + 1)

    for item in messages if isinstance(messages, list | tuple) else []:
        if isinstance(item, Mapping):
            yield from walk(item.get("content"), 0)


def drop_part_uuids(data: Mapping[str, Any]) -> int:
    """Remove ``uuid`` from every content part of ``messages`` and of a Responses ``input`` list (its message
    items have the same shape; vLLM turns them into chat messages) (:func:`content_parts`), whatever the part's
    type; the number removed. vLLM keys an item's cached blocks, processed pixels and encoder output by a
    part's ``uuid``: a client's could name another client's image. (The vision count, when the group has
    one, refuses malformed media itself.)"""
    removed = 0
    for part in [*content_parts(data.get("messages")), *content_parts(data.get("input"))]:
        if isinstance(part, dict) and "uuid" in part:
            del part["uuid"]
            removed += 1
    return removed


def part_kind(part: Mapping[str, Any]) -> str | None:
    """What the engine takes a content part for, by vLLM's own rule: its ``type``, unless the part has no
    type or has a ``uuid``; then the first media key present. So ``{"image_url": ...}`` without a type, or a
    ``text`` part with a ``uuid`` and an ``image_url``, is an image."""
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        for key in _ENGINE_KEYS:
            if key in part:
                return key
    return kind if isinstance(kind, str) else None


def _walk(parts: list[Any], path: str, images: list[ImagePart], videos: list[VideoPart], depth: int) -> None:
    if depth > 4:  # tool results nest content; nothing legitimate goes deeper
        return
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping):
            continue
        where = f"{path}[{j}]"
        kind = part_kind(part)
        if kind in _VIDEO_TYPES:
            videos.append(VideoPart(where, part))
        elif kind in ("image_url", "input_image"):
            found = _openai_image(part, where)
            if found is not None:
                if found.source.startswith("data:video/"):
                    videos.append(VideoPart(where, part))
                else:
                    images.append(replace(found, ref=part))
        elif kind == "image":
            images.append(replace(_anthropic_image(part, where), ref=part))
        elif kind == "file" and _is_video_file(part.get("file")):
            videos.append(VideoPart(where, part))
        elif kind in _UNCOUNTABLE:
            raise ImageError.of(
                "unsupported_format", where,
                f"{kind} parts cannot be counted (their size is the client's); send the image itself", kind,
            )
        nested = part.get("content")
        if isinstance(nested, list):
            _walk(nested, f"{where}.content", images, videos, depth + 1)


_VIDEO_EXTENSIONS: Final = (".mp4", ".mov", ".avi", ".wmv", ".flv", ".mpeg", ".mpg", ".webm", ".mkv", ".m4v", ".3gp")


def _is_video_file(file: object) -> bool:
    """Whether LiteLLM turns this ``file`` part into a ``video_url`` for vLLM (its hosted_vllm transformation
    does, by the part's format, its data URL's type or its file id's extension)."""
    if not isinstance(file, Mapping):
        return False
    fmt, data, file_id = file.get("format"), file.get("file_data"), file.get("file_id")
    if isinstance(fmt, str) and fmt.lower().startswith("video/"):
        return True
    if isinstance(data, str) and data[:11].lower() == "data:video/":
        return True
    if isinstance(file_id, str):
        path = file_id.lower().split("?", 1)[0].split("#", 1)[0]
        return path.endswith(_VIDEO_EXTENSIONS)
    return False


def _openai_image(part: Mapping[str, Any], where: str) -> ImagePart | None:
    spec = part.get("image_url")
    detail = part.get("detail") if isinstance(part.get("detail"), str) else None
    if isinstance(spec, Mapping):
        url = spec.get("url")
        detail = spec.get("detail") if isinstance(spec.get("detail"), str) else detail
    else:
        url = spec
    if not isinstance(url, str) or not url:
        raise ImageError.of("invalid_url", where, "image_url has no url string", url)
    return _classify_url(url, where, detail)


def _classify_url(url: str, where: str, detail: str | None) -> ImagePart:
    head = url[:16].lower()
    if head.startswith("data:"):
        return ImagePart(where, url, True, detail)
    if head.startswith(("http://", "https://")):
        return ImagePart(where, url, False, detail)
    raise ImageError.of("invalid_url", where, "image URL must be a data: URL or an http(s) URL", url[:64])


def _anthropic_image(part: Mapping[str, Any], where: str) -> ImagePart:
    src = part.get("source")
    if not isinstance(src, Mapping):
        raise ImageError.of("invalid_url", where, "image block has no source object")
    kind = src.get("type")
    if kind == "base64":
        payload = src.get("data")
        if not isinstance(payload, str):
            raise ImageError.of("invalid_base64", where, "image source data must be a base64 string")
        return ImagePart(where, payload, True, None, bare_base64=True)
    if kind == "url" and isinstance(src.get("url"), str):
        return _classify_url(src["url"], where, None)
    raise ImageError.of(
        "unsupported_format", where, f"image source type {kind!r} is not supported (use base64 or url)", kind
    )


# -- decoding ------------------------------------------------------------------------------------


def payload_bytes(part: ImagePart, bounds: ImageBounds) -> bytearray:
    """The decoded bytes of an inline image (base64 checked strictly, size capped before decoding)."""
    text = part.source
    if not part.bare_base64:
        comma = text.find(",", 0, 512)
        if comma < 0:
            raise ImageError.of("invalid_url", part.where, "malformed data: URL (no comma)", text[:64])
        header = text[5:comma].lower()
        if not header.endswith(";base64"):
            media = header.split(";", 1)[0] or "text/plain"
            raise ImageError.of(
                "unsupported_format", part.where,
                f"data: URL of type {media!r} is not base64 image data (supported: {', '.join(SUPPORTED_FORMATS)})",
                media,
            )
        # Decoded in place from after the comma: a copy of the text would hold the interpreter for long.
        return decode_base64(text, part.where, bounds.max_bytes, start=comma + 1)
    return decode_base64(text, part.where, bounds.max_bytes)


_CHUNK: Final = 64 * 1024  # base64 characters decoded per step (a multiple of 4)
#: Characters a base64 payload may be wrapped with. vLLM parses a data: URL with ``urllib.parse``,
#: which drops tabs and line breaks before decoding; spaces are accepted here too (the engine refuses them).
_WRAPPING: Final = " \t\r\n"
_WRAPPING_BYTES: Final = _WRAPPING.encode("ascii")


def payload_chars(text: str, start: int = 0) -> int:
    """How many base64 characters ``text[start:]`` holds, not counting line breaks and other wrapping.

    Counted in steps, so that a thread counting a large image lets the event loop run in between."""
    wrapping = 0
    for pos in range(start, len(text), 16 * _CHUNK):
        wrapping += sum(text.count(c, pos, pos + 16 * _CHUNK) for c in _WRAPPING)
    return len(text) - start - wrapping


def decode_base64(text: str, where: str, max_bytes: int, start: int = 0) -> bytearray:
    """Strict standard base64 (line breaks tolerated, padding optional), at most ``max_bytes`` decoded.

    Decoded in fixed-size steps into one preallocated buffer, so peak memory is the decoded image
    plus one step, not the encoded text copied twice; no step holds the interpreter for long, so a
    worker thread decoding a large image leaves the event loop running. ``start``: where the base64
    text begins in ``text`` (after a data: URL's comma).
    """
    size = len(text) - start
    if size // 4 * 3 - 2 > max_bytes:  # cheap pre-check on the raw length, then without the wrapping
        chars = payload_chars(text, start)
        if chars * 3 // 4 - 2 > max_bytes:  # padding removes at most 2 bytes from chars * 3 / 4
            raise ImageError.of(
                "too_large", where, f"image payload of about {chars * 3 // 4} bytes exceeds the cap of "
                f"{max_bytes} bytes", chars * 3 // 4,
            )
    if not text.isascii():
        raise ImageError.of("invalid_base64", where, "image data is not valid base64 (non-ASCII characters)")
    # Decoding stops one step past the cap, so the buffer never needs more, however much wrapping there is.
    out = bytearray(min(size // 4 * 3 + 3, max_bytes + _CHUNK))
    filled = 0
    carry = b""  # characters of an incomplete 4-character group, kept for the next step
    padded = False
    try:
        for pos in range(start, len(text), _CHUNK):
            chunk = carry + text[pos:pos + _CHUNK].encode("ascii").translate(None, _WRAPPING_BYTES)
            last = pos + _CHUNK >= len(text)
            if padded and chunk:
                raise binascii.Error("data after the padding")
            if not last:
                cut = len(chunk) - len(chunk) % 4
                chunk, carry = chunk[:cut], chunk[cut:]
            if b"=" in chunk:
                body = chunk.rstrip(b"=")
                pads = len(chunk) - len(body)
                # Padding only ends the last group, and only as much as that group lacks.
                if b"=" in body or len(body) % 4 < 2 or pads > 4 - len(body) % 4:
                    raise binascii.Error("padding inside the data")
                padded = True
            if last:
                missing = -len(chunk) % 4
                if missing == 3:
                    raise ImageError.of("invalid_base64", where, "image data is not valid base64 (impossible length)")
                chunk += b"=" * missing
            piece = binascii.a2b_base64(chunk, strict_mode=True)
            out[filled:filled + len(piece)] = piece
            filled += len(piece)
            if filled > max_bytes:
                break  # over the cap: no need to decode the rest
    except (binascii.Error, ValueError):
        raise ImageError.of("invalid_base64", where, "image data is not valid base64") from None
    del out[filled:]
    if len(out) > max_bytes:
        raise ImageError.of(
            "too_large", where, f"image payload of {len(out)} or more bytes exceeds the cap of {max_bytes} bytes",
            len(out),
        )
    if not out:
        raise ImageError.of("truncated", where, "image data is empty")
    return out


# -- header parsing ---------------------------------------------------------------------------


def measure(part: ImagePart, bounds: ImageBounds | None = None) -> ImageInfo:
    """Format and size of an inline image part (raises :class:`ImageError` for any bad input)."""
    bounds = bounds or ImageBounds()
    return image_info(payload_bytes(part, bounds), part.where, bounds)


def image_info(raw: bytes | bytearray, where: str = "image", bounds: ImageBounds | None = None) -> ImageInfo:
    """Format and size from the bytes of an image file; checks the file is complete and sane."""
    bounds = bounds or ImageBounds()
    if len(raw) > bounds.max_bytes:
        raise ImageError.of(
            "too_large", where, f"image of {len(raw)} bytes exceeds the cap of {bounds.max_bytes} bytes", len(raw)
        )
    fmt = sniff(raw)
    parser = _PARSERS.get(fmt or "")
    if parser is None:
        if fmt is None:
            raise ImageError.of(
                "unsupported_format", where,
                f"not a recognised image (supported: {', '.join(SUPPORTED_FORMATS)})",
            )
        raise ImageError.of(
            "unsupported_format", where,
            f"unsupported image format {fmt!r} (supported: {', '.join(SUPPORTED_FORMATS)})", fmt,
        )
    try:
        width, height = parser(raw, where)
    except (struct.error, IndexError):
        raise ImageError.of("truncated", where, f"{fmt} header is truncated") from None
    if width <= 0 or height <= 0:
        raise ImageError.of("corrupt", where, f"{fmt} header declares an empty image ({width}x{height})")
    if width * height > bounds.max_pixels:
        raise ImageError.of(
            "too_many_pixels", where,
            f"{fmt} header declares {width}x{height} = {width * height} pixels, over the cap of "
            f"{bounds.max_pixels} (decompression-bomb guard)", width * height,
        )
    return ImageInfo(fmt or "", width, height, len(raw))


def sniff(raw: bytes | bytearray) -> str | None:
    """The format named by the magic bytes, supported or not (``None`` if unknown)."""
    if raw.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if raw.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "webp"
    if raw[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if raw[:2] == b"BM":
        return "bmp"
    if raw[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if raw[4:8] == b"ftyp":
        brand = raw[8:12]
        return "avif" if brand in (b"avif", b"avis") else "heic"
    if raw[:4] == b"\x00\x00\x01\x00":
        return "ico"
    if raw[:4] == b"%PDF":
        return "pdf"
    if raw[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or raw[:4] == b"\xff\x4f\xff\x51":
        return "jpeg2000"
    if raw[:2] == b"\xff\x0a" or raw[:12] == b"\x00\x00\x00\x0cJXL \r\n\x87\n":
        return "jxl"
    head = raw[:256].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")):
        return "svg"
    return None


def _png(raw: bytes | bytearray, where: str) -> tuple[int, int]:
    length, ctype = struct.unpack(">I4s", raw[8:16])
    if ctype != b"IHDR" or length != 13:
        raise ImageError.of("corrupt", where, "png does not start with an IHDR chunk")
    ihdr = raw[16:29]
    (crc,) = struct.unpack(">I", raw[29:33])
    if zlib.crc32(raw[12:29]) != crc:
        raise ImageError.of("corrupt", where, "png IHDR checksum mismatch")
    width, height = struct.unpack(">II", ihdr[:8])
    if width > 0x7FFFFFFF or height > 0x7FFFFFFF:
        raise ImageError.of("corrupt", where, "png dimensions out of range")
    end = raw.rfind(b"IEND", 33)
    if end < 0 or end + 8 > len(raw):  # the IEND chunk and its checksum must both be there
        raise ImageError.of("truncated", where, "png is truncated (no IEND chunk)")
    return width, height


_SOF: Final = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _jpeg(raw: bytes | bytearray, where: str) -> tuple[int, int]:
    pos, n = 2, len(raw)
    size: tuple[int, int] | None = None
    while True:
        if pos >= n:
            raise ImageError.of("truncated", where, "jpeg is truncated before its image data")
        if raw[pos] != 0xFF:
            raise ImageError.of("corrupt", where, f"jpeg marker expected at byte {pos}")
        while pos < n and raw[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            raise ImageError.of("truncated", where, "jpeg is truncated before its image data")
        marker = raw[pos]
        pos += 1
        if marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue
        if marker == 0xD9:
            raise ImageError.of("corrupt", where, "jpeg ends before any image data")
        (length,) = struct.unpack(">H", raw[pos:pos + 2])
        if length < 2:
            raise ImageError.of("corrupt", where, "jpeg segment length below 2")
        if marker in _SOF:
            if length < 8:
                raise ImageError.of("corrupt", where, "jpeg frame header too short")
            height, width = struct.unpack(">HH", raw[pos + 3:pos + 7])
            if height == 0:
                raise ImageError.of("unsupported_format", where, "jpeg with a height set later (DNL) is not supported")
            size = (width, height)
        if marker == 0xDA:
            if size is None:
                raise ImageError.of("corrupt", where, "jpeg scan starts before the frame header")
            if raw.rfind(b"\xff\xd9", pos + length) < 0:
                raise ImageError.of("truncated", where, "jpeg is truncated (no end-of-image marker)")
            return size
        pos += length


def _webp(raw: bytes | bytearray, where: str) -> tuple[int, int]:
    (riff_size,) = struct.unpack("<I", raw[4:8])
    if riff_size + 8 > len(raw):
        raise ImageError.of("truncated", where, f"webp is truncated ({len(raw)} of {riff_size + 8} bytes)")
    chunk, chunk_size = struct.unpack("<4sI", raw[12:20])
    if 20 + chunk_size > len(raw):
        raise ImageError.of("truncated", where, "webp first chunk is truncated")
    body = raw[20:20 + chunk_size]
    if chunk == b"VP8 ":
        if body[3:6] != b"\x9d\x01\x2a":
            raise ImageError.of("corrupt", where, "webp VP8 start code missing")
        w, h = struct.unpack("<HH", body[6:10])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        if body[0] != 0x2F:
            raise ImageError.of("corrupt", where, "webp VP8L signature missing")
        (bits,) = struct.unpack("<I", body[1:5])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        if len(body) < 10:
            raise ImageError.of("truncated", where, "webp VP8X header is truncated")
        return int.from_bytes(body[4:7], "little") + 1, int.from_bytes(body[7:10], "little") + 1
    raise ImageError.of("corrupt", where, f"webp first chunk {chunk!r} is not VP8, VP8L or VP8X")


def _gif(raw: bytes | bytearray, where: str) -> tuple[int, int]:
    width, height, flags = struct.unpack("<HHB", raw[6:11])
    pos, n = 13, len(raw)
    if flags & 0x80:
        pos += 3 << ((flags & 0x07) + 1)
    # Walk to the end of the first frame: a GIF without one cannot be decoded.
    while True:
        if pos >= n:
            raise ImageError.of("truncated", where, "gif is truncated before its first frame")
        block = raw[pos]
        if block == 0x21:  # extension: label, then data sub-blocks
            pos = _skip_sub_blocks(raw, pos + 2, where)
        elif block == 0x2C:  # image descriptor
            left, top, frame_w, frame_h, lflags = struct.unpack("<HHHHB", raw[pos + 1:pos + 10])
            pos += 10
            if lflags & 0x80:
                pos += 3 << ((lflags & 0x07) + 1)
            pos = _skip_sub_blocks(raw, pos + 1, where)  # +1: LZW minimum code size
            # Pillow (what vLLM decodes with) grows the canvas to hold the first frame, so a frame larger
            # than the logical screen is decoded at the frame's extent: count that, not the screen.
            return max(width, left + frame_w), max(height, top + frame_h)
        elif block == 0x3B:
            raise ImageError.of("corrupt", where, "gif has no frames")
        else:
            raise ImageError.of("corrupt", where, f"gif has an unknown block 0x{block:02x}")


def _skip_sub_blocks(raw: bytes | bytearray, pos: int, where: str) -> int:
    n = len(raw)
    while True:
        if pos >= n:
            raise ImageError.of("truncated", where, "gif is truncated inside a data block")
        size = raw[pos]
        pos += 1 + size
        if size == 0:
            return pos


def _bmp(raw: bytes | bytearray, where: str) -> tuple[int, int]:
    offset, dib = struct.unpack("<II", raw[10:18])
    if dib == 12:
        width, height, _planes, bpp = struct.unpack("<HHHH", raw[18:26])
        compression = 0
    elif dib in (16, 40, 52, 56, 64, 108, 124):
        width, height, _planes, bpp = struct.unpack("<iiHH", raw[18:30])
        compression = struct.unpack("<I", raw[30:34])[0] if dib >= 20 else 0
    else:
        raise ImageError.of("corrupt", where, f"bmp header size {dib} is not a known BMP variant")
    if width <= 0 or height == 0 or bpp not in (1, 2, 4, 8, 16, 24, 32, 64):
        raise ImageError.of("corrupt", where, f"bmp header declares {width}x{height} at {bpp} bits per pixel")
    height = abs(height)  # negative: rows stored top-down
    if compression in (0, 3, 6):  # uncompressed or bit-fields: the pixel array size is known
        row = (bpp * width + 31) // 32 * 4
        if offset + row * height > len(raw):
            raise ImageError.of(
                "truncated", where, f"bmp is truncated ({len(raw)} bytes, pixels need {offset + row * height})"
            )
    return width, height


_PARSERS: Final = {"png": _png, "jpeg": _jpeg, "webp": _webp, "gif": _gif, "bmp": _bmp}

