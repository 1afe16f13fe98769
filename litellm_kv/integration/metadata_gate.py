"""The save-time check of litellm-kv limits in key and team metadata, on LiteLLM's own management routes.

LiteLLM 1.110.2 offers no hook that sees every write of key and team metadata: ``custom_key_generate``
covers ``/key/generate`` only (and belongs to the operator), ``custom_key_update`` ``/key/update`` only,
and ``custom_team_metadata_validate`` is an Enterprise feature; ``team_metadata_schema`` is advisory (it
only pre-fills the team editor). So litellm-kv checks the request body itself, in front of the proxy's
app: a write whose ``metadata`` carries a malformed ``litellm_kv`` object is answered 400, naming every
bad field (:func:`litellm_kv.governance.metadata.validate_metadata`), before LiteLLM stores anything. The
admin UI and the API send the same routes, so neither can save what the request path would refuse.

The check runs before LiteLLM's authentication: a caller who may not write the key sees the metadata
error first, which tells them nothing but what their own body holds.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from litellm_kv.governance.metadata import FieldError, validate_metadata
from litellm_kv.integration.asgi import (
    ASGIApp,
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    answer,
    app_path,
    read_body,
    replay,
    wrap_app,
)
from litellm_kv.observability import counter

log = logging.getLogger("litellm_kv")

#: Largest body of a gated route that is read and checked; a bigger one is refused (413), never let
#: through unchecked. Key and team writes are a few KiB.
MAX_BODY_BYTES = 1 << 20

REFUSED = counter(
    "metadata_refused",
    "Key/team writes refused at save time because their litellm_kv metadata is malformed, by route.",
    ["route"],
)


@dataclass(frozen=True, slots=True)
class GatedRoute:
    """One LiteLLM route that writes key or team metadata: where the metadata sits in its body."""

    method: str
    pattern: re.Pattern[str]
    owner: str  # "key" or "team", for messages
    metadata_at: tuple[str, ...] = ("metadata",)


def _route(method: str, path: str, owner: str, *at: str) -> GatedRoute:
    return GatedRoute(method, re.compile(path), owner, at or ("metadata",))


#: Every route of LiteLLM 1.110.2 whose body writes a key's or a team's ``metadata`` (the admin UI uses
#: /key/generate, /key/update, /team/new, /team/update). ``/user/new`` creates the user's first key
#: with the body's metadata.
GATED_ROUTES: tuple[GatedRoute, ...] = (
    _route("POST", r"/key/generate", "key"),
    _route("POST", r"/key/service-account/generate", "key"),
    _route("POST", r"/key/update", "key"),
    _route("POST", r"/key/regenerate", "key"),
    _route("POST", r"/key/.+/regenerate", "key"),
    _route("POST", r"/team/key/bulk_update", "key", "update_fields", "metadata"),
    _route("POST", r"/user/new", "key"),
    _route("POST", r"/team/new", "team"),
    _route("POST", r"/team/update", "team"),
    _route("PATCH", r"/team/[^/]+", "team"),
)


def gated_route(method: str, path: str) -> GatedRoute | None:
    """The gated route ``method path`` is (trailing slash ignored), or ``None``."""
    path = path.rstrip("/") or "/"
    for route in GATED_ROUTES:
        if route.method == method and route.pattern.fullmatch(path):
            return route
    return None


def _owner_label(route: GatedRoute, body: Mapping[str, Any]) -> str:
    # Aliases only: the key itself (a secret) never goes into a message.
    if route.owner == "team":
        name = body.get("team_alias") or body.get("team_id")
        return f"team {name[:64]!r}" if isinstance(name, str) else "team"
    alias = body.get("key_alias")
    return f"key {alias[:64]!r}" if isinstance(alias, str) else "key"


def _metadata_of(route: GatedRoute, body: Any) -> tuple[bool, Any]:
    node = body
    for name in route.metadata_at:
        if not isinstance(node, Mapping) or node.get(name) is None:
            return False, None
        node = node[name]
    return True, node


def check_body(route: GatedRoute, raw: bytes, metadata_key: str) -> list[FieldError]:
    """The problems of the litellm-kv settings a write on ``route`` would store (``[]``: let it through).

    A body that is not JSON, or carries no metadata, is LiteLLM's to judge: nothing litellm-kv reads.
    """
    try:
        body = json.loads(raw) if raw.strip() else None
    except (ValueError, RecursionError):
        return []
    if not isinstance(body, Mapping):
        return []
    present, metadata = _metadata_of(route, body)
    if not present or not isinstance(metadata, Mapping) or metadata_key not in metadata:
        return []
    return validate_metadata(metadata, metadata_key=metadata_key, where=_owner_label(route, body))


def refusal(errors: list[FieldError]) -> dict[str, Any]:
    """The 400 body, in the shape of LiteLLM's own errors (``error.message`` is what its UI shows)."""
    return {
        "error": {
            "message": "litellm-kv limits not saved: " + "; ".join(e.message for e in errors),
            "type": "invalid_litellm_kv_metadata",
            "param": errors[0].path,
            "code": "400",
            "fields": [e.to_json() for e in errors],
        }
    }


class MetadataGate:
    """ASGI wrapper in front of the proxy's app: reads the body of a gated route, refuses (400) a write
    whose litellm-kv metadata is malformed, and otherwise replays the body to the app unchanged."""

    def __init__(self, app: ASGIApp, metadata_key: Callable[[], str]) -> None:
        self.app = app
        self.metadata_key = metadata_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = gated_route(str(scope.get("method", "")), app_path(scope)) if scope.get("type") == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        try:
            raw = await read_body(receive, MAX_BODY_BYTES)
        except BodyTooLarge:
            await answer(send, 413, {"error": {
                "message": f"litellm-kv: a key or team write is limited to {MAX_BODY_BYTES} bytes",
                "type": "request_too_large", "code": "413"}})
            return
        if raw is None:
            return  # the client went away before the body was complete: nothing to store
        try:
            errors = check_body(route, raw, self.metadata_key())
        except Exception:
            # A limit is at stake: do not store what could not be checked.
            log.exception("litellm-kv: cannot check the metadata of %s %s", route.method, route.pattern.pattern)
            await answer(send, 500, {"error": {
                "message": "litellm-kv could not check the litellm_kv metadata; nothing was saved",
                "type": "internal_error", "code": "500"}})
            return
        if errors:
            REFUSED.labels(route.pattern.pattern).inc()
            await answer(send, 400, refusal(errors))
            return
        await self.app(scope, replay(raw, receive), send)


def install(app: Any, metadata_key: Callable[[], str]) -> None:
    """Put the gate in front of ``app`` (a Starlette/FastAPI app), once (see :func:`asgi.wrap_app`)."""
    wrap_app(app, "litellm_kv_metadata_gate", lambda inner: MetadataGate(inner, metadata_key), MetadataGate,
             metadata_key=metadata_key)
