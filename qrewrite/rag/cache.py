"""Disk cache in front of the tenant's HTTP RAG service, for the validation stage.

Every answered search is stored the moment it returns (one atomic JSON file per call), so a
validation run killed with -9 resumes without repeating a completed call. The key covers what
changes the answer: endpoint, request/response field mapping, tenant and KB, top_k, threshold,
query and rewritten query. The `local` provider is in-process and free, so it is not cached.
"""

from __future__ import annotations

import asyncio

from ..io_utils import sha256_json
from ..cache import DiskCache


class CachedRag:
    def __init__(self, rag, cache_dir: str, ident: dict):
        self.rag, self.ident = rag, ident
        self.cache = DiskCache(cache_dir)
        self._inflight: dict[str, asyncio.Task] = {}

    @property
    def calls(self) -> int:
        return self.rag.calls

    @property
    def hits(self) -> int:
        return self.cache.hits

    def key(self, query: str, rewritten_query: str | None) -> str:
        return sha256_json({**self.ident, "query": query, "rewritten_query": rewritten_query or ""})

    async def search(self, query: str, rewritten_query: str | None = None) -> list[dict]:
        key = self.key(query, rewritten_query)
        entry = self.cache.get(key)
        if entry is not None and isinstance(entry.get("hits"), list):
            return entry["hits"]
        # the same search asked twice at once (query + history equal to the teacher's rewrite, say) is one call
        task = self._inflight.get(key)
        if task is None:
            task = self._inflight[key] = asyncio.ensure_future(self._fetch(key, query, rewritten_query))
            task.add_done_callback(lambda _t: self._inflight.pop(key, None))
        return await task

    async def _fetch(self, key: str, query: str, rewritten_query: str | None) -> list[dict]:
        hits = await self.rag.search(query, rewritten_query)
        self.cache.put(key, {"hits": hits})  # persisted the moment it returns: a kill after this repeats nothing
        return hits

    async def aclose(self):
        await self.rag.aclose()


def cached_http_rag(rag, cfg: dict, tenant: dict):
    """Wrap an HttpRag from `make_rag` in the disk cache under `rag.cache_dir`."""
    r = cfg["rag"]
    ident = {"provider": "http", "endpoint": rag.url, "fields": r["http"]["fields"],
             "tenant_id": rag.tenant_id, "kb_name": rag.kb_name, "top_k": r["top_k"],
             "score_threshold": r["score_threshold"]}
    return CachedRag(rag, r["cache_dir"], ident)
