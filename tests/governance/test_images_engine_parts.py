"""Media in every message role and content-part form the engine accepts is found and counted.

vLLM reads content parts of every role (system, user, assistant, tool) with one rule
(``vllm/renderers/chat_utils.py`` ``_parse_chat_message_content_mm_part``): a part's ``type`` when it
has one and no ``uuid``; otherwise the first media key it holds. LiteLLM checks ``type`` on user
messages only. An image the proxy does not find is not counted against ``max_images_per_request``,
``max_visual_tokens_per_request`` or the period budgets, nor a video against ``videos: reject``
(LiteLLM turns ``file`` parts holding a video into ``video_url``). The last test runs vLLM's own function (in
``.venv-engine``) over the same parts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from litellm_kv.governance.images import ImageError, find_media, part_kind

PNG = "data:image/png;base64,iVBORw0KGgo="
URL = "https://example.com/cat.png"

# Parts and what the engine takes them for (None: not media).
PARTS: list[tuple[dict[str, Any], str | None]] = [
    ({"image_url": {"url": PNG}}, "image_url"),
    ({"image_url": URL}, "image_url"),
    ({"type": "image_url", "image_url": {"url": PNG}}, "image_url"),
    ({"type": "input_image", "image_url": PNG, "detail": "auto"}, "input_image"),
    ({"type": "input_image", "image_url": PNG}, "input_image"),  # vLLM refuses it (no detail): counted all the same
    ({"type": "text", "text": "hi", "uuid": "u1", "image_url": {"url": PNG}}, "image_url"),
    ({"type": "text", "text": "hi", "image_url": {"url": PNG}}, "text"),
    ({"type": "video_url", "uuid": "u2", "image_url": {"url": PNG}}, "image_url"),
    ({"video_url": {"url": "https://example.com/v.mp4"}}, "video_url"),
    ({"image_embeds": "AAAA"}, "image_embeds"),
    ({"type": "text", "text": "hi"}, "text"),
    ({"text": "no type, no media"}, None),
]


@pytest.mark.parametrize("part,kind", PARTS)
def test_max_visual_tokens_part_kind_follows_the_engine(part: dict[str, Any], kind: str | None) -> None:
    assert part_kind(part) == kind


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool", "developer"])
def test_max_visual_tokens_untyped_image_parts_are_found_in_every_role(role: str) -> None:
    body = {"messages": [{"role": role, "content": [{"type": "text", "text": "see"}, {"image_url": {"url": PNG}},
                                                    {"image_url": URL}]}]}
    images, videos = find_media(body)
    assert [(p.where, p.inline) for p in images] == [("messages[0].content[1]", True),
                                                      ("messages[0].content[2]", False)]
    assert videos == []


def test_max_visual_tokens_text_part_with_uuid_is_an_image() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "uuid": "u1", "image_url": {"url": PNG}}]}]}
    assert [p.where for p in find_media(body)[0]] == ["messages[0].content[0]"]


def test_max_visual_tokens_cached_image_by_uuid_only_is_refused() -> None:
    # A uuid with no image refers to an image the engine cached earlier: its size is unknown here.
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "uuid": "u1", "image_url": None}]}]}
    with pytest.raises(ImageError) as err:
        find_media(body)
    assert err.value.limit_name == "image.invalid_url"


@pytest.mark.parametrize("part", [{"image_embeds": "AAAA"}, {"type": "image_embeds", "image_embeds": "AAAA"}])
def test_max_visual_tokens_image_embeds_cannot_be_counted(part: dict[str, Any]) -> None:
    with pytest.raises(ImageError) as err:
        find_media({"messages": [{"role": "assistant", "content": [part]}]})
    assert err.value.limit_name == "image.unsupported_format"
    assert "image_embeds" in err.value.message


def test_max_images_per_request_responses_tool_output_and_anthropic_system() -> None:
    body = {
        "system": [{"type": "text", "text": "s"}, {"type": "image", "source": {"type": "url", "url": URL}}],
        "input": [{"type": "function_call_output", "call_id": "c1",
                   "output": [{"type": "input_image", "image_url": PNG}]}],
    }
    assert [p.where for p in find_media(body)[0]] == ["system[1]", "input[0].output[0]"]


@pytest.mark.parametrize("file", [
    {"file_data": "data:video/mp4;base64,AAAA"}, {"format": "video/mp4", "file_id": "file-1"},
    {"file_id": "https://example.com/clip.MP4?sig=1"},
])
def test_videos_file_parts_litellm_turns_into_videos_are_videos(file: dict[str, Any]) -> None:
    # LiteLLM's hosted_vllm transformation rewrites these as video_url parts for vLLM.
    body = {"messages": [{"role": "user", "content": [{"type": "file", "file": file}]}]}
    assert [v.where for v in find_media(body)[1]] == ["messages[0].content[0]"]


def test_videos_other_file_parts_are_not_media() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,AAAA"}}]}]}
    assert find_media(body) == ([], [])


ENGINE_PYTHON = Path(__file__).resolve().parents[2] / ".venv-engine" / "bin" / "python"
_ENGINE_SCRIPT = """
import json, sys
from vllm.renderers.chat_utils import _parse_chat_message_content_mm_part
out = []
for part in json.load(sys.stdin):
    try:
        kind, _ = _parse_chat_message_content_mm_part(part)
    except Exception:
        kind = "refused"
    out.append(kind)
print(json.dumps(out))
"""


@pytest.mark.skipif(not ENGINE_PYTHON.exists(), reason="needs the engine venv (.venv-engine) with vLLM")
def test_max_visual_tokens_part_kinds_agree_with_vllm() -> None:
    media = [part for part, _ in PARTS]
    run = subprocess.run([str(ENGINE_PYTHON), "-c", _ENGINE_SCRIPT], input=json.dumps(media), text=True,
                         capture_output=True, timeout=240, check=True)
    engine = json.loads(run.stdout.strip().splitlines()[-1])
    # vLLM refuses these two (the request fails there), and only these: every other part is compared below.
    assert [part for part, theirs in zip(media, engine, strict=True) if theirs == "refused"] == [
        {"type": "input_image", "image_url": PNG}, {"text": "no type, no media"}]
    # Where vLLM takes a part for media, so does litellm-kv; a part vLLM refuses costs nothing.
    for part, theirs in zip(media, engine, strict=True):
        ours = part_kind(part)
        if theirs == "refused":
            continue
        if theirs in ("image_url", "input_image", "image_embeds", "video_url"):
            assert ours == theirs, (part, theirs, ours)
        else:
            assert ours not in ("image_url", "input_image", "image_embeds", "video_url"), (part, theirs, ours)
