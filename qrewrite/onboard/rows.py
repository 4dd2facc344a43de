"""The sheet's rows as ingest makes them, their gold ids against the KB, the language their text says, and the
seeded sample of rows with gold the teachers are scored on."""

from __future__ import annotations

import random

DEFAULT_SAMPLE = 60       # rows with gold the teachers are scored on
SAMPLE_SEED = 0           # the sample is the same on every run


def max_query_chars() -> int:
    """tenants[].thresholds.max_query_chars as the proposed block leaves it (it writes top1 alone): the schema's
    default, which ingest will apply to this tenant."""
    from ..config import load_schema

    tenant = load_schema()["properties"]["tenants"]["items"]["properties"]
    return tenant["thresholds"]["properties"]["max_query_chars"]["default"]


def sheet_rows(raw: list[dict], kb_ids: set[str], tenant: str) -> tuple[list[dict], dict]:
    """(rows, found): read_excel's records made rows by ingest's own builder (qrewrite.data.ingest.build_rows:
    whitespace collapsed, an empty, over-long or repeated question dropped, gold ids split and those in the KB
    kept) under the schema's max_query_chars; found: what it dropped and the gold ids not in the KB."""
    from ..data.ingest import build_rows

    return build_rows(raw, kb_ids, max_query_chars(), tenant)


def gold_coverage(rows: list[dict], found: dict) -> dict:
    """How many of the gold ids the rows cite are in the KB, the rows with gold, the first ids missing."""
    cited, missing = found["gold_ids"], found["missing"]
    return {"cited": cited, "in_kb": cited - len(missing), "rows": len(rows),
            "rows_with_gold": sum(1 for r in rows if r["gold_doc_ids"]), "missing": missing[:5]}


def sample_rows(rows: list[dict], n: int, seed: int = SAMPLE_SEED) -> list[dict]:
    """Up to `n` of the rows with gold documents, drawn with a fixed seed, in sheet order."""
    with_gold = [r for r in rows if r["gold_doc_ids"]]
    picked = sorted(random.Random(seed).sample(range(len(with_gold)), min(n, len(with_gold))))
    return [with_gold[i] for i in picked]


def detect_language(queries: list[str]) -> dict:
    """{language, cjk_share, cjk, latin, evidence}: zh when the queries' CJK share meets ingest's zh floor, else en
    (qrewrite.data.ingest.language_check: the same count, the same thresholds)."""
    from ..data.ingest import EN_MAX_CJK_SHARE, LANGUAGE_MIN_LETTERS, ZH_MIN_CJK_SHARE, script_counts

    cjk, latin = script_counts(queries)
    share = cjk / (cjk + latin) if cjk + latin else None
    rule = f"ingest needs a share >= {ZH_MIN_CJK_SHARE} for zh, <= {EN_MAX_CJK_SHARE} for en"
    if cjk + latin < LANGUAGE_MIN_LETTERS:
        return {"language": "zh", "cjk_share": share, "cjk": cjk, "latin": latin,
                "evidence": f"too few letters to tell ({cjk + latin}; ingest checks none under {LANGUAGE_MIN_LETTERS}"
                            f"): zh, the schema default"}
    language = "zh" if share >= ZH_MIN_CJK_SHARE else "en"
    both = ZH_MIN_CJK_SHARE <= share <= EN_MAX_CJK_SHARE
    return {"language": language, "cjk_share": round(share, 4), "cjk": cjk, "latin": latin,
            "evidence": f"CJK share {share:.3f}: CJK ideographs are {share:.1%} of the queries' letters ({cjk} "
                        f"ideographs, {latin} Latin letters); {rule}" + ("; mixed text: en would pass too" if both
                                                                         else "")}
