"""teacher.jsonl + queries.jsonl → validated.jsonl: retrieve with the rewrite and with the raw query."""

from __future__ import annotations

import asyncio
from collections import Counter

from ..entities import EntityLexicon
from ..errors import QrewriteError
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
        rewritten, original = await asyncio.gather(rag.search(query_row["query"], t["rewrite"]),
                                                   rag.search(query_row["query"]))
        rw = summarize_hits(rewritten, query_row["gold_doc_ids"], quality)
        og = summarize_hits(original, query_row["gold_doc_ids"], quality)
        return {"id": query_row["id"], "query": query_row["query"], "rewrite": t["rewrite"],
                "gold_doc_ids": query_row["gold_doc_ids"],
                "rewrite_rag": rw, "original_rag": og, "gain": round(rw["quality"] - og["quality"], 6),
                "rag_provider": cfg["rag"]["provider"]}

    try:
        out = await gather_with_progress((one(t) for t in ok), progress=progress,
                                         desc=f"validate[{tenant['name']}:{cfg['rag']['provider']}]")
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
             "rewrite_beats_original_share": round(sum(1 for r in out if r["gain"] > 0) / len(out), 4) if out else None}
    return out, stats


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
