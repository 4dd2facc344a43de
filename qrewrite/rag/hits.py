"""Tie-aware Hit@1 of texts sent to a tenant's RAG as rewrites: the one place a text is sent beside its row's
question and scored against the row's gold: the release stage's and the deploy check's figures (through
qrewrite/eval/hits.py) and `qrewrite tenant init`'s teachers."""

from __future__ import annotations

import asyncio

from ..metrics import gold_ranking


async def texts_hit_at_1(rag, rows: list[dict], texts: list[str | None]) -> list[float | None]:
    """Per row, the tie-aware Hit@1 (qrewrite.metrics.gold_ranking) of its text sent as the rewrite beside its
    question: None for a row without gold; a row without a text (an empty rewrite, a failed call, an empty cell)
    retrieves nothing, a miss, as the eval and the training gate count it."""
    async def one(row: dict, text: str | None) -> float | None:
        if not row["gold_doc_ids"]:
            return None
        hits = await rag.search(row["query"], text) if text else []
        return gold_ranking(hits, row["gold_doc_ids"])["hit_at_1"]

    return list(await asyncio.gather(*(one(r, t) for r, t in zip(rows, texts, strict=True))))
