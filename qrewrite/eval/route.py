"""The decoding lever `route_by_retrieval` (release.decoding): per row, the tenant's RAG is sent whichever of the
model's rewrite, that rewrite + the history summary, and query + history its top hit scores highest.

The top hit's reranker score is the RAG's own confidence that it found the document asked for; no gold is read.
docs/signals.md checks that score against gold on every tenant (`signals.score_agreement` in summary.json: the
share of text pairs where it prefers the one that puts gold alone first; 0.94-0.99). `append_history` picks one of
these texts for a whole tenant on validation; this picks per row, at the price of three retrievals a query instead
of one (the caller's step at serving time, as docs/deploy.md says).
"""

from __future__ import annotations

import asyncio


def with_history(text: str, row: dict) -> str:
    """`text` with the row's history summary pasted after it: query_history's rule, and a model's rewrite under
    the decoding lever append_history (release.decoding, an eval candidate's generation)."""
    return f"{text} {row.get('history') or ''}".strip()


# the texts a row is routed among, cheapest first: equal top scores keep the earlier
PARTS = ("own", "own+history", "query_history")


def part_texts(own: str, row: dict) -> dict[str, str]:
    return {"own": own, "own+history": with_history(own, row), "query_history": with_history(row["query"], row)}


def choose(tops: dict[str, float]) -> str:
    """The part whose top hit scores highest; a tie keeps the cheaper part (the earlier in `tops`, which lists
    them cheapest first, as PARTS does)."""
    order = list(tops)
    return max(order, key=lambda p: (tops[p], -order.index(p)))


async def route_rows(rag, rows: list[dict], own: list[str]) -> list[dict]:
    """Per row: {rewrite (the routed text), routed_to (its part), route_top1 (each part's top score)}. An empty
    text retrieves nothing (top score 0), as the eval scores an empty rewrite."""
    async def top1(row: dict, text: str) -> float:
        hits = await rag.search(row["query"], text) if text else []
        return max((float(h["reranker_score"]) for h in hits), default=0.0)

    async def one(row: dict, text: str) -> dict:
        texts = part_texts(text, row)
        scores = await asyncio.gather(*(top1(row, texts[p]) for p in PARTS))
        tops = {p: round(s, 6) for p, s in zip(PARTS, scores)}
        part = choose(tops)
        return {"rewrite": texts[part], "routed_to": part, "route_top1": tops}

    return list(await asyncio.gather(*(one(r, t) for r, t in zip(rows, own))))


def route(cfg: dict, tenant: dict, rows: list[dict], own: list[str]) -> list[dict]:
    """`route_rows` through the tenant's RAG provider (the one the eval and the release score with)."""
    from ..rag.providers import make_rag

    async def run() -> list[dict]:
        rag = make_rag(cfg, tenant)
        try:
            return await route_rows(rag, rows, own)
        finally:
            await rag.aclose()

    return asyncio.run(run())


def client_rows(decoding: dict, cfg: dict, tenant: dict, rows: list[dict], own: list[str]) -> list[dict]:
    """What a caller sends the RAG for each model rewrite under `decoding`'s client-side levers: the rewrite as it
    is, the rewrite + the history (append_history) or the routed text (route_by_retrieval). The model's own text
    stays in model_rewrite whenever the sent text may differ from it."""
    if decoding.get("route_by_retrieval"):
        return [{**r, "model_rewrite": o} for r, o in zip(route(cfg, tenant, rows, own), own)]
    if decoding.get("append_history"):
        return [{"rewrite": with_history(o, row), "model_rewrite": o} for row, o in zip(rows, own)]
    return [{"rewrite": o} for o in own]
