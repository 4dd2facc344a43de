"""Raw Excel rows → results/T/queries.jsonl (normalised rows with stable, content-derived ids)."""

from __future__ import annotations

import hashlib
import re
from collections import Counter

from ..errors import QrewriteError
from ..kb import tenant_kb
from ..text import normalize

_GOLD_SPLIT = re.compile(r"[,，;；、\s]+")


def query_id(query: str, profile: str, history: str) -> str:
    """Stable id from content: the same question asked in the same context always gets the same id."""
    key = "\x1f".join(normalize(x) for x in (query, profile, history))
    return "q-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def ingest(tenant: dict) -> tuple[list[dict], dict]:
    """Return (rows, stats). Drops are counted by reason, never silent."""
    # here, not at the top: query_id is also used in the training envs (gold-set ids at eval), which have
    # no openpyxl
    from .excel import read_excel

    path = tenant["raw_excel"]
    raw = read_excel(path, tenant["columns"], tenant["sheet"])
    if not raw:
        raise QrewriteError("no data rows under the header", file=path,
                            hint="the tenant has no queries; add rows or remove the tenant from config")
    kb_ids = {d.doc_id for d in tenant_kb(tenant)}
    max_chars = tenant["thresholds"]["max_query_chars"]
    dropped: Counter = Counter()
    unknown_gold = 0
    seen: set[str] = set()
    rows = []
    for rec in raw:
        query = re.sub(r"\s+", " ", rec["query"]).strip()
        if not query:
            dropped["empty_query"] += 1
            continue
        if len(query) > max_chars:
            dropped["query_too_long"] += 1
            continue
        profile, history = rec.get("profile", ""), rec.get("history", "")
        qid = query_id(query, profile, history)
        if qid in seen:
            dropped["duplicate_row"] += 1
            continue
        seen.add(qid)
        gold = [g for g in _GOLD_SPLIT.split(rec.get("gold", "")) if g]
        known = [g for g in gold if g in kb_ids]
        unknown_gold += len(gold) - len(known)
        row = {"id": qid, "tenant": tenant["name"], "row": rec["row"], "query": query, "profile": profile,
               "history": history, "gold_doc_ids": known}
        if "difficulty" in rec:  # columns.difficulty configured
            row["difficulty"] = rec["difficulty"]
        if "rewrite" in rec:  # columns.rewrite configured: the tenant's own reference rewrite
            row["reference"] = re.sub(r"\s+", " ", rec["rewrite"]).strip()
        rows.append(row)
    if not rows:  # every row dropped: an empty queries.jsonl would run every later stage on nothing
        raise QrewriteError(
            f"no usable row: all {len(raw)} data rows were dropped ({', '.join(f'{k} {v}' for k, v in dropped.items())})",
            file=path, column=tenant["columns"]["query"],
            hint=f"check that tenants[].columns.query names the column holding the questions"
                 + (f"; raise tenants[].thresholds.max_query_chars (now {max_chars})" if dropped["query_too_long"] else ""))
    stats = {"stage": "ingest", "in": len(raw), "out": len(rows), "dropped": dict(sorted(dropped.items())),
             "gold_ids_not_in_kb": unknown_gold, "with_gold": sum(1 for r in rows if r["gold_doc_ids"])}
    return rows, stats
