"""teacher.jsonl + queries.jsonl → validated.jsonl: retrieve with the rewrite and with the raw query."""

from __future__ import annotations

import asyncio
from collections import Counter

from ..entities import EntityLexicon
from ..errors import QrewriteError
from ..text import with_history
from ..kb import tenant_kb
from ..metrics import TIE_RULE, summarize_hits
from .cache import cached_http_rag
from .providers import LocalRag, make_rag
from ..signals import score_agreement
from ..tasks import gather_with_progress


async def run_validation(cfg: dict, tenant: dict, queries: list[dict], teacher_rows: list[dict], *,
                         progress: bool = True) -> tuple[list[dict], dict]:
    by_id = {row["id"]: row for row in queries}
    ok = [t for t in teacher_rows if t["status"] == "ok"]
    if not ok:  # nothing to validate: an empty validated.jsonl would leave the split nothing to train on
        reasons = Counter(t.get("reason") for t in teacher_rows)
        raise QrewriteError(f"the teacher produced no rewrite: {len(teacher_rows)} rows, every one failed "
                            f"({', '.join(f'{r} ({n})' for r, n in reasons.most_common(3))})",
                            hint="fix the teacher (teacher.provider, teacher.openai) and rerun the teacher stage")
    quality = cfg["rag"]["quality"]
    rag = make_rag(cfg, tenant)
    if cfg["rag"]["provider"] == "http":
        rag = cached_http_rag(rag, cfg, tenant)  # a rerun (also after kill -9) repeats no completed call

    async def one(t: dict) -> dict:
        query_row = by_id[t["id"]]
        rewritten, original, pasted = await asyncio.gather(
            rag.search(query_row["query"], t["rewrite"]), rag.search(query_row["query"]),
            rag.search(query_row["query"], with_history(query_row["query"], query_row)))
        rw = summarize_hits(rewritten, query_row["gold_doc_ids"], quality)
        og = summarize_hits(original, query_row["gold_doc_ids"], quality)
        return {"id": query_row["id"], "query": query_row["query"], "rewrite": t["rewrite"],
                "gold_doc_ids": query_row["gold_doc_ids"],
                "rewrite_rag": rw, "original_rag": og, "gain": round(rw["quality"] - og["quality"], 6),
                "query_history_hit_at_1": summarize_hits(pasted, query_row["gold_doc_ids"], quality)["hit_at_1"],
                "rag_provider": cfg["rag"]["provider"]}

    async def failed_row(q: dict) -> dict:
        """A row with gold the teacher gave no rewrite for: the rules' figures still count (the teacher's: a miss)."""
        original, pasted = await asyncio.gather(rag.search(q["query"]),
                                                rag.search(q["query"], with_history(q["query"], q)))
        return {"id": q["id"], "raw": summarize_hits(original, q["gold_doc_ids"], quality)["hit_at_1"],
                "query_history": summarize_hits(pasted, q["gold_doc_ids"], quality)["hit_at_1"], "teacher": 0.0}

    ok_ids = {t["id"] for t in ok}
    try:
        out = await gather_with_progress((one(t) for t in ok), progress=progress,
                                         desc=f"validate[{tenant['name']}:{cfg['rag']['provider']}]")
        failed = await asyncio.gather(*(failed_row(q) for q in queries if q["gold_doc_ids"] and q["id"] not in ok_ids))
        calls = {"rag_calls": rag.calls, "rag_cache_hits": getattr(rag, "hits", 0)}  # validation's own, not the checks'
        signals = await _signal_checks(rag, cfg, tenant, queries, ok, quality) \
            if any(r["gold_doc_ids"] for r in out) else None
    finally:
        await rag.aclose()
    order = {t["id"]: i for i, t in enumerate(ok)}
    out.sort(key=lambda r: order[r["id"]])
    with_gold = [r for r in out if r["gold_doc_ids"]]

    def hit1(side):  # tie-aware (qrewrite.metrics.TIE_RULE)
        return round(sum(r[side]["hit_at_1"] for r in with_gold) / len(with_gold), 4) if with_gold else None

    stats = {"stage": "validate", "in": len(teacher_rows), "out": len(out),
             "dropped": {"teacher_failed": len(teacher_rows) - len(ok)}, **calls,
             "hit_at_1": {"original": hit1("original_rag"), "rewrite": hit1("rewrite_rag"), "n": len(with_gold),
                          "tie_rule": TIE_RULE},
             "signals": signals,
             "teacher_fit": teacher_fit(cfg, with_gold, failed),
             "rewrite_beats_original_share": round(sum(1 for r in out if r["gain"] > 0) / len(out), 4) if out else None}
    return out, stats


def teacher_fit(cfg: dict, validated_gold: list[dict], failed: list[dict]) -> dict:
    """How well the teacher retrieves on the tenant's rows with gold, beside the two rules a tenant has without any
    model: tie-aware Hit@1 of the raw query, query + history and the teacher's rewrite over every ingested row with
    gold (a row the teacher gave no rewrite for is its miss), each with its interval, and teacher − query + history
    paired. The training gate (qrewrite.data.gate) stops a student taught by a teacher below query + history."""
    from .. import stats as st

    rows = [{"raw": r["original_rag"]["hit_at_1"], "query_history": r["query_history_hit_at_1"],
             "teacher": r["rewrite_rag"]["hit_at_1"]} for r in validated_gold] + failed
    boot = cfg["eval"]["bootstrap"]
    bkw = dict(samples=boot["samples"], seed=boot["seed"], confidence=boot["confidence"])
    out = {"n": len(rows), "teacher_failed": len(failed), "tie_rule": TIE_RULE}
    for k in ("raw", "query_history", "teacher"):
        out[k] = st.mean_ci([r[k] for r in rows], **bkw)
    out["teacher_minus_query_history"] = st.paired([r["teacher"] for r in rows], [r["query_history"] for r in rows],
                                                   **bkw)
    return out


async def _signal_checks(rag, cfg: dict, tenant: dict, queries: list[dict], teacher_ok: list[dict],
                         quality: str) -> dict:
    """Agreement of the configured retrieval score with gold (``qrewrite.signals``) through validation's own
    ``rag``; with the local provider, every local score is measured, so the seed's coverage score stays on
    record beside it."""
    lexicon = EntityLexicon.from_docs(rag.retriever.docs if hasattr(rag, "retriever") else tenant_kb(tenant))
    teacher = {t["id"]: t["rewrite"] for t in teacher_ok}
    active = await score_agreement(rag, queries, teacher, lexicon, quality)
    out = {"score_agreement": {"provider": cfg["rag"]["provider"], **active}}
    if cfg["rag"]["provider"] == "local":
        active_score = cfg["rag"]["local"]["score"]
        out["score_agreement"]["score"] = active_score
        others = {}
        for score in ("relevance", "coverage"):
            if score == active_score:
                continue
            for formula in ("top1", "seed"):  # rag.quality
                r = LocalRag(rag.retriever.with_score(score), top_k=cfg["rag"]["top_k"], score_threshold=0.0)
                res = await score_agreement(r, queries, teacher, lexicon, formula)
                others[f"{score}/{formula}"] = {k: res[k] for k in ("agreement", "pairs", "agreed")}
        out["score_agreement"]["alternatives"] = others
    return out
