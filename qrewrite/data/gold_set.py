"""Gold set: queries whose rewrite a person checked (`tenants[].gold_set`, JSONL), held out of training.

One row per line: {"query", "profile", "history", "rewrite" (the checked rewrite), "gold_doc_ids", "note"}.
A row's id is the query id ingest gives the same (query, profile, history), so the split stage can keep
every such row, and every row asking the same normalised question, out of train/val/test; eval then scores
every candidate on the gold set apart: Hit@1 against the gold documents and closeness to the checked rewrite.
"""

from __future__ import annotations

import re
from collections import Counter

from ..errors import QrewriteError
from ..io_utils import read_jsonl
from ..text import normalize

FIELDS = ("query", "profile", "history", "rewrite", "gold_doc_ids", "note")


def load_gold_set(path: str, kb_ids: set[str] | None = None) -> list[dict]:
    """Validated rows; `kb_ids` (when given) checks every gold doc id against the KB."""
    from .ingest import query_id

    rows, seen = [], {}
    for i, obj in enumerate(read_jsonl(path), 1):
        if not isinstance(obj, dict):
            raise QrewriteError("each line must be a JSON object", file=path, row=i)
        unknown = sorted(set(obj) - set(FIELDS))
        if unknown:
            raise QrewriteError(f"unknown field(s) {unknown}", file=path, row=i, hint=f"fields: {', '.join(FIELDS)}")
        for col in ("query", "profile", "history", "rewrite"):
            if not isinstance(obj.get(col, ""), str):
                raise QrewriteError(f"'{col}' must be a string", file=path, row=i, column=col)
        query = re.sub(r"\s+", " ", obj.get("query", "")).strip()  # as ingest normalises the Excel cell
        if not query:
            raise QrewriteError("empty query", file=path, row=i, column="query")
        if not obj.get("rewrite", "").strip():
            raise QrewriteError("empty checked rewrite", file=path, row=i, column="rewrite",
                                hint="a gold row is a query with the rewrite a person checked")
        gold = obj.get("gold_doc_ids", [])
        if not isinstance(gold, list) or not all(isinstance(g, str) and g for g in gold):
            raise QrewriteError("'gold_doc_ids' must be a list of doc ids", file=path, row=i, column="gold_doc_ids")
        if kb_ids is not None:
            unknown_ids = [g for g in gold if g not in kb_ids]
            if unknown_ids:
                raise QrewriteError(f"gold doc ids not in the KB: {unknown_ids}", file=path, row=i,
                                    column="gold_doc_ids")
        profile, history = obj.get("profile", ""), obj.get("history", "")
        qid = query_id(query, profile, history)
        if qid in seen:
            raise QrewriteError(f"the same query, profile and history as row {seen[qid]}", file=path, row=i,
                                column="query")
        seen[qid] = i
        rows.append({"query_id": qid, "raw_row": None, "query": query, "profile": profile, "history": history,
                     "gold_doc_ids": list(gold), "checked_rewrite": obj["rewrite"].strip(), "note": obj.get("note")})
    if not rows:
        raise QrewriteError("the gold set has no rows", file=path)
    return rows


def tenant_gold_set(tenant: dict, check_kb: bool = True) -> list[dict]:
    """The tenant's gold rows ([] when it has no gold set), gold doc ids checked against its KB."""
    if not tenant.get("gold_set"):
        return []
    kb_ids = None
    if check_kb:
        from ..kb import tenant_kb

        kb_ids = {d.doc_id for d in tenant_kb(tenant)}
    return load_gold_set(tenant["gold_set"], kb_ids)


def held_out(gold_rows: list[dict]) -> tuple[set[str], set[str]]:
    """(query ids, normalised questions) the split keeps out: a gold row, and any row asking the same question
    (the split groups by normalised question, so one question never lands on both sides)."""
    return {r["query_id"] for r in gold_rows}, {normalize(r["query"]) for r in gold_rows}


def char_f1(candidate: str | None, reference: str) -> float:
    """Character-level F1 of the normalised texts (bag of characters, spaces ignored): how close a rewrite is
    to the checked one; the usual overlap measure for Chinese, where words are not space-separated."""
    c = Counter(normalize(candidate or "").replace(" ", ""))
    r = Counter(normalize(reference).replace(" ", ""))
    common = sum((c & r).values())
    if not c or not r or not common:
        return 0.0
    p, rec = common / sum(c.values()), common / sum(r.values())
    return 2 * p * rec / (p + rec)


def exact_match(candidate: str | None, reference: str) -> bool:
    """Equal after normalisation, trailing question marks and spaces ignored."""
    strip = lambda s: normalize(s or "").replace(" ", "").rstrip("?？")  # noqa: E731
    return strip(candidate) == strip(reference)
