"""What is sent to the tenant's RAG for a model's own rewrite under a decoding: the one place that applies a
release's client step, for the release stage (validation), the eval (test) and the gateway (`qrewrite serve`).

Per row, in this order:

* an **empty** rewrite (nothing but spaces and punctuation) is never sent: query + history is, marked
  ``fallback: "empty"`` (a RAG given "" retrieves nothing useful; the rule is what the tenant had before);
* ``route_by_retrieval``: whichever of the rewrite, that rewrite + the history summary, and query + history the
  RAG's top hit scores highest (three concurrent retrievals; a tie keeps the cheaper text);
* ``append_history``: the rewrite with the history summary pasted after it;
* otherwise the rewrite as it is.

The top hit's reranker score is the RAG's own confidence that it found the document asked for; no gold is read.
docs/signals.md checks that score against gold on every tenant (`signals.score_agreement` in summary.json).

A RAG that fails while routing stops a pipeline stage (``on_rag_error="raise"``: no silent fallback in a figure);
the gateway passes ``"own"``: the model's own text is sent, marked ``fallback: "rag_unavailable"``.
"""

from __future__ import annotations

import asyncio
import logging

from ..text import with_history
from .degenerate import units

log = logging.getLogger(__name__)


# the texts a row is routed among, cheapest first: equal top scores keep the earlier
PARTS = ("own", "own+history", "query_history")
# what is sent in place of a rewrite that cannot be sent (empty; the gateway's failed backend)
FALLBACK_TEXT = "query_history"


def fallback_text(row: dict) -> str:
    """The rule a tenant had before any model: the query with the history summary pasted after it."""
    return with_history(row["query"], row)


def is_empty(text: str | None) -> bool:
    """Nothing a retriever could match: no CJK character, Latin word or number (qrewrite.runtime.degenerate.units)."""
    return not units(text or "")


def part_texts(own: str, row: dict) -> dict[str, str]:
    return {"own": own, "own+history": with_history(own, row), "query_history": fallback_text(row)}


def choose(tops: dict[str, float]) -> str:
    """The part whose top hit scores highest; a tie keeps the cheaper part (the earlier in `tops`, which lists
    them cheapest first, as PARTS does)."""
    order = list(tops)
    return max(order, key=lambda p: (tops[p], -order.index(p)))


async def _top1(rag, row: dict, text: str) -> float:
    hits = await rag.search(row["query"], text) if text else []
    return max((float(h["reranker_score"]) for h in hits), default=0.0)


async def route_one(rag, row: dict, own: str) -> dict:
    """{rewrite (the routed text), routed_to (its part), route_top1 (each part's top score)}: three concurrent
    retrievals. Raises what the RAG raises."""
    texts = part_texts(own, row)
    scores = await asyncio.gather(*(_top1(rag, row, texts[p]) for p in PARTS))
    tops = {p: round(s, 6) for p, s in zip(PARTS, scores)}
    part = choose(tops)
    return {"rewrite": texts[part], "routed_to": part, "route_top1": tops}


async def route_rows(rag, rows: list[dict], own: list[str]) -> list[dict]:
    """`route_one` per row, all rows concurrently."""
    return list(await asyncio.gather(*(route_one(rag, r, t) for r, t in zip(rows, own))))


async def sent_one(decoding: dict, rag, row: dict, own: str, *, on_rag_error: str = "raise") -> dict:
    """What one row sends for the model's own text `own` under `decoding` (module docstring). Keys: rewrite (the
    text sent); model_rewrite (the model's own text) wherever the lever or a fallback may change it; routed_to and
    route_top1 under route_by_retrieval; fallback (why the text is not the lever's) only when one was taken."""
    levers = bool(decoding.get("route_by_retrieval") or decoding.get("append_history"))
    if is_empty(own):
        return {"rewrite": fallback_text(row), "model_rewrite": own, "fallback": "empty",
                **({"routed_to": FALLBACK_TEXT} if decoding.get("route_by_retrieval") else {})}
    if decoding.get("route_by_retrieval"):
        try:
            return {**await route_one(rag, row, own), "model_rewrite": own}
        except Exception as exc:  # noqa: BLE001 - any failure of the RAG: the caller chose what to do
            if on_rag_error == "raise":
                raise
            log.warning("routing %s: the RAG failed (%s: %s): the model's own text is sent", row.get("query_id"),
                        type(exc).__name__, str(exc)[:200])
            return {"rewrite": own, "model_rewrite": own, "routed_to": "own", "fallback": "rag_unavailable"}
    if decoding.get("append_history"):
        return {"rewrite": with_history(own, row), "model_rewrite": own}
    return {"rewrite": own, **({"model_rewrite": own} if levers else {})}


async def sent_rows(decoding: dict, rag, rows: list[dict], own: list[str], *, on_rag_error: str = "raise") -> list[dict]:
    """`sent_one` for every row, concurrently (a routed row's three retrievals and the rows themselves)."""
    return list(await asyncio.gather(*(sent_one(decoding, rag, r, o, on_rag_error=on_rag_error)
                                       for r, o in zip(rows, own))))


def needs_rag(decoding: dict) -> bool:
    return bool(decoding.get("route_by_retrieval"))


def client_rows(decoding: dict, cfg: dict, tenant: dict, rows: list[dict], own: list[str]) -> list[dict]:
    """`sent_rows` through the tenant's RAG provider (the one the eval and the release score with); a RAG failure
    stops the caller (a pipeline stage)."""
    from ..rag.providers import make_rag

    async def run() -> list[dict]:
        rag = make_rag(cfg, tenant) if needs_rag(decoding) and any(not is_empty(o) for o in own) else None
        try:
            return await sent_rows(decoding, rag, rows, own)
        finally:
            if rag is not None:
                await rag.aclose()

    return asyncio.run(run())
