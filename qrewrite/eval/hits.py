"""Tie-aware Hit@1 of rewrites through the tenant's RAG provider, per row: what the deploy check and the release
stage score with (the eval's scorer adds the judge, reranker scores and the rest)."""

from __future__ import annotations

import asyncio

from ..rag.hits import texts_hit_at_1
from ..rag.providers import make_rag


async def _hit_at_1(rag, rows: list[dict], rewrites: dict[str, str]) -> list[float | None]:
    """Tie-aware Hit@1 per row (None without gold); an empty rewrite retrieves nothing, as in the eval."""
    return await texts_hit_at_1(rag, rows, [rewrites.get(r["query_id"]) or "" for r in rows])


async def _score(cfg: dict, tenant: dict, rows: list[dict], texts: dict[str, dict[str, str]]) -> dict:
    rag = make_rag(cfg, tenant)
    try:
        return {name: await _hit_at_1(rag, rows, t) for name, t in texts.items()}
    finally:
        await rag.aclose()


def hit_at_1(cfg: dict, tenant: dict, rows: list[dict], texts: dict[str, dict[str, str]]) -> dict[str, list]:
    """name → per-row tie-aware Hit@1 (None for a row without gold) of each name's rewrites (query id → text)."""
    return asyncio.run(_score(cfg, tenant, rows, texts))
