"""What routing takes from a call's vision count (``routing_hooks._image_items``) and what the vision hook
sends the engine (``vision_hooks.set_image_uuids``): pure functions over request dicts, no proxy needed
(the real proxy and engines run in tests/integration/test_image_routing.py)."""

from __future__ import annotations

import json
from typing import Any

from litellm_kv.integration.routing_hooks import _chat_request, _image_items
from litellm_kv.integration.vision_hooks import engine_processor_kwargs, set_image_uuids
from litellm_kv.vllm.multimodal import ImageItem

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


def _req(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"model": "g", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}


def _img(url: str = "data:image/png;base64,AAAA") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _vision(*images: dict[str, Any], family: str = "qwen2_5_vl", **kw: Any) -> dict[str, Any]:
    return {"family": family, "images": list(images), "max_pixels": None, **kw}


def test_counted_images_become_routing_items_in_order() -> None:
    req = _req(_img(), _img("http://h/x.png"))
    vision = _vision({"identifier": A, "tokens": 64}, {"identifier": B, "tokens": 4})
    assert _image_items(req, vision) == (ImageItem(A, 64), ImageItem(B, 4))
    chat = _chat_request(req, [], vision)
    assert chat.images == (ImageItem(A, 64), ImageItem(B, 4)) and not chat.has_unhashable_media


def test_images_that_cannot_be_hashed_exactly_route_by_load() -> None:
    req = _req(_img(), _img("http://h/x.png"))
    ok = {"identifier": A, "tokens": 64}
    # A remote image that was not fetched has no identifier (the engine would hash its own download).
    assert _image_items(req, _vision(ok, {"identifier": None, "tokens": 1280})) is None
    # A family whose placeholders are not modelled.
    assert _image_items(req, _vision(ok, ok, family="openai")) is None
    # The count does not line up with the request's images.
    assert _image_items(req, _vision(ok)) is None
    # A video beside the images.
    assert _image_items(_req(_img(), {"type": "video_url", "video_url": {"url": "http://h/v.mp4"}}),
                        _vision(ok)) is None
    # Absurd counts.
    assert _image_items(_req(_img()), _vision({"identifier": A, "tokens": True})) is None
    assert _image_items(_req(_img()), _vision({"identifier": A, "tokens": 0})) is None
    # No vision count for the call (a group without a vision section): routed by load.
    chat = _chat_request(_req(_img()), [], None)
    assert chat.has_unhashable_media and chat.images == ()


def test_processor_kwargs_are_the_engines() -> None:
    assert engine_processor_kwargs(None, _vision()) is None
    assert engine_processor_kwargs({"min_pixels": 3136}, _vision(max_pixels=50_000)) == {"min_pixels": 3136,
                                                                                      "max_pixels": 50_000}
    chat = _chat_request({**_req(_img()), "mm_processor_kwargs": {"max_pixels": 20_000}}, [],
                         _vision({"identifier": A, "tokens": 16}))
    assert chat.mm_processor_kwargs == {"max_pixels": 20_000}


def test_the_engine_gets_the_proxys_identifiers_and_the_counted_bytes() -> None:
    req = _req({**_img(), "uuid": "client-chosen"}, _img("http://h/x.png"), {**_img("http://h/y.png"), "uuid": "c2"})
    counted = _vision({"identifier": A, "tokens": 64}, {"identifier": B, "tokens": 4},
                      {"identifier": None, "tokens": 1280})
    set_image_uuids(req, counted, {1: "data:image/png;base64,QUJD"})
    parts = req["messages"][0]["content"]
    assert parts[1]["uuid"] == A
    # A fetched remote image goes to the engine as the bytes that were counted, under their identifier.
    assert parts[2] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}, "uuid": B}
    # One that was not fetched keeps its URL and gets no identifier: the engine hashes what it downloads.
    assert parts[3] == {"type": "image_url", "image_url": {"url": "http://h/y.png"}}


def test_a_kv_group_never_forwards_a_clients_media_uuid() -> None:
    """Whether or not the group has a vision section: vLLM would reuse what it cached under that uuid."""
    import asyncio

    from litellm_kv.config import Settings, parse_section
    from litellm_kv.integration.hooks import Caller, ProxyRequest
    from litellm_kv.integration.routing_hooks import KVRoutingHandler

    settings = parse_section(Settings, {"model_groups": {"g": {"routing": "kv"}}}, "litellm_kv")
    data = _req({**_img(), "uuid": "victims-image"}, {"type": "text", "text": "x", "uuid": "u2",
                                                       "image_url": {"url": "http://h/z.png"}})
    data["messages"].append({"role": "tool", "content": [{"type": "tool_result", "content": [
        {**_img(), "uuid": "nested"}]}]})
    req = ProxyRequest(data=data, caller=Caller(key_alias="k"), model_group="g", call_type="acompletion",
                       settings=settings, group=settings.group("g"), record_key="call-1")
    asyncio.run(KVRoutingHandler(settings).pre_call(req))
    assert "uuid" not in json.dumps(data)


def test_media_is_found_by_vllms_rule_not_only_by_type() -> None:
    """An untyped part with an ``image_url`` (vLLM reads it as an image) and an image inside a tool result
    are media: without a vision count such requests are routed by load, never hashed as text."""
    untyped = {"model": "g", "messages": [{"role": "user", "content": [{"image_url": {"url": "data:x"}}]}]}
    nested = {"model": "g", "messages": [{"role": "tool", "content": [{"type": "tool_result", "content": [
        _img()]}]}]}
    text_only = {"model": "g", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert _chat_request(untyped, [], None).has_unhashable_media
    assert _chat_request(nested, [], None).has_unhashable_media
    assert not _chat_request(text_only, [], None).has_unhashable_media
