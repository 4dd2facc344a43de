"""Which teacher fits the tenant: the embedded `resolve` teacher run in process on a seeded sample of rows with gold
and scored through the tenant's local BM25 (tie-aware Hit@1) beside the raw query and query + history, the training
gate's comparison; where it falls below query + history, people's rewrites (columns.rewrite, scored alike) or an
API."""

from __future__ import annotations

import asyncio
import copy
import tempfile

from ..errors import QrewriteError
from .rows import SAMPLE_SEED, sample_rows


def scoring_config(cfg: dict, tenant: dict, source: str) -> dict:
    """`cfg` (validated) with `tenant` in place of any tenant of its name, validated again (the tenant's defaults
    filled in, the block checked beside the other tenants)."""
    out = copy.deepcopy(cfg)
    out["tenants"] = [t for t in out["tenants"] if t["name"] != tenant["name"]] + [copy.deepcopy(tenant)]
    out.pop("only", None)
    from ..config import validate_config

    return validate_config(out, source=source)


def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def mentions_entity(text: str, entities: list[str]) -> bool:
    from ..text import normalize

    low = normalize(text)
    return any(normalize(e) in low for e in entities)


async def _resolve_texts(cfg: dict, tenant: dict, rows: list[dict]) -> tuple[list[str | None] | None, str | None]:
    """(the resolve teacher's rewrite of each row, None) through the teacher stage's own call path, or (None, why)
    when it refuses to start on this KB."""
    from ..teacher.stage import run_teacher

    try:
        results, _ = await run_teacher(cfg, tenant, rows, progress=False)
    except QrewriteError as exc:
        return None, str(exc).split("\n")[0]
    by_id = {t["id"]: t for t in results}
    return [by_id[r["id"]]["rewrite"] if by_id[r["id"]]["status"] == "ok" else None for r in rows], None


async def _score_sample(cfg: dict, tenant: dict, rows: list[dict]) -> dict:
    """Mean tie-aware Hit@1 over `rows` of the raw query, query + history, the resolve teacher's rewrite (None when
    it cannot start) and the sheet's reference rewrites (with columns.rewrite), through the tenant's local BM25
    (a row without a text, a failed teacher call or an empty cell, is a miss, as the training gate counts it); the
    entities resolve reads off the KB titles and the rows it wrote one into."""
    from ..entities import EntityLexicon
    from ..rag.hits import texts_hit_at_1
    from ..text import with_history

    rag = make_local_rag(cfg, tenant)
    try:
        docs = rag.retriever.docs
        lexicon = EntityLexicon.from_docs(docs)
        texts, error = await _resolve_texts(cfg, tenant, rows)
        column = tenant["columns"].get("rewrite")
        return {"n": len(rows), "docs": len(docs), "titled": sum(1 for d in docs if d.title.strip()),
                "entities": len(lexicon.entities),
                "raw": mean(await texts_hit_at_1(rag, rows, [r["query"] for r in rows])),
                "query_history": mean(await texts_hit_at_1(rag, rows, [with_history(r["query"], r) for r in rows])),
                "resolve": None if texts is None else mean(await texts_hit_at_1(rag, rows, texts)), "resolve_error": error,
                "referents": sum(1 for t in texts or () if t and mentions_entity(t, lexicon.entities)),
                "column": mean(await texts_hit_at_1(rag, rows, [r.get("reference") for r in rows])) if column else None,
                "column_empty": sum(1 for r in rows if not r.get("reference")) if column else 0}
    finally:
        await rag.aclose()


def make_local_rag(cfg: dict, tenant: dict):
    """The tenant's local BM25 (rag.provider local, whatever the config names)."""
    from ..rag.providers import make_rag

    return make_rag({**cfg, "rag": {**cfg["rag"], "provider": "local"}}, tenant)


def score_teachers(cfg: dict, name: str, rows: list[dict]) -> dict:
    """_score_sample of tenant `name` of `cfg` (validated, its teacher resolve), the teacher's cache in a temporary
    folder: nothing of the project's cache is read or written."""
    from ..config import tenant_config

    tenant = tenant_config(cfg, name)
    with tempfile.TemporaryDirectory(prefix="qrewrite-tenant-init-") as tmp:
        run_cfg = {**cfg, "teacher": {**cfg["teacher"], "cache_dir": tmp, "mode": "sync"}}
        return asyncio.run(_score_sample(run_cfg, tenant, rows))


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def choose_teacher(fit: dict | None, has_rewrite: bool) -> tuple[str, list[str]]:
    """(provider, reasons): resolve where it retrieves at least as well as query + history on the sample, else
    the sheet's rewrites where they do, else an API (openai); openai without rows with gold to measure on."""
    api = "an LLM through an API: `teacher: {provider: openai}` (README \"Pointing at real services\")"
    if fit is None or not fit["n"]:
        return "openai", ["the sheet has no rows with gold documents in the KB: no teacher's figure can be measured",
                          f"recommended: {api}"
                          + ("; or the sheet's own rewrites, `teacher: {provider: column}` (unmeasured)"
                             if has_rewrite else "")]
    qh = fit["query_history"]
    if fit["resolve"] is not None and fit["resolve"] >= qh:
        return "resolve", [f"resolve fits: Hit@1 {fmt(fit['resolve'])} >= query + history {fmt(qh)}; it wrote a "
                           f"KB product/course name into {fit['referents']} of {fit['n']} rows (embedded, no API)"]
    if fit["resolve"] is None:
        titles = (f"{fit['titled']} of {fit['docs']} documents have a title; none reads \"<entity> <aspect>\" with "
                  "one entity over several aspects") if fit["titled"] else "no document has a title"
        why = f"KB titles name no product or course ({titles}): resolve found a referent in 0 of {fit['n']} rows"
    else:
        why = (f"resolve's Hit@1 {fmt(fit['resolve'])} is below query + history's {fmt(qh)}: it found a referent "
               f"in {fit['referents']} of {fit['n']} rows ({fit['entities']} products/courses read off the KB titles)")
    reasons = [f"resolve does not fit: {why}"]
    if fit["column"] is not None:
        ok = fit["column"] >= qh
        reasons.append(f"the sheet's rewrites (columns.rewrite): Hit@1 {fmt(fit['column'])} "
                       f"{'>=' if ok else '<'} query + history {fmt(qh)}"
                       + (f"; {fit['column_empty']} empty cells count as misses" if fit["column_empty"] else ""))
        if ok:
            return "column", reasons + ["recommended: people's rewrites, `teacher: {provider: column}` with "
                                        f"columns.rewrite set; or {api}"]
    return "openai", reasons + [f"recommended: {api}"]


def block_notes(fit: dict | None) -> dict:
    notes = {"sheet": "null = the first sheet", "thresholds": "the default (docs/signals.md)"}
    if fit and fit["n"]:
        resolve = "cannot start" if fit["resolve_error"] else fmt(fit["resolve"])
        notes["teacher"] = (f"qrewrite tenant init: Hit@1 on {fit['n']} sampled rows: raw {fmt(fit['raw'])}, "
                            f"query + history {fmt(fit['query_history'])}, resolve {resolve}"
                            + (f", column {fmt(fit['column'])}" if fit["column"] is not None else ""))
    return notes


def propose_teacher(cfg: dict, scoring: dict, rows: list[dict], sample: int, source: str) -> dict:
    """The teachers' figures on a seeded sample of the rows with gold and the provider chosen on them."""
    picked = sample_rows(rows, sample)
    fit = score_teachers(scoring_config(cfg, scoring, source), scoring["name"], picked) if picked else {"n": 0}
    provider, reasons = choose_teacher(fit, bool(scoring["columns"]["rewrite"]))
    return {"fit": fit, "provider": provider, "reasons": reasons, "sample": sample, "seed": SAMPLE_SEED}
