"""Small pure scoring functions over retrieval results (shared by validation, reward and eval)."""

from __future__ import annotations


def top1(hits: list[dict]) -> float:
    return float(hits[0]["reranker_score"]) if hits else 0.0


def mean_top3(hits: list[dict]) -> float:
    """Mean reranker score of the top 3; missing positions count as 0 (fewer hits is worse)."""
    return sum(float(h["reranker_score"]) for h in hits[:3]) / 3.0


def retrieval_quality(hits: list[dict]) -> float:
    """The design's quality q = 0.6 * top1 + 0.4 * mean(top3)."""
    return 0.6 * top1(hits) + 0.4 * mean_top3(hits)


def gold_rank(hits: list[dict], gold: list[str]) -> int | None:
    """1-based rank of the first gold document among the hits, or None."""
    gold_set = set(gold)
    for i, h in enumerate(hits, 1):
        if h["doc_id"] in gold_set:
            return i
    return None


def summarize_hits(hits: list[dict], gold: list[str]) -> dict:
    return {"hits": [{"doc_id": h["doc_id"], "reranker_score": round(float(h["reranker_score"]), 6)} for h in hits],
            "top1": round(top1(hits), 6), "mean_top3": round(mean_top3(hits), 6),
            "quality": round(retrieval_quality(hits), 6), "recall_count": len(hits),
            "gold_rank": gold_rank(hits, gold) if gold else None}
