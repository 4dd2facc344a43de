"""Small pure scoring functions over retrieval results (shared by validation, reward and eval).

Tie rule (everywhere a rank is used): documents with equal scores are in random order, and a metric
is its expectation over that order. A gold document tied with three others at the top has Hit@1 =
0.25, whatever the KB's file order. Hits are ranked by reranker score (rounded to 1e-6, as stored); equal
scores are tied, with the local provider and with a tenant's service alike.
"""

from __future__ import annotations

from math import comb

TIE_RULE = ("expected value under random tie-breaking: documents with equal retrieval scores are in "
            "random order, and Hit@k / MRR are averaged over that order (never broken by KB file order)")


def top1(hits: list[dict]) -> float:
    return float(hits[0]["reranker_score"]) if hits else 0.0


def mean_top3(hits: list[dict]) -> float:
    """Mean reranker score of the top 3; missing positions count as 0 (fewer hits is worse)."""
    return sum(float(h["reranker_score"]) for h in hits[:3]) / 3.0


def retrieval_quality(hits: list[dict], formula: str = "top1") -> float:
    """Retrieval quality q of one result list.

    ``top1`` (default): the top hit's reranker score; with the local provider that is the calibrated
    probability that the top document is the one the query asks for. ``seed``: the design's
    0.6 * top1 + 0.4 * mean(top3), meant for a service whose reranker scores each document on its own.
    """
    return quality_from_parts(top1(hits), mean_top3(hits), formula)


def quality_from_parts(top1_score: float, mean_top3_score: float, formula: str = "top1") -> float:
    """The one q formula, from a list's top1 and mean top3 (the RL ground truth carries only those)."""
    if formula == "seed":
        return 0.6 * float(top1_score) + 0.4 * float(mean_top3_score)
    if formula == "top1":
        return float(top1_score)
    raise ValueError(f"unknown retrieval quality formula {formula!r} (top1 | seed)")


def _tie_score(h: dict) -> float:
    """Order key of a hit: its reranker score as stored (rounded to 1e-6), whichever provider gave it."""
    return round(float(h["reranker_score"]), 6)


def tie_groups(hits: list[dict]) -> list[list[dict]]:
    """Hits grouped by equal score, best group first (input order within a group is meaningless)."""
    groups: list[list[dict]] = []
    for h in sorted(hits, key=_tie_score, reverse=True):
        if groups and _tie_score(groups[-1][0]) == _tie_score(h):
            groups[-1].append(h)
        else:
            groups.append([h])
    return groups


def gold_ranking(hits: list[dict], gold: list[str], k: int = 5) -> dict:
    """Tie-aware ranking of the first gold document: expected Hit@1, Hit@k and reciprocal rank, and
    ``gold_rank``, its rank when ties count against it (None: no gold document retrieved)."""
    gold_set = set(gold)
    above = 0
    for group in tie_groups(hits):
        t, g = len(group), sum(1 for h in group if h["doc_id"] in gold_set)
        if g:
            # P(first gold at position j of the group) = C(t-j, g-1) / C(t, g)
            total = comb(t, g)
            dist = [(above + j, comb(t - j, g - 1) / total) for j in range(1, t - g + 2)]
            return {"hit_at_1": round(sum(p for r, p in dist if r <= 1), 6),
                    f"hit_at_{k}": round(sum(p for r, p in dist if r <= k), 6),
                    "rr": round(sum(p / r for r, p in dist), 6),
                    "gold_rank": above + t - g + 1, "gold_tied": t}
        above += t
    return {"hit_at_1": 0.0, f"hit_at_{k}": 0.0, "rr": 0.0, "gold_rank": None, "gold_tied": 0}


def gold_rank(hits: list[dict], gold: list[str]) -> int | None:
    """1-based rank of the first gold document among the hits, ties counting against it, or None."""
    return gold_ranking(hits, gold)["gold_rank"]


def summarize_hits(hits: list[dict], gold: list[str], formula: str = "top1") -> dict:
    out = {"hits": [{"doc_id": h["doc_id"], "reranker_score": round(float(h["reranker_score"]), 6)} for h in hits],
           "top1": round(top1(hits), 6), "mean_top3": round(mean_top3(hits), 6),
           "quality": round(retrieval_quality(hits, formula), 6), "recall_count": len(hits),
           "gold_rank": None, "hit_at_1": None}
    if gold:
        r = gold_ranking(hits, gold)
        out.update(gold_rank=r["gold_rank"], hit_at_1=r["hit_at_1"])
    return out
