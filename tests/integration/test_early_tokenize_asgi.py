"""The early-tokenize wrapper as an ASGI app around a recording app: which requests it reads, that the app gets
every body byte for byte whatever happens, and that its failures never reach the request. ``Group`` stands in
for a KV group (the real one, with a real tokenizer, is ``tests/routing/test_early_tokens.py``; through a real
proxy, ``test_routing_e2e.py::test_a_long_prompt_is_encoded_while_litellm_authenticates_it``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from litellm_kv.config import Settings
from litellm_kv.integration.early_tokenize import MAX_BODY_BYTES, MIN_BODY_BYTES, EarlyTokenize
from litellm_kv.integration.routing_hooks import KVRoutingHandler
from litellm_kv.routing.group import ChatRequest
from tests.integration.test_metadata_gate import Recorder


class Group:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.requests: list[ChatRequest] = []

    def tokenize_early(self, request: ChatRequest) -> int:
        if self.fail:
            raise RuntimeError("template failed")
        self.requests.append(request)
        return 1


def kv(groups: Mapping[str, Any]) -> KVRoutingHandler:
    """A real KV routing handler (no config) whose started groups are ``groups``."""
    handler = KVRoutingHandler(Settings())
    handler.groups = dict(groups)
    return handler


def body(model: str = "kv", chars: int = 2 * MIN_BODY_BYTES) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "x" * chars}]}).encode()


def call(wrapper: EarlyTokenize, raw: bytes, path: str = "/v1/chat/completions", method: str = "POST",
         headers: dict[str, str] | None = None, chunk: int = 0, disconnect: bool = False) -> int:
    parts = [raw[i:i + chunk] for i in range(0, len(raw), chunk)] if chunk else [raw]
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                                      for i, p in enumerate(parts)]
    if disconnect:
        messages = [*messages[:1], {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    hdrs = {"authorization": "Bearer sk-1", "content-length": str(len(raw))} if headers is None else headers
    scope = {"type": "http", "method": method, "path": path, "root_path": "",
             "headers": [(k.encode(), v.encode()) for k, v in hdrs.items()]}
    asyncio.run(wrapper(scope, receive, send))
    return int(sent[0]["status"])


def test_a_long_chat_body_with_a_key_goes_to_its_group_and_on_to_the_app_unchanged() -> None:
    app, group = Recorder(), Group()
    wrapper = EarlyTokenize(app, lambda: kv({"kv": group}))
    raw = body()
    for path in ("/v1/chat/completions", "/chat/completions", "/openai/deployments/kv/chat/completions"):
        assert call(wrapper, raw, path, chunk=1000) == 200
    assert app.bodies == [raw] * 3
    assert [r.messages for r in group.requests] == [json.loads(raw)["messages"]] * 3


def test_requests_it_does_not_look_at_reach_the_app_untouched() -> None:
    app, group = Recorder(), Group()
    wrapper = EarlyTokenize(app, lambda: kv({"kv": group}))
    raw, short = body(), body(chars=10)
    cases = [
        dict(raw=raw, headers={"content-length": str(len(raw))}),  # no API key
        dict(raw=raw, headers={"authorization": "Bearer sk-1"}),  # no Content-Length (chunked)
        dict(raw=raw, headers={"authorization": "Bearer sk-1", "content-length": "nan"}),
        dict(raw=short),  # too short to be worth it
        dict(raw=raw, headers={"authorization": "Bearer sk-1", "content-length": str(MAX_BODY_BYTES + 1)}),
        dict(raw=raw, path="/v1/embeddings"),
        dict(raw=raw, method="GET"),
        dict(raw=body(model="other")),  # not a KV group
        dict(raw=body(model=["kv"])),  # type: ignore[arg-type]
    ]
    for case in cases:
        assert call(wrapper, **case) == 200  # type: ignore[arg-type]
    assert group.requests == []
    assert len(app.bodies) == len(cases) and app.bodies[0] == raw


def test_every_failure_stays_its_own() -> None:
    app = Recorder()
    raw = body()
    for wrapper in (EarlyTokenize(app, lambda: kv({"kv": Group(fail=True)})),  # the group raises
                    EarlyTokenize(app, lambda: 1 / 0),  # type: ignore[arg-type,return-value]
                    EarlyTokenize(app, lambda: kv({"kv": Group()}))):
        bad = b"{not json" + b" " * MIN_BODY_BYTES
        assert call(wrapper, raw) == 200
        assert call(wrapper, bad) == 200
    assert app.bodies == [raw, b"{not json" + b" " * MIN_BODY_BYTES] * 3


def test_a_client_gone_before_its_body_ends_is_passed_on_as_it_came() -> None:
    app, group = Recorder(), Group()
    wrapper = EarlyTokenize(app, lambda: kv({"kv": group}))
    raw = body()
    # The recording app sees the first chunk, then the disconnect (it stops at the first message without more_body).
    assert call(wrapper, raw, chunk=1000, disconnect=True) == 200
    assert app.bodies == [raw[:1000]] and group.requests == []
