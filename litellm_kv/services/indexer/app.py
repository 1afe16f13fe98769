"""HTTP API of the indexer (FastAPI): health, replicas, lookups and Prometheus metrics.

The index says which replica holds which prompt prefix, for every tenant: with a token configured
every route but a status-only ``/health`` needs it, and request bodies are capped before parsing
(``max_request_bytes``) and lookups before hashing (``max_lookup_tokens``).
"""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field, ValidationError

from litellm_kv.services.indexer.service import Indexer

log = logging.getLogger("litellm_kv.services.indexer")

# Largest value a token id may take: vLLM vocabularies are far below it, and the hashers take any int up to it.
_MAX_TOKEN_ID = 2**63 - 1


class LookupRequest(BaseModel):
    model_group: str = Field(max_length=512)
    token_ids: list[Annotated[int, Field(ge=0, le=_MAX_TOKEN_ID)]] = Field(
        description="The prompt's token ids, exactly as the engine tokenizes it."
    )


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def _read_capped(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 once it passes ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body of {declared} bytes is over indexer.max_request_bytes ({limit})")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"request body is over indexer.max_request_bytes ({limit})")
    return bytes(body)


def create_app(indexer: Indexer) -> FastAPI:
    """The API of ``indexer``; a :class:`~litellm_kv.errors.ConfigError` when it would be exposed without a token."""
    cfg = indexer.cfg
    token = cfg.token()
    if token is None:
        log.warning("indexer: no API token (%s unset): the HTTP API on %s is open to every local process",
                    cfg.api_token_env, cfg.host)

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        given = _bearer(request)
        return given is not None and hmac.compare_digest(given.encode(), token.encode())

    async def require_token(request: Request) -> None:
        if token is None:
            return
        given = _bearer(request)
        if given is None:
            raise HTTPException(401, "indexer API token required: send 'Authorization: Bearer <token>' "
                                     f"(the token is in {cfg.api_token_env})",
                                headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(403, "indexer API token does not match")

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        await indexer.start()
        try:
            yield
        finally:
            await indexer.stop()

    app = FastAPI(title="litellm-kv indexer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    guarded = [Depends(require_token)]

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        body = indexer.health()
        status = 200 if body["status"] == "ok" else 503
        # Probes (container health checks, load balancers) need the status only; the replicas need the token.
        return JSONResponse(body if authorized(request) else {"status": body["status"]}, status_code=status)

    @app.get("/replicas", dependencies=guarded)
    async def replicas() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for group in indexer.cfg.model_groups:
            try:
                entries = await indexer.index.replica_entries(group)
            except Exception as exc:
                raise HTTPException(503, f"Redis unavailable: {exc}") from exc
            configured = {rid: rt for (g, rid), rt in indexer.replicas.items() if g == group}
            out[group] = [
                {"replica": rid, "configured": rid in configured, "entries": entries.get(rid, 0),
                 "exact": rid in configured and not configured[rid].not_exact and not configured[rid].error,
                 "block_size": configured[rid].block_size if rid in configured else None,
                 "hash_algo": configured[rid].hash_algo if rid in configured else None}
                for rid in sorted(set(entries) | set(configured))
            ]
        return out

    @app.post("/lookup", dependencies=guarded)
    async def lookup(request: Request) -> dict[str, Any]:
        raw = await _read_capped(request, cfg.max_request_bytes)
        try:
            req = LookupRequest.model_validate_json(raw)
        except ValidationError as exc:
            detail = exc.errors(include_url=False, include_input=False, include_context=False)
            raise HTTPException(422, detail) from None
        if len(req.token_ids) > cfg.max_lookup_tokens:
            raise HTTPException(413, f"{len(req.token_ids)} token ids are over indexer.max_lookup_tokens "
                                     f"({cfg.max_lookup_tokens})")
        if req.model_group not in indexer.cfg.model_groups:
            raise HTTPException(404, f"unknown model group {req.model_group!r}")
        try:
            return await indexer.lookup(req.model_group, req.token_ids)
        except LookupError as exc:
            raise HTTPException(409, str(exc)) from exc
        except Exception as exc:
            raise HTTPException(503, f"index unavailable: {exc}") from exc

    @app.get("/metrics", dependencies=guarded)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
