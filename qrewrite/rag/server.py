"""`qrewrite serve-rag`: the local BM25 retriever behind the tenant RAG service's HTTP API.

Same request/response shape as the production service (POST /api/chat/general_rag), so the `http`
provider runs end to end against a real server on loopback. Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from ..kb import tenant_kb
from .local import LocalRetriever


class RagRequest(BaseModel):
    query: str
    rewritten_query: str | None = None
    tenant_id: str
    kb_name: str | None = None
    top_k: int = Field(default=5, ge=1, le=100)
    score_threshold: float = Field(default=0.0, ge=0.0, le=1.0)


def create_app(cfg: dict) -> FastAPI:
    retrievers: dict[str, LocalRetriever] = {}
    for t in cfg["tenants"]:
        retriever = LocalRetriever(tenant_kb(t), t["language"], cfg["rag"]["local"]["k1"],
                                   cfg["rag"]["local"]["b"])
        retrievers[t["tenant_id"] or t["name"]] = retriever
    app = FastAPI(title="qrewrite local RAG", version="1")

    @app.get("/healthz")
    def healthz():
        return {"status": "ok", "tenants": sorted(retrievers)}

    @app.post("/api/chat/general_rag")
    def general_rag(req: RagRequest):
        retriever = retrievers.get(req.tenant_id)
        if retriever is None:
            raise HTTPException(404, f"unknown tenant_id {req.tenant_id!r}; known: {sorted(retrievers)}")
        hits = retriever.search(req.rewritten_query or req.query, req.top_k, req.score_threshold)
        return {"code": 0, "message": "ok", "data": {"query": req.query, "rewritten_query": req.rewritten_query,
                                                      "recall": hits}}

    return app


def serve(cfg: dict, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(create_app(cfg), host=host, port=port, log_level="info")
