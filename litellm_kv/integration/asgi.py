"""What litellm-kv's checks in front of the proxy's app share: ASGI types, a JSON answer, a body read and
replayed, and putting a wrapper in front of an app that may already be running."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def app_path(scope: Scope) -> str:
    """The request's path within the app (``root_path`` removed)."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", "") or "")
    return path[len(root):] if root and path.startswith(root) else path


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body; ``None`` when the client went away before it was complete; raises
    :class:`BodyTooLarge` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message.get("type") != "http.request":
            return None
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        more = bool(message.get("more_body", False))
    return b"".join(chunks)


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit


def replay(raw: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then whatever comes next."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return again


async def answer(send: Send, status: int, body: Mapping[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def wrap_app(app: Any, marker: str, wrapper: Callable[[ASGIApp], ASGIApp], cls: type, **kwargs: Any) -> None:
    """Put a wrapper in front of ``app`` (a Starlette/FastAPI app), once per ``marker``.

    LiteLLM loads callbacks while its app runs its lifespan, after Starlette has built the middleware stack
    (``add_middleware`` then refuses): the built stack is wrapped instead. Before that, ``cls`` is added as an
    ordinary middleware with ``kwargs``."""
    if getattr(app.state, marker, False):
        return
    setattr(app.state, marker, True)
    if app.middleware_stack is None:
        app.add_middleware(cls, **kwargs)
    else:
        app.middleware_stack = wrapper(app.middleware_stack)
