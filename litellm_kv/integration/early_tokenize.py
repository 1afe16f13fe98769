"""Hand a chat request's prompt to the early encoder as soon as its body arrives (``kv.early_tokenize_chars``).

An ASGI wrapper in front of the proxy's app: for a ``POST …/chat/completions`` that carries an API key and a
``Content-Length`` (a few KiB to :data:`MAX_BODY_BYTES`), it reads the body and gives it, read as the routing
hook reads it, to the model group it names (``KVRoutingHandler.tokenize_early``, then
:meth:`litellm_kv.routing.group.KVGroup.tokenize_early`, which renders the prompt and queues its long segments
for a worker thread), then replays the body to the app unchanged. What it costs the event loop is a JSON parse
and a template render, a fraction of a millisecond at 8K tokens; the encode it starts would otherwise run inside
the routing decision.

This runs before LiteLLM authenticates the request, and decides nothing: the routing decision uses the ids
only for the exact text it renders itself, after authentication and every hook. An unauthenticated caller can
make the worker thread encode (one thread, a few segments queued at most, then nothing more is queued), which
is work of the order of LiteLLM's own parse of the same body. Any failure here is logged at debug level and
the request goes on as if this did not exist.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from litellm_kv.integration.asgi import ASGIApp, Message, Receive, Scope, Send, app_path, replay, wrap_app

log = logging.getLogger("litellm_kv")

#: Bodies shorter than this are not looked at: their prompts are too short to be worth encoding early.
MIN_BODY_BYTES = 4096
#: Bodies longer than this are not read here (LiteLLM reads them as usual).
MAX_BODY_BYTES = 8 << 20
#: Any of these headers marks a request that carries an API key (LiteLLM's own names for one).
KEY_HEADERS = (b"authorization", b"x-litellm-api-key", b"api-key", b"x-api-key", b"x-goog-api-key")


def worth_reading(scope: Scope) -> bool:
    """A chat completion with an API key and a declared body length within the bounds."""
    if scope.get("type") != "http" or scope.get("method") != "POST" or not app_path(scope).endswith(
            "/chat/completions"):
        return False
    length = -1
    key = False
    for name, value in scope.get("headers") or []:
        name = name.lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return False
        elif name in KEY_HEADERS and value:
            key = True
    return key and MIN_BODY_BYTES <= length <= MAX_BODY_BYTES


async def _read_all(receive: Receive) -> tuple[list[Message], bytes | None]:
    """Every message up to the body's end, and the body (None when something else came first: a disconnect)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            return messages, None
        chunks.append(bytes(message.get("body", b"")))
        if not message.get("more_body", False):
            return messages, b"".join(chunks)


def _replay_messages(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def again() -> Message:
        return pending.pop(0) if pending else await receive()

    return again


class EarlyTokenize:
    """ASGI wrapper: see the module's docstring."""

    def __init__(self, app: ASGIApp, handler: Callable[[], Any]) -> None:
        """``handler``: the KV routing handler, or None (not started, no KV routing)."""
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not worth_reading(scope):
            await self.app(scope, receive, send)
            return
        messages, raw = await _read_all(receive)
        if raw is None:
            await self.app(scope, _replay_messages(messages, receive), send)
            return
        try:
            self.start(raw)
        except Exception as exc:  # never the request's problem
            log.debug("litellm-kv: early tokenize skipped: %s: %s", type(exc).__name__, exc)
        await self.app(scope, replay(raw, receive), send)

    def start(self, raw: bytes) -> int:
        """Queue the prompt's long segments with the group the body names; the number queued."""
        handler = self.handler()
        if handler is None:
            return 0
        body = json.loads(raw)
        return int(handler.tokenize_early(body)) if isinstance(body, dict) else 0


def install(app: Any, handler: Callable[[], Any]) -> None:
    """Put the wrapper in front of ``app`` (a Starlette/FastAPI app), once (see :func:`asgi.wrap_app`)."""
    wrap_app(app, "litellm_kv_early_tokenize", lambda inner: EarlyTokenize(inner, handler), EarlyTokenize,
             handler=handler)
