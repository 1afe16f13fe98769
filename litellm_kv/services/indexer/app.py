"""HTTP API of the indexer (FastAPI): health, replicas, lookups and Prometheus metrics."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from litellm_kv.services.indexer.service import Indexer


class LookupRequest(BaseModel):
    model_group: str
    token_ids: list[int] = Field(description="The prompt's token ids, exactly as the engine tokenizes it.")


def create_app(indexer: Indexer) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        await indexer.start()
        try:
            yield
        finally:
            await indexer.stop()

    app = FastAPI(title="litellm-kv indexer", lifespan=lifespan)

    @app.get("/health")
    async def health() -> JSONResponse:
        body = indexer.health()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/replicas")
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

    @app.post("/lookup")
    async def lookup(req: LookupRequest) -> dict[str, Any]:
        if req.model_group not in indexer.cfg.model_groups:
            raise HTTPException(404, f"unknown model group {req.model_group!r}")
        try:
            return await indexer.lookup(req.model_group, req.token_ids)
        except LookupError as exc:
            raise HTTPException(409, str(exc)) from exc
        except Exception as exc:
            raise HTTPException(503, f"index unavailable: {exc}") from exc

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
