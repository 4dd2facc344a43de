"""teacher.jsonl + queries.jsonl → validated.jsonl: retrieve with the rewrite and with the raw query."""

from __future__ import annotations

import asyncio

from .metrics import summarize_hits
from .rag.cache import cached_http_rag
from .rag.providers import make_rag
from .tasks import gather_with_progress


async def run_validation(cfg: dict, tenant: dict, queries: list[dict], teacher_rows: list[dict], *,
                         progress: bool = True) -> tuple[list[dict], dict]:
    by_id = {q["id"]: q for q in queries}
    ok = [t for t in teacher_rows if t["status"] == "ok"]
    rag = make_rag(cfg, tenant)
    if cfg["rag"]["provider"] == "http":
        rag = cached_http_rag(rag, cfg, tenant)  # a rerun (also after kill -9) repeats no completed call

    async def one(t: dict) -> dict:
        q = by_id[t["id"]]
        rewritten, original = await asyncio.gather(rag.search(q["query"], t["rewrite"]), rag.search(q["query"]))
        rw = summarize_hits(rewritten, q["gold_doc_ids"])
        og = summarize_hits(original, q["gold_doc_ids"])
        return {"id": q["id"], "query": q["query"], "rewrite": t["rewrite"], "gold_doc_ids": q["gold_doc_ids"],
                "rewrite_rag": rw, "original_rag": og, "gain": round(rw["quality"] - og["quality"], 6),
                "rag_provider": cfg["rag"]["provider"]}

    try:
        out = await gather_with_progress((one(t) for t in ok), progress=progress,
                                         desc=f"validate[{tenant['name']}:{cfg['rag']['provider']}]")
    finally:
        await rag.aclose()
    order = {t["id"]: i for i, t in enumerate(ok)}
    out.sort(key=lambda r: order[r["id"]])
    with_gold = [r for r in out if r["gold_doc_ids"]]

    def hit1(side):
        return round(sum(1 for r in with_gold if r[side]["gold_rank"] == 1) / len(with_gold), 4) if with_gold else None

    stats = {"stage": "validate", "in": len(teacher_rows), "out": len(out),
             "dropped": {"teacher_failed": len(teacher_rows) - len(ok)}, "rag_calls": rag.calls,
             "rag_cache_hits": getattr(rag, "hits", 0),
             "hit_at_1": {"original": hit1("original_rag"), "rewrite": hit1("rewrite_rag"), "n": len(with_gold)},
             "rewrite_beats_original_share": round(sum(1 for r in out if r["gain"] > 0) / len(out), 4) if out else None}
    return out, stats
