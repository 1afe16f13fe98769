"""Admin routes litellm-kv adds to the LiteLLM proxy app.

* ``GET /litellm-kv/health`` — per model group: exact or not and why, replicas (ready, block size,
  hash algorithm, load gauges, subscriber state: connected, last seq, gaps, replays, purges), tokenizer path,
  the cost model's learned rates and its TTFT prediction error (``?ttft_errors_since=<responses>`` adds the errors
  recorded after that count, one by one), and the state of each Redis store's circuit breaker on the routing
  path (``redis``).
* ``POST /litellm-kv/route`` — which replica holds this prompt: body = a chat request; answer = the
  decision and the predicted cached tokens per replica, without sending anything upstream.
* ``GET /litellm-kv/metrics`` — litellm-kv's Prometheus metrics (also on LiteLLM's ``/metrics``
  when the ``prometheus`` callback is on).
* ``GET /litellm-kv/metadata-schema`` — the JSON Schema of the ``litellm_kv`` object of key and team
  metadata (any valid key may read it).
* ``GET /litellm-kv/ui`` — the admin page (:mod:`litellm_kv.integration.admin_page`): a static page with no
  data in it, which reads ``/litellm-kv/admin/owner``, ``/check`` and ``/fleet`` with the admin's credentials.

The others (all but the schema and the page's static files) need a proxy admin key (``Authorization: Bearer
<master key>`` or an admin virtual key, such as the one LiteLLM's admin UI signs in with).
Registering the routes also puts :mod:`litellm_kv.integration.metadata_gate` in front of the app, so
key and team writes with malformed litellm-kv metadata are refused before LiteLLM stores them, and
:mod:`litellm_kv.integration.early_tokenize`, which starts encoding a long prompt while LiteLLM authenticates it.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route functions' annotations, and as
# strings it cannot resolve names imported inside register() (POST /route then answered 422, taking its
# ``request: Request`` parameter for a query field).
import logging
from typing import Any, Protocol

from litellm_kv.config import Settings
from litellm_kv.governance.metadata import metadata_json_schema
from litellm_kv.integration.early_tokenize import install as install_early_tokenize
from litellm_kv.integration.governance import GroupNames
from litellm_kv.integration.hooks import Handler
from litellm_kv.integration.metadata_gate import install as install_metadata_gate
from litellm_kv.integration.passthrough_gate import install as install_passthrough_gate
from litellm_kv.integration.refusals import RecentRefusals
from litellm_kv.integration.workers import status as workers_status
from litellm_kv.redis_client import guard_status
from litellm_kv.redis_eviction import status as eviction_status

log = logging.getLogger("litellm_kv")
_registered = False


class HandlerSet(Protocol):
    """What the routes read from the callback: its feature handlers, once started."""

    @property
    def handlers(self) -> list[Handler]: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def refusals(self) -> RecentRefusals: ...

    @property
    def group_names(self) -> GroupNames: ...

    def handler(self, name: str) -> Handler | None: ...

    async def ensure_started(self) -> None: ...


def register(callback: HandlerSet | Handler) -> None:
    """Add the routes to ``litellm.proxy.proxy_server.app`` (once), serving ``callback``'s handlers.

    The callback passes itself, so this module never imports it. A single handler (the KV routing
    handler still registers from its own start-up) cannot answer for the others: that call only
    returns, the callback having registered the routes when it was loaded.
    """
    global _registered
    if _registered or isinstance(callback, Handler):
        return
    from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
    from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth
    from litellm.proxy.auth.user_api_key_auth import user_api_key_auth
    from litellm.proxy.proxy_server import app
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    router = APIRouter(prefix="/litellm-kv", tags=["litellm-kv"])

    def _admin(auth: UserAPIKeyAuth) -> None:
        if auth.user_role not in (LitellmUserRoles.PROXY_ADMIN, LitellmUserRoles.PROXY_ADMIN.value):
            raise HTTPException(status_code=403, detail="litellm-kv admin routes need a proxy admin key")

    async def _kv() -> Any:
        await callback.ensure_started()
        return callback.handler("kv")

    @router.get("/health")
    async def health(ttft_errors_since: int | None = Query(default=None, ge=0, le=2**62),
                     auth: UserAPIKeyAuth = Depends(user_api_key_auth)) -> dict[str, Any]:
        _admin(auth)
        kv = await _kv()
        return {
            "handlers": [h.name for h in callback.handlers],
            "routing": kv.health(ttft_errors_since) if kv is not None else None,
            # Deadline and circuit breaker of each Redis store on the routing path (index, load, pins).
            "redis": guard_status(),
            # Worker processes, and what each keeps for itself when there are several.
            "workers": workers_status(callback.settings),
            # Each Redis the stores use: whether it may delete their keys when full, and whether it has.
            "redis_eviction": eviction_status(),
        }

    @router.post("/route")
    async def route(request: Request, auth: UserAPIKeyAuth = Depends(user_api_key_auth)) -> dict[str, Any]:
        _admin(auth)
        kv = await _kv()
        if kv is None:
            raise HTTPException(status_code=404, detail="KV routing is not configured")
        body = await request.json()
        result: dict[str, Any] = await kv.explain(body)
        return result

    @router.get("/metrics")
    async def metrics(auth: UserAPIKeyAuth = Depends(user_api_key_auth)) -> Response:
        _admin(auth)
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @router.get("/metadata-schema")
    async def metadata_schema(auth: UserAPIKeyAuth = Depends(user_api_key_auth)) -> dict[str, Any]:
        # Not a secret, but like LiteLLM's own /team/metadata_schema it answers authenticated callers only.
        return metadata_json_schema(callback.settings.metadata_key)

    _page_routes(router, callback, _admin)
    app.include_router(router)
    # Every write of key or team metadata is checked before LiteLLM stores it (see metadata_gate).
    install_metadata_gate(app, lambda: callback.settings.metadata_key)
    # Pass-through routes skip every hook: those that would reach a governed engine are refused (see passthrough_gate).
    install_passthrough_gate(app, lambda: callback.group_names)
    # A long prompt's encoding starts while LiteLLM authenticates the request (see early_tokenize).
    install_early_tokenize(app, lambda: callback.handler("kv"))
    _registered = True


#: Headers of the page's files: nothing from elsewhere runs in it, nobody frames it, nothing is cached.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _page_routes(router: Any, callback: HandlerSet, admin: Any) -> None:
    """The admin page's static files and its JSON routes (``litellm_kv.integration.admin_page``)."""
    from fastapi import Depends, HTTPException, Request, Response
    from fastapi.responses import JSONResponse
    from litellm.proxy._types import UserAPIKeyAuth
    from litellm.proxy.auth.user_api_key_auth import user_api_key_auth

    from litellm_kv.integration import admin_page, litellm_data

    def _file(name: str, media_type: str) -> Response:
        return Response(admin_page.static_file(name), media_type=media_type, headers=_PAGE_HEADERS)

    @router.get("/ui", include_in_schema=False)
    async def page() -> Response:
        return _file("admin.html", "text/html; charset=utf-8")

    @router.get("/ui.js", include_in_schema=False)
    async def page_js() -> Response:
        return _file("admin.js", "text/javascript; charset=utf-8")

    @router.get("/ui.css", include_in_schema=False)
    async def page_css() -> Response:
        return _file("admin.css", "text/css; charset=utf-8")

    def _handlers() -> dict[str, Handler | None]:
        return {name: callback.handler(name) for name in admin_page.SECTIONS}

    @router.get("/admin/owner")
    async def owner(key: str = "", team_id: str = "",
                    auth: UserAPIKeyAuth = Depends(user_api_key_auth)) -> Response:
        admin(auth)
        await callback.ensure_started()
        if bool(key.strip()) == bool(team_id.strip()):
            raise HTTPException(status_code=400, detail="give either key (the key or its Key ID) or team_id")
        try:
            if key.strip():
                found = await litellm_data.stored_key(key.strip())
                kind = "key"
            else:
                found = await litellm_data.stored_team(team_id.strip())
                kind = "team"
        except litellm_data.NoDatabase:
            return JSONResponse(status_code=503, content={
                "error": "no_database",
                "message": "This proxy has no database (DATABASE_URL), so LiteLLM stores no keys or teams: there is "
                "nothing to look up or edit here. Keys presented by custom_auth carry their metadata with each "
                "request; set their limits where that auth reads them.",
            })
        if found is None:
            raise HTTPException(status_code=404, detail=f"no {kind} {key.strip() or team_id.strip()!r} in the database")
        view = await admin_page.owner_view(callback.settings, _handlers(), callback.refusals,
                                           admin_page.Owner(kind, found))
        return JSONResponse(view)

    @router.post("/admin/check")
    async def check(request: Request, auth: UserAPIKeyAuth = Depends(user_api_key_auth)) -> dict[str, Any]:
        admin(auth)
        try:
            body = await request.json()
        except ValueError:
            raise HTTPException(status_code=400, detail="the body must be JSON") from None
        if not isinstance(body, dict):
            raise HTTPException(status_code=400, detail="the body must be a JSON object")
        kind = "team" if body.get("kind") == "team" else "key"
        label = str(body.get("label") or f"{kind} {str(body.get('id') or '')[:12]}").strip()
        errors = admin_page.field_errors(body.get("litellm_kv"), where=label,
                                         metadata_key=callback.settings.metadata_key)
        return {"errors": errors}

    @router.get("/admin/fleet")
    async def fleet(auth: UserAPIKeyAuth = Depends(user_api_key_auth)) -> dict[str, Any]:
        admin(auth)
        await callback.ensure_started()
        return admin_page.fleet_view(callback.handler("kv"), callback.handler("affinity"), callback.settings)
