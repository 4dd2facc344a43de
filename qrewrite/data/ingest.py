"""Raw Excel rows → results/T/queries.jsonl (normalised rows with stable, content-derived ids)."""

from __future__ import annotations

import hashlib
import logging
import re
import unicodedata
from collections import Counter

from ..errors import QrewriteError
from ..kb import tenant_kb
from ..text import normalize

log = logging.getLogger("qrewrite.data")

_GOLD_SPLIT = re.compile(r"[,，;；、\s]+")

# tenants[].language against the text (language_check). Over all ingested queries (NFKC, so full-width letters are
# Latin): cjk = CJK ideographs (CJK Unified Ideographs, Extension A, Compatibility Ideographs, the supplementary
# planes' extensions), latin = Latin-script letters; other scripts, digits and punctuation are not counted.
# cjk_share = cjk / (cjk + latin). zh with a share under ZH_MIN_CJK_SHARE (the queries mostly Latin letters) or en
# over EN_MAX_CJK_SHARE (mostly ideographs) stops ingest. Measured: the demo tenants fivedoctors 0.975
# (2,535 / 66) and chengla 0.984 (2,460 / 40), dur-dev 0.997 (2,040 / 6): all zh; CQR 0.000 (0 / 2,139): en. A
# Chinese tenant's product names and English words (DHA, Python, CPA) cost it a few points, never 80.
ZH_MIN_CJK_SHARE = 0.2
EN_MAX_CJK_SHARE = 0.5
LANGUAGE_MIN_LETTERS = 20  # fewer letters in all the queries (ids, numbers): too little to judge, nothing checked
# ingest stats' warning: the first this many gold ids that are not in the KB, each with its Excel row
MISSING_GOLD_LISTED = 10


def _is_cjk(o: int) -> bool:
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x3134F


def script_counts(texts) -> tuple[int, int]:
    """(CJK ideographs, Latin letters) over `texts` (NFKC-normalised first)."""
    cjk = latin = 0
    for text in texts:
        for c in unicodedata.normalize("NFKC", text):
            o = ord(c)
            if o < 128:
                latin += c.isalpha()
            elif _is_cjk(o):
                cjk += 1
            elif c.isalpha() and unicodedata.name(c, "").startswith("LATIN"):
                latin += 1
    return cjk, latin


def language_check(tenant: dict, queries: list[str], path: str) -> dict:
    """The ingest stats' `language_check`: the queries' CJK share against tenants[].language; a QrewriteError
    naming the file, the query column and the setting when the text contradicts it."""
    language = tenant.get("language", "zh")
    cjk, latin = script_counts(queries)
    share = cjk / (cjk + latin) if cjk + latin else None
    checked = cjk + latin >= LANGUAGE_MIN_LETTERS
    out = {"language": language, "cjk": cjk, "latin": latin,
           "cjk_share": None if share is None else round(share, 4), "checked": checked,
           "rule": f"cjk_share = CJK ideographs / (CJK ideographs + Latin letters) over all queries; zh needs >= "
                   f"{ZH_MIN_CJK_SHARE}, en <= {EN_MAX_CJK_SHARE}"}
    if not checked:
        return out
    column = tenant["columns"]["query"]
    if language == "zh" and share < ZH_MIN_CJK_SHARE:
        said, fix = "mostly Latin letters", "en"
    elif language == "en" and share > EN_MAX_CJK_SHARE:
        said, fix = "mostly Chinese characters", "zh"
    else:
        return out
    raise QrewriteError(
        f"tenants[].language of tenant {tenant['name']} is {language}, but the queries are {said}: CJK ideographs "
        f"are {share:.0%} of their letters ({cjk} ideographs, {latin} Latin letters; {language} needs "
        + (f"at least {ZH_MIN_CJK_SHARE:.0%})" if language == "zh" else f"at most {EN_MAX_CJK_SHARE:.0%})"),
        file=path, column=column,
        hint=f"set tenants[].language: {fix} for tenant {tenant['name']} (it sets the prompt labels and the "
             f"tokenisation), or check that tenants[].columns.query names the column holding the questions")


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
    rows, found = build_rows(raw, kb_ids, max_chars, tenant["name"])
    dropped, missing, gold_total = found["dropped"], found["missing"], found["gold_ids"]
    if not rows:  # every row dropped: an empty queries.jsonl would run every later stage on nothing
        raise QrewriteError(
            f"no usable row: all {len(raw)} data rows were dropped ({', '.join(f'{k} {v}' for k, v in dropped.items())})",
            file=path, column=tenant["columns"]["query"],
            hint=f"check that tenants[].columns.query names the column holding the questions"
                 + (f"; raise tenants[].thresholds.max_query_chars (now {max_chars})" if dropped["query_too_long"] else ""))
    lang = language_check(tenant, [r["query"] for r in rows], path)
    warnings = _missing_gold(tenant, path, missing, gold_total)
    stats = {"stage": "ingest", "in": len(raw), "out": len(rows), "dropped": dict(sorted(dropped.items())),
             "gold_ids_not_in_kb": len(missing), "gold_ids": gold_total,
             "with_gold": sum(1 for r in rows if r["gold_doc_ids"]), "language_check": lang, "warnings": warnings}
    return rows, stats


def build_rows(raw: list[dict], kb_ids: set[str], max_chars: int, tenant: str) -> tuple[list[dict], dict]:
    """(rows, found): read_excel's records as queries.jsonl rows (whitespace collapsed; an empty, over-long or
    repeated question dropped; gold ids split, those in `kb_ids` kept). found: {dropped: Counter by reason, missing:
    [(gold id not in the KB, its Excel row)] in row order, gold_ids: the ids cited in the kept rows}. The one row
    builder: ingest, and `qrewrite tenant init` on the rows it scores the teachers on."""
    dropped: Counter = Counter()
    gold_total = 0
    missing: list[tuple[str, int]] = []
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
        gold = split_gold(rec.get("gold", ""))
        known = [g for g in gold if g in kb_ids]
        gold_total += len(gold)
        missing += [(g, rec["row"]) for g in gold if g not in kb_ids]
        row = {"id": qid, "tenant": tenant, "row": rec["row"], "query": query, "profile": profile,
               "history": history, "gold_doc_ids": known}
        if "difficulty" in rec:  # columns.difficulty configured
            row["difficulty"] = rec["difficulty"]
        if "rewrite" in rec:  # columns.rewrite configured: the tenant's own reference rewrite
            row["reference"] = re.sub(r"\s+", " ", rec["rewrite"]).strip()
        rows.append(row)
    return rows, {"dropped": dropped, "missing": missing, "gold_ids": gold_total}


def split_gold(cell: str) -> list[str]:
    """The doc ids of a gold cell."""
    return [g for g in _GOLD_SPLIT.split(cell or "") if g]


def _missing_gold(tenant: dict, path: str, missing: list[tuple[str, int]], total: int) -> list[dict]:
    """The ingest stats' warnings about gold ids that are not in the KB (dropped from their rows): the first
    MISSING_GOLD_LISTED, each with its Excel row. A QrewriteError when their share of all the gold ids cited is above
    tenants[].thresholds.max_missing_gold_share: the gold column and the KB do not belong together."""
    if not missing:
        return []
    column, kb = tenant["columns"]["gold"], tenant["kb"]["path"]
    limit = tenant["thresholds"].get("max_missing_gold_share", 0.1)
    share = len(missing) / total
    listed = ", ".join(f"{g} (row {row})" for g, row in missing[:MISSING_GOLD_LISTED])
    more = f" and {len(missing) - MISSING_GOLD_LISTED} more" if len(missing) > MISSING_GOLD_LISTED else ""
    if share > limit:
        first, row = missing[0]
        raise QrewriteError(
            f"{len(missing)} of the {total} gold ids in the gold column ({share:.0%}) are not in the KB {kb}, more "
            f"than tenants[].thresholds.max_missing_gold_share allows ({limit:g}); the first, {first!r}, is on this "
            f"row; missing: {listed}{more}", file=path, row=row, column=column,
            hint="check that tenants[].kb.path is this sheet's KB and tenants[].kb.fields.doc_id names its id field, "
                 "and that tenants[].columns.gold names the gold-id column; to go on without those ids, raise "
                 "tenants[].thresholds.max_missing_gold_share")
    text = (f"{len(missing)} of the {total} gold ids in column {column!r} of {path} ({share:.1%}) are not in the KB "
            f"{kb} and were dropped from their rows: {listed}{more}")
    log.warning(text)
    return [{"code": "gold_ids_not_in_kb", "message": text,
             "missing": [{"id": g, "row": row} for g, row in missing[:MISSING_GOLD_LISTED]]}]
