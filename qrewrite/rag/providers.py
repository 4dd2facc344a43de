"""Pick the retrieval provider named in config; both expose `async search(query, rewritten_query)`."""

from __future__ import annotations

from ..kb import tenant_kb
from .http_client import HttpRag
from .local import LocalRetriever


class LocalRag:
    """Async face of the in-process BM25 retriever, so stages treat both providers alike."""

    def __init__(self, retriever, *, top_k: int, score_threshold: float):
        self.retriever, self.top_k, self.score_threshold = retriever, top_k, score_threshold
        self.calls = 0

    async def search(self, query: str, rewritten_query: str | None = None) -> list[dict]:
        self.calls += 1
        return self.retriever.search(rewritten_query or query, self.top_k, self.score_threshold, question=query)

    async def aclose(self):
        pass


def local_retriever(cfg: dict, tenant: dict) -> LocalRetriever:
    """The tenant's local BM25 retriever with the configured score (``rag.local``)."""
    loc = cfg["rag"]["local"]
    return LocalRetriever(tenant_kb(tenant), tenant["language"], loc["k1"], loc["b"],
                          score=loc.get("score", "relevance"), temperature=loc.get("temperature", 2.0))


def make_rag(cfg: dict, tenant: dict):
    rag = cfg["rag"]
    common = dict(top_k=rag["top_k"], score_threshold=rag["score_threshold"])
    if rag["provider"] == "http":
        return HttpRag(rag["http"], tenant_id=tenant["tenant_id"] or tenant["name"], kb_name=tenant["kb"]["name"],
                       concurrency=rag["concurrency"], **common)
    return LocalRag(local_retriever(cfg, tenant), **common)
