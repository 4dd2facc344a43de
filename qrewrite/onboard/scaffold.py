"""`qrewrite tenant init`: read a tenant's Excel test set and JSONL knowledge base, propose its config block.

Each proposal comes with the evidence it rests on, so a person can check it before the pipeline runs on it:

* columns (tenants[].columns): the sheet's header names against Chinese and English synonyms; where no header
  says, the cells (a gold column: cells made of KB doc ids; the query column: the text column with the most rows);
* KB fields (tenants[].kb.fields): key names of the JSONL's first lines, else their values (the id: unique short
  strings or integers; the content: the longest text);
* language: the queries' CJK share, the rule ingest checks the setting against (qrewrite.data.ingest);
* teacher: the embedded `resolve` teacher run in process on a seeded sample of rows with gold and scored through
  the tenant's local BM25 (tie-aware Hit@1) beside the raw query and query + history, the training gate's
  comparison; where it falls below query + history, people's rewrites (columns.rewrite, scored alike) or an API.

`append_tenant` writes the block into the config file's `tenants:` list as text, so the file's comments stay.
"""

from __future__ import annotations

import asyncio
import copy
import random
import re
import tempfile
import unicodedata
from pathlib import Path

import yaml

from ..errors import QrewriteError

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")  # tenants[].name (the schema's pattern)
SHEET_SAMPLE_ROWS = 200   # data rows read to propose the columns
KB_SAMPLE_LINES = 500     # JSONL lines read to propose the KB fields
DEFAULT_SAMPLE = 60       # rows with gold the teachers are scored on
SAMPLE_SEED = 0           # the sample is the same on every run
GOLD_CELL_SHARE = 0.5     # a column whose cells' tokens are at least this share KB ids is the gold column
MAX_ID_CHARS = 64         # a document id is short
TOP1 = 0.1                # tenants[].thresholds.top1 (the schema default, written out)

# Header synonyms per field, compared without case, spaces or punctuation ("Doc IDs" = "docids").
COLUMN_SYNONYMS = {
    "query": ("问题", "用户问题", "问句", "提问", "query", "question", "user query", "user question", "utterance"),
    "profile": ("画像", "用户画像", "用户信息", "profile", "user profile", "user", "persona"),
    "history": ("历史", "历史摘要", "对话历史", "上下文", "会话", "history", "context", "conversation", "dialogue",
                "dialog"),
    "gold": ("gold", "相关文档", "文档", "文档id", "标准文档", "doc ids", "doc id", "relevant", "relevant docs",
             "gold doc ids"),
    "difficulty": ("难度", "difficulty", "label"),
    "rewrite": ("改写", "参考改写", "标准改写", "rewrite", "reference", "rewritten", "reference rewrite"),
}
FIELD_SYNONYMS = {
    "doc_id": ("id", "doc_id", "_id", "文档id", "docid", "document id", "文档编号"),
    "title": ("title", "name", "标题", "名称", "heading"),
    "content": ("content", "text", "body", "正文", "内容", "passage", "contents"),
}
SYSTEM_PROMPTS = {
    "zh": "你是 {name} 知识库的检索查询改写助手。把用户问题改写成完整独立的检索查询：补全指代，纠正错别字，保留所问的方面。"
          "只输出改写后的查询。",
    "en": "You rewrite search queries for the {name} knowledge base. Rewrite the user question into a complete, "
          "self-contained search query; resolve references, fix typos and keep the aspect asked about. Output only "
          "the rewritten query.",
}
TENANT_KEYS = ("name", "language", "system_prompt", "raw_excel", "sheet", "columns", "kb", "thresholds", "teacher",
               "student")


# ------------------------------------------------------------------------------------------------ inputs
def check_name(name: str) -> None:
    if not NAME_PATTERN.match(name or ""):
        raise QrewriteError(f"tenant name {name!r} is not allowed: lower-case letters, digits, _ and -, starting "
                            "with a letter or digit", hint="e.g. `qrewrite tenant init acme ...` (it names "
                            "results/NAME, models/NAME and logs/NAME)")


def check_file(path: str | Path, what: str, flag: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise QrewriteError(f"{what} not found", file=str(path), hint=f"pass the {what}'s path with {flag}")
    return path


def read_sheet_sample(path: Path, sheet: str | None, max_rows: int = SHEET_SAMPLE_ROWS) -> dict:
    """{title, sheets, header, rows}: the header row and the first `max_rows` data rows as text (rows with no
    value left out), read with ingest's workbook opening and its errors."""
    from ..data.excel import _cell_text, _open_workbook

    wb = _open_workbook(path)
    try:
        if sheet is not None and sheet not in wb.sheetnames:
            raise QrewriteError(f"sheet {sheet!r} not found; sheets: {wb.sheetnames}", file=str(path),
                                hint="pass --sheet with one of them (left out: the first sheet)")
        ws = wb[sheet] if sheet is not None else wb.worksheets[0]
        rows = ws.iter_rows(values_only=True)
        header = [_cell_text(v) for v in next(rows, ())]
        if not any(header):
            raise QrewriteError(f"sheet {ws.title!r} has no header row", file=str(path), row=1,
                                hint="the first row must hold the column headers")
        sample = []
        for values in rows:
            cells = [_cell_text(v) for v in values]
            if any(cells):
                sample.append(cells)
            if len(sample) >= max_rows:
                break
        return {"title": ws.title, "sheets": list(wb.sheetnames), "header": header, "rows": sample}
    finally:
        wb.close()


def read_kb_sample(path: Path, max_lines: int = KB_SAMPLE_LINES) -> list[dict]:
    """The JSON objects of the KB's first `max_lines` lines (a line that is not an object: an error naming it)."""
    from ..io_utils import iter_jsonl

    objs = []
    for lineno, obj in iter_jsonl(path, utf8_hint="save the knowledge base as UTF-8 (e.g. iconv -f GBK -t UTF-8)",
                                  json_hint="each line must be one JSON object"):
        if not isinstance(obj, dict):
            raise QrewriteError("line is not a JSON object", file=str(path), row=lineno,
                                hint="the knowledge base is JSONL: one JSON object (one document) a line")
        objs.append(obj)
        if len(objs) >= max_lines:
            break
    if not objs:
        raise QrewriteError("knowledge base is empty", file=str(path), hint="one JSON object (one document) a line")
    return objs


# ------------------------------------------------------------------------------------------------ matching
def _key(text: str) -> str:
    """A header or field name as names are compared: NFKC, lower case, no spaces, punctuation or underscores."""
    return re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", text or "").lower())


# A header ending so names ids ("user_id", "用户编号"): it reads as no text field, whatever synonym it holds.
_ID_SUFFIX = re.compile(r"(ids?|编号|序号)$")


def name_score(name: str, synonyms, ids: bool = False) -> tuple[int, float, int] | None:
    """How well `name` reads as one of `synonyms`: (2, 1.0, -rank) for equal, (1, share of the name the synonym
    covers, -rank) for a synonym inside it (not in a name of ids unless `ids`), None for neither; rank: the
    synonym's place in `synonyms` (earlier ones win ties)."""
    key = _key(name)
    if not key:
        return None
    best = None
    for rank, syn in enumerate(synonyms):
        s = _key(syn)
        if s == key:
            score = (2, 1.0, -rank)
        elif s and s in key and (ids or not _ID_SUFFIX.search(key)):
            score = (1, len(s) / len(key), -rank)
        else:
            continue
        if best is None or score > best:
            best = score
    return best


def match_names(names: list[str], synonyms: dict, ids: tuple[str, ...] = ("gold", "doc_id")) -> dict[str, int]:
    """Field -> index into `names`, each name for one field at most, the best-scoring pairs first (fields in
    `ids` hold ids, so a name of ids may read as them)."""
    pairs = sorted(((score, -i, field) for field, syns in synonyms.items() for i, n in enumerate(names)
                    if (score := name_score(n, syns, field in ids))), reverse=True)
    out: dict[str, int] = {}
    for _, neg_i, field in pairs:
        if field not in out and -neg_i not in out.values():
            out[field] = -neg_i
    return out


def split_gold(cell: str) -> list[str]:
    """The doc ids of a gold cell, split as ingest splits them."""
    from ..data.ingest import _GOLD_SPLIT

    return [g for g in _GOLD_SPLIT.split(cell or "") if g]


def column_cells(rows: list[list[str]], i: int) -> list[str]:
    return [r[i] for r in rows if i < len(r) and r[i]]


def gold_share(cells: list[str], kb_ids: set[str]) -> tuple[int, int]:
    """(ids that are KB doc ids, ids) over the cells, split as gold cells."""
    ids = [g for c in cells for g in split_gold(c)]
    return sum(1 for g in ids if g in kb_ids), len(ids)


def is_text_column(cells: list[str]) -> bool:
    """Cells that hold text, not numbers (a row number column, a score)."""
    numeric = sum(1 for c in cells if re.fullmatch(r"[-+]?\d+(\.\d+)?", c))
    return bool(cells) and numeric < len(cells) / 2


# ------------------------------------------------------------------------------------------------ proposals
def gold_by_cells(header: list[str], rows: list[list[str]], kb_ids: set[str], taken) -> tuple[int, str] | None:
    """(index, evidence) of the column (not in `taken`) whose cells are most made of KB doc ids, at least
    GOLD_CELL_SHARE of their ids; None when none is."""
    best = None
    for i, name in enumerate(header):
        if name and i not in taken:
            known, total = gold_share(column_cells(rows, i), kb_ids)
            if total and known / total >= GOLD_CELL_SHARE and (best is None or known / total > best[0]):
                best = (known / total, i, f"cells: {known} of {total} ids in column {name!r} are KB doc ids")
    return best and best[1:]


def query_by_cells(header: list[str], rows: list[list[str]], taken) -> tuple[int, str] | None:
    """(index, evidence) of the text column (not in `taken`) with the most filled rows (then the most text)."""
    text = [(len(cells), sum(map(len, cells)), i) for i, name in enumerate(header)
            if name and i not in taken and is_text_column(cells := column_cells(rows, i))]
    if not text:
        return None
    n, _, i = max(text)
    return i, f"cells: the text column with the most rows ({n} of {len(rows)}); no header reads as the question"


def propose_columns(header: list[str], rows: list[list[str]], kb_ids: set[str]) -> tuple[dict, dict]:
    """(columns, evidence): tenants[].columns from the header names, the gold and query columns from the cells
    where no name says; every field not found is None."""
    from ..data.excel import COLUMN_KEYS

    found = match_names(header, COLUMN_SYNONYMS)
    evidence = {k: f"header {header[i]!r}" for k, i in found.items()}
    if "gold" in found:
        known, total = gold_share(column_cells(rows, found["gold"]), kb_ids)
        evidence["gold"] += f"; {known} of {total} ids in its first {len(rows)} rows are KB doc ids"
    elif by_cells := gold_by_cells(header, rows, kb_ids, set(found.values())):
        found["gold"], evidence["gold"] = by_cells
    if "query" not in found and (by_cells := query_by_cells(header, rows, set(found.values()))):
        found["query"], evidence["query"] = by_cells
    columns = {k: header[found[k]] if k in found else None for k in COLUMN_KEYS}
    return columns, {k: evidence.get(k, "no such column") for k in COLUMN_KEYS}


def _field_values(objs: list[dict], key: str) -> list:
    return [o[key] for o in objs if key in o]


def is_id_field(objs: list[dict], key: str) -> bool:
    """Every object has it, as a short non-empty string or an integer, each value once."""
    values = _field_values(objs, key)
    texts = [str(v).strip() for v in values if isinstance(v, (str, int)) and not isinstance(v, bool)]
    return (len(values) == len(objs) and len(texts) == len(values) and all(texts)
            and len(set(texts)) == len(texts) and max(map(len, texts)) <= MAX_ID_CHARS)


def mean_text_len(objs: list[dict], key: str) -> float:
    """Mean length of the key's string values (0 when it has none)."""
    texts = [v for v in _field_values(objs, key) if isinstance(v, str)]
    return sum(map(len, texts)) / len(texts) if texts else 0.0


def pick_id_field(objs: list[dict], keys: list[str], named: dict) -> tuple[str | None, str]:
    """(key, evidence) of the documents' id: the key named so when its values are ids, else the first key whose
    values are (unique short strings or integers in every line), else the named key all the same (load_kb then
    says what is wrong with it: a repeated or empty id, on its line)."""
    n = len(objs)
    name = keys[named["doc_id"]] if "doc_id" in named else None
    if name is not None and is_id_field(objs, name):
        return name, f"key name; {n} unique values in the first {n} lines"
    others = [k for k in keys if k not in (keys[i] for i in named.values()) and is_id_field(objs, k)]
    if others:
        return others[0], f"values: unique short strings or integers in all of the first {n} lines"
    return name, "key name (its values are not unique short ids: see the KB check)"


def pick_title_field(objs: list[dict], keys: list[str], named: dict, doc_id: str) -> tuple[str | None, str]:
    name = keys[named["title"]] if "title" in named else None
    if name is not None and name != doc_id and mean_text_len(objs, name):
        return name, f"key name; mean {mean_text_len(objs, name):.0f} characters"
    return None, "no key reads as a title"


def pick_content_field(objs: list[dict], keys: list[str], named: dict, exclude: tuple) -> tuple[str | None, str]:
    """(key, evidence) of the document text: the key named so when it holds text, else the longest text."""
    name = keys[named["content"]] if "content" in named else None
    if name is not None and mean_text_len(objs, name):
        return name, f"key name; mean {mean_text_len(objs, name):.0f} characters"
    texts = [(mean_text_len(objs, k), k) for k in keys if k not in exclude and mean_text_len(objs, k)]
    if not texts:
        return None, ""
    length, key = max(texts)
    return key, f"values: the longest text (mean {length:.0f} characters)"


def propose_kb_fields(objs: list[dict], path: Path) -> tuple[dict, dict]:
    """(fields, evidence): tenants[].kb.fields by key names, else by values (the id: unique short strings or
    integers; the content: the longest text); title None when no key is named so. A KB without an id or a
    content field is a QrewriteError naming the file and the keys found."""
    keys = list(dict.fromkeys(k for o in objs for k in o))
    named = match_names(keys, FIELD_SYNONYMS)
    doc_id, id_why = pick_id_field(objs, keys, named)
    if doc_id is None:
        raise QrewriteError(f"no field reads as the document id; fields found: {keys}", file=str(path), row=1,
                            hint="every document needs a unique id (the ids the sheet's gold column cites), under "
                                 "a key such as id or doc_id")
    title, title_why = pick_title_field(objs, keys, named, doc_id)
    content, content_why = pick_content_field(objs, keys, named, (doc_id, title))
    if content is None:
        raise QrewriteError(f"no field holds the document text; fields found: {keys}", file=str(path), row=1,
                            hint="every document needs its text under a key such as content or text")
    return ({"doc_id": doc_id, "title": title, "content": content},
            {"doc_id": id_why, "title": title_why, "content": content_why})


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


def sheet_rows(raw: list[dict], kb_ids: set[str]) -> list[dict]:
    """read_excel's records as ingest makes them rows (collapsed whitespace, no empty or repeated question, gold
    ids split), with `gold_cited` (every id of the cell) beside `gold_doc_ids` (those in the KB)."""
    from ..data.ingest import query_id

    seen, rows = set(), []
    for rec in raw:
        query = re.sub(r"\s+", " ", rec["query"]).strip()
        qid = query_id(query, rec.get("profile", ""), rec.get("history", ""))
        if not query or qid in seen:
            continue
        seen.add(qid)
        cited = split_gold(rec.get("gold", ""))
        row = {"id": qid, "row": rec["row"], "query": query, "profile": rec.get("profile", ""),
               "history": rec.get("history", ""), "gold_doc_ids": [g for g in cited if g in kb_ids],
               "gold_cited": cited}
        if "rewrite" in rec:
            row["reference"] = re.sub(r"\s+", " ", rec["rewrite"]).strip()
        rows.append(row)
    return rows


def gold_coverage(rows: list[dict]) -> dict:
    """How many of the gold ids the rows cite are in the KB, the rows with gold, the first ids missing."""
    cited = sum(len(r["gold_cited"]) for r in rows)
    missing = [(g, r["row"]) for r in rows for g in r["gold_cited"] if g not in r["gold_doc_ids"]]
    return {"cited": cited, "in_kb": cited - len(missing), "rows": len(rows),
            "rows_with_gold": sum(1 for r in rows if r["gold_doc_ids"]), "missing": missing[:5]}


def sample_rows(rows: list[dict], n: int, seed: int = SAMPLE_SEED) -> list[dict]:
    """Up to `n` of the rows with gold documents, drawn with a fixed seed, in sheet order."""
    with_gold = [r for r in rows if r["gold_doc_ids"]]
    picked = sorted(random.Random(seed).sample(range(len(with_gold)), min(n, len(with_gold))))
    return [with_gold[i] for i in picked]


def system_prompt(name: str, language: str) -> str:
    return SYSTEM_PROMPTS[language].format(name=name)


def project_path(path: Path, root: Path) -> str:
    """`path` as config.yaml names it: relative to the project root (the config file's folder) when inside it."""
    p = path.resolve()
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return str(p)


def tenant_entry(name: str, *, language: str, raw_excel: str, sheet: str | None, columns: dict, kb_path: str,
                 fields: dict, teacher: str) -> dict:
    """The tenant block, keys in README order (tenants[] of qrewrite/schemas/config.schema.yaml)."""
    return {"name": name, "language": language, "system_prompt": system_prompt(name, language),
            "raw_excel": raw_excel, "sheet": sheet, "columns": dict(columns),
            "kb": {"path": kb_path, "name": f"{name}_kb", "fields": dict(fields)},
            "thresholds": {"top1": TOP1}, "teacher": {"provider": teacher}, "student": "auto"}


# ------------------------------------------------------------------------------------------------ teachers
def scoring_config(cfg: dict, tenant: dict, source: str) -> dict:
    """`cfg` (validated) with `tenant` in place of any tenant of its name, validated again (the tenant's defaults
    filled in, the block checked beside the other tenants)."""
    out = copy.deepcopy(cfg)
    out["tenants"] = [t for t in out["tenants"] if t["name"] != tenant["name"]] + [copy.deepcopy(tenant)]
    out.pop("only", None)
    from ..config import validate_config

    return validate_config(out, source=source)


def hit_at_1(hits: list[dict], gold: list[str]) -> float:
    from ..metrics import gold_ranking

    return gold_ranking(hits, gold)["hit_at_1"]


def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def mentions_entity(text: str, entities: list[str]) -> bool:
    from ..text import normalize

    low = normalize(text)
    return any(normalize(e) in low for e in entities)


async def _hits(rag, rows: list[dict], texts: list[str | None]) -> list[float]:
    """Hit@1 of each row's text sent as the rewrite beside its question (the RAG service's call); a row without a
    text (a failed teacher call, an empty cell) is a miss, as the training gate counts it."""
    return [hit_at_1(await rag.search(r["query"], t), r["gold_doc_ids"]) if t else 0.0 for r, t in zip(rows, texts)]


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
    it cannot start) and the sheet's reference rewrites (with columns.rewrite), through the tenant's local BM25;
    the entities resolve reads off the KB titles and the rows it wrote one into."""
    from ..entities import EntityLexicon
    from ..text import with_history

    rag = make_local_rag(cfg, tenant)
    try:
        docs = rag.retriever.docs
        lexicon = EntityLexicon.from_docs(docs)
        texts, error = await _resolve_texts(cfg, tenant, rows)
        column = tenant["columns"].get("rewrite")
        return {"n": len(rows), "docs": len(docs), "titled": sum(1 for d in docs if d.title.strip()),
                "entities": len(lexicon.entities),
                "raw": mean(await _hits(rag, rows, [r["query"] for r in rows])),
                "query_history": mean(await _hits(rag, rows, [with_history(r["query"], r) for r in rows])),
                "resolve": None if texts is None else mean(await _hits(rag, rows, texts)), "resolve_error": error,
                "referents": sum(1 for t in texts or () if t and mentions_entity(t, lexicon.entities)),
                "column": mean(await _hits(rag, rows, [r.get("reference") for r in rows])) if column else None,
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


def _fmt(x: float | None) -> str:
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
        return "resolve", [f"resolve fits: Hit@1 {_fmt(fit['resolve'])} >= query + history {_fmt(qh)}; it wrote a "
                           f"KB product/course name into {fit['referents']} of {fit['n']} rows (embedded, no API)"]
    if fit["resolve"] is None:
        titles = (f"{fit['titled']} of {fit['docs']} documents have a title; none reads \"<entity> <aspect>\" with "
                  "one entity over several aspects") if fit["titled"] else "no document has a title"
        why = f"KB titles name no product or course ({titles}): resolve found a referent in 0 of {fit['n']} rows"
    else:
        why = (f"resolve's Hit@1 {_fmt(fit['resolve'])} is below query + history's {_fmt(qh)}: it found a referent "
               f"in {fit['referents']} of {fit['n']} rows ({fit['entities']} products/courses read off the KB titles)")
    reasons = [f"resolve does not fit: {why}"]
    if fit["column"] is not None:
        ok = fit["column"] >= qh
        reasons.append(f"the sheet's rewrites (columns.rewrite): Hit@1 {_fmt(fit['column'])} "
                       f"{'>=' if ok else '<'} query + history {_fmt(qh)}"
                       + (f"; {fit['column_empty']} empty cells count as misses" if fit["column_empty"] else ""))
        if ok:
            return "column", reasons + ["recommended: people's rewrites, `teacher: {provider: column}` with "
                                        f"columns.rewrite set; or {api}"]
    return "openai", reasons + [f"recommended: {api}"]


# ------------------------------------------------------------------------------------------------ the block
def _flow(value) -> str:
    """`value` as one line of YAML (a scalar, or a mapping in flow style), quoted where YAML needs it."""
    text = yaml.safe_dump(value, allow_unicode=True, default_flow_style=True, width=10 ** 6, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def tenant_yaml(tenant: dict, indent: int = 2, notes: dict | None = None) -> str:
    """The tenant as a `tenants:` list item indented by `indent`, one line a key (kb on its own lines),
    `notes` as end-of-line comments."""
    notes = notes or {}
    pad, key_pad = " " * indent, " " * (indent + 2)

    def line(prefix: str, key: str, value) -> str:
        note = f"   # {notes[key]}" if notes.get(key) else ""
        return f"{prefix}{key}: {_flow(value)}{note}"

    lines = [line(f"{pad}- ", "name", tenant["name"])]
    for key in TENANT_KEYS[1:]:
        if key == "kb":
            lines.append(f"{key_pad}kb:")
            lines += [line(key_pad + "  ", k, tenant["kb"][k]) for k in ("path", "name", "fields")]
        else:
            lines.append(line(key_pad, key, tenant[key]))
    text = "\n".join(lines) + "\n"
    if yaml.safe_load(text) != [tenant]:  # the text must read back as the block, whatever the values hold
        raise QrewriteError(f"the tenant block of {tenant['name']} does not read back as written",
                            hint="report this with the sheet's header names")
    return text


def block_notes(fit: dict | None) -> dict:
    notes = {"sheet": "null = the first sheet", "thresholds": "the default (docs/signals.md)"}
    if fit and fit["n"]:
        resolve = "cannot start" if fit["resolve_error"] else _fmt(fit["resolve"])
        notes["teacher"] = (f"qrewrite tenant init: Hit@1 on {fit['n']} sampled rows: raw {_fmt(fit['raw'])}, "
                            f"query + history {_fmt(fit['query_history'])}, resolve {resolve}"
                            + (f", column {_fmt(fit['column'])}" if fit["column"] is not None else ""))
    return notes


# ------------------------------------------------------------------------------------------------ config file
def existing_tenants(config_path: Path) -> list[str]:
    from ..config import _read_raw

    raw = _read_raw(config_path)
    return [t.get("name") for t in raw.get("tenants") or [] if isinstance(t, dict)]


def refuse_existing(config_path: Path, name: str) -> None:
    if name in existing_tenants(config_path):
        raise QrewriteError(f"a tenant named {name!r} is already in the config: nothing written", file=str(config_path),
                            hint=f"pick another name, or edit tenant {name}'s entry by hand")


def _unrecognised(path: str, why: str) -> QrewriteError:
    return QrewriteError(f"cannot add the tenant: {why}; nothing written", file=path,
                         hint="paste the printed block under `tenants:` by hand")


def insert_tenant(text: str, tenant: dict, source: str, notes: dict | None = None) -> str:
    """`text` (a config file) with `tenant` appended to its `tenants:` block list as text: after the last entry,
    before the comments and blank lines that lead into the next top-level key, indented like the entries. The
    comments stay where they were. A QrewriteError when the file's layout is not a `tenants:` block list."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if re.fullmatch(r"tenants:[ \t]*(#.*)?", ln.rstrip("\r\n"))]
    if len(starts) != 1:
        raise _unrecognised(source, "no `tenants:` line of its own at the top level" if not starts else
                            "`tenants:` appears more than once")
    start = starts[0]

    def top_level_key(ln: str) -> bool:
        return bool(ln.strip()) and ln[0] not in " \t#-"

    end = next((i for i in range(start + 1, len(lines)) if top_level_key(lines[i])), len(lines))
    entries = [ln for ln in lines[start + 1:end] if re.match(r"[ ]*- ", ln)]
    if not entries:
        raise _unrecognised(source, "the `tenants:` list has no `- name: ...` entries in block style")
    indent = len(entries[0]) - len(entries[0].lstrip(" "))
    at = end
    while at > start + 1 and (not lines[at - 1].strip() or lines[at - 1].startswith("#")):
        at -= 1  # blank lines and column-0 comments just above the next key belong to it
    nl = "\r\n" if "\r\n" in text else "\n"
    head = lines[:at]
    if head and not head[-1].endswith("\n"):
        head[-1] += nl
    new = "".join(head + [nl, tenant_yaml(tenant, indent, notes).replace("\n", nl)] + lines[at:])
    if not _appended(text, new, tenant):
        raise _unrecognised(source, "the `tenants:` list does not end where its indentation says")
    return new


def _appended(old: str, new: str, tenant: dict) -> bool:
    """Whether config text `new` reads as `old` with `tenant` after its last tenant and nothing else changed."""
    try:
        before, after = yaml.safe_load(old), yaml.safe_load(new)
    except yaml.YAMLError:
        return False
    if not (isinstance(before, dict) and isinstance(after, dict) and isinstance(before.get("tenants"), list)):
        return False
    rest = lambda cfg: {k: v for k, v in cfg.items() if k != "tenants"}  # noqa: E731
    return after.get("tenants") == before["tenants"] + [tenant] and rest(after) == rest(before)


def append_tenant(config_path: Path, tenant: dict, notes: dict | None = None) -> None:
    """Append `tenant` to the config file's tenants (comments kept), atomically; the file must then load
    (qrewrite.config.load_config), else the old file is put back and the error raised."""
    from ..config import load_config
    from ..io_utils import write_text_atomic

    refuse_existing(config_path, tenant["name"])
    old = config_path.read_text(encoding="utf-8")
    new = insert_tenant(old, tenant, str(config_path), notes)
    write_text_atomic(config_path, new)
    try:
        load_config(config_path)
    except QrewriteError as exc:
        write_text_atomic(config_path, old)
        raise QrewriteError(f"with tenant {tenant['name']} added the config does not validate, so it was left as it "
                            f"was: {exc}", file=str(config_path)) from None


# ------------------------------------------------------------------------------------------------ the whole
def read_kb(path: Path) -> dict:
    """The KB's proposal: its fields with their evidence, then the whole KB loaded under them (ingest's checks:
    duplicate ids, empty content) for its ids."""
    from ..kb import load_kb

    objs = read_kb_sample(path)
    fields, evidence = propose_kb_fields(objs, path)
    docs = load_kb(path, fields)
    return {"path": str(path), "docs": len(docs), "ids": {d.doc_id for d in docs},
            "keys": list(dict.fromkeys(k for o in objs for k in o)), "sample_lines": len(objs), "fields": fields,
            "evidence": evidence}


def read_sheet(path: Path, sheet: str | None, kb_ids: set[str]) -> dict:
    """The sheet's proposal: its columns with their evidence, then every row read under them as ingest reads
    them (read_excel's checks: merged cells, formulas)."""
    from ..data.excel import read_excel

    found = read_sheet_sample(path, sheet)
    columns, evidence = propose_columns(found["header"], found["rows"], kb_ids)
    if columns["query"] is None:
        raise QrewriteError(f"no column of sheet {found['title']!r} reads as the questions; columns found: "
                            f"{[h for h in found['header'] if h]}", file=str(path), row=1,
                            hint="name the question column 问题 / 用户问题 / query / question and rerun")
    rows = sheet_rows(read_excel(path, columns, sheet), kb_ids)
    if not rows:
        raise QrewriteError("no data rows under the header", file=str(path), column=columns["query"],
                            hint="the test set has no questions")
    return {"path": str(path), "sheet": found["title"], "sheets": found["sheets"], "header": found["header"],
            "sample_rows": len(found["rows"]), "rows": rows, "columns": columns, "evidence": evidence}


def propose_teacher(cfg: dict, scoring: dict, rows: list[dict], sample: int, source: str) -> dict:
    """The teachers' figures on a seeded sample of the rows with gold and the provider chosen on them."""
    picked = sample_rows(rows, sample)
    fit = score_teachers(scoring_config(cfg, scoring, source), scoring["name"], picked) if picked else {"n": 0}
    provider, reasons = choose_teacher(fit, bool(scoring["columns"]["rewrite"]))
    return {"fit": fit, "provider": provider, "reasons": reasons, "sample": sample, "seed": SAMPLE_SEED}


def propose(name: str, excel: str | Path, kb: str | Path, *, sheet: str | None = None,
            config: str | Path = "config.yaml", sample: int = DEFAULT_SAMPLE) -> dict:
    """Everything `qrewrite tenant init` reports: each proposal with its evidence, and the tenant block."""
    from ..config import load_config

    check_name(name)
    excel, kb = check_file(excel, "Excel test set", "--excel"), check_file(kb, "knowledge base", "--kb")
    config = Path(config)
    cfg = load_config(config)
    kb_found = read_kb(kb)
    sheet_found = read_sheet(excel, sheet, kb_found["ids"])
    rows = sheet_found["rows"]
    language = detect_language([r["query"] for r in rows])
    entry = dict(language=language["language"], sheet=sheet, columns=sheet_found["columns"],
                 fields=kb_found["fields"])
    # scored with the files where they are; the block names them from the project root (the config's folder)
    scoring = tenant_entry(name, raw_excel=str(excel.resolve()), kb_path=str(kb.resolve()), teacher="resolve",
                           **entry)
    teacher = propose_teacher(cfg, scoring, rows, sample, str(config))
    root = config.resolve().parent
    tenant = tenant_entry(name, raw_excel=project_path(excel, root), kb_path=project_path(kb, root),
                          teacher=teacher["provider"], **entry)
    scoring_config(cfg, tenant, str(config))  # the block as proposed validates beside the config's tenants
    return {"name": name, "config": str(config), "config_is_default": config == Path("config.yaml"),
            "exists": name in [t["name"] for t in cfg["tenants"]],
            "excel": {**{k: v for k, v in sheet_found.items() if k not in ("rows", "columns", "evidence")},
                      "rows": len(rows), "inside": not Path(tenant["raw_excel"]).is_absolute()},
            "kb": {k: v for k, v in kb_found.items() if k not in ("ids", "fields", "evidence")},
            "columns": sheet_found["columns"], "column_evidence": sheet_found["evidence"],
            "fields": kb_found["fields"], "field_evidence": kb_found["evidence"], "gold": gold_coverage(rows),
            "language": language, "teacher": teacher, "tenant": tenant, "notes": block_notes(teacher["fit"])}


# ------------------------------------------------------------------------------------------------ output
def next_commands(p: dict, written: bool) -> list[str]:
    """README "Your own tenant in five minutes", step 3 and 4, for this tenant."""
    name, cfg_flag = p["name"], "" if p["config_is_default"] else f" --config {p['config']}"
    snake = "" if p["config_is_default"] else f" --configfile {p['config']}"
    out = [] if written else [f"add the block under `tenants:` in {p['config']} (or rerun with --write)"]
    if p["tenant"]["teacher"]["provider"] == "openai":
        out.append("export OPENAI_API_KEY=...   # teacher.openai.api_key_env; teacher.openai names the model "
                   "(README \"Pointing at real services\")")
    if not p["excel"]["inside"]:
        out.append(f"the Excel is outside the project: put it at data/raw/{name}.xlsx and set raw_excel (README "
                   "step 1)")
    steps = [(f".venv/bin/qrewrite config{cfg_flag} > /dev/null", "validates the config"),
             (f".venv/bin/snakemake --cores 2 -n data --config only={name}{snake}", "plan (a dry run writes nothing)"),
             (f".venv/bin/snakemake --cores 2 data --config only={name}{snake}",
              f"data half: results/{name}/summary.json"),
             (f".venv/bin/snakemake --cores 2 --config only={name}{snake}", f"+ SFT, RL and eval (reports/{name}/)"),
             (".venv/bin/qrewrite dvc-yaml", "dvc.yaml lists each tenant's stages: regenerate it, commit it")]
    width = max(len(c) for c, _ in steps) + 2
    return out + [f"{c:<{width}}# {why}" for c, why in steps]


def _pad(text: str, width: int) -> str:
    """`text` padded to `width` terminal columns (a CJK character takes two)."""
    cols = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(1, width - cols)


def _table(items: dict, evidence: dict) -> list[str]:
    return [f"  {_pad(key, 12)}{_pad('null' if v is None else str(v), 14)}{evidence[key]}" for key, v in items.items()]


def render_report(p: dict) -> str:
    """The readable report: each proposal with its evidence, then the tenant block."""
    x, k, g, lang, t = p["excel"], p["kb"], p["gold"], p["language"], p["teacher"]
    out = [f"qrewrite tenant init {p['name']}: {x['path']} (sheet {x['sheet']!r}, {x['rows']} questions) + "
           f"{k['path']} ({k['docs']} documents)", "",
           f"Columns (header: {', '.join(h for h in x['header'] if h)}; first {x['sample_rows']} rows read)"]
    out += _table(p["columns"], p["column_evidence"])
    out += ["", f"KB fields (keys of the first {k['sample_lines']} lines: {', '.join(map(str, k['keys']))})"]
    out += _table(p["fields"], p["field_evidence"])
    gold_line = (f"  gold ids: {g['in_kb']} of {g['cited']} cited in the sheet's rows are in the KB; "
                 f"{g['rows_with_gold']} of {g['rows']} rows have gold") if p["columns"]["gold"] else \
        "  gold ids: no gold column: Hit@1 cannot be measured on this sheet"
    out.append(gold_line)
    if g["missing"]:
        out.append("  not in the KB: " + ", ".join(f"{gid} (row {row})" for gid, row in g["missing"])
                   + " (ingest stops when over 10 % of the cited ids are missing: thresholds.max_missing_gold_share)")
    out += ["", f"Language: {lang['language']}", f"  {lang['evidence']}", ""]
    fit = t["fit"]
    if fit["n"]:
        out.append(f"Teacher (tie-aware Hit@1 through the tenant's local BM25 on {fit['n']} rows with gold, sampled "
                   f"with seed {t['seed']}, --sample {t['sample']})")
        out += [f"  raw query        {_fmt(fit['raw'])}", f"  query + history  {_fmt(fit['query_history'])}",
                f"  resolve          {_fmt(fit['resolve'])}"
                + ("       (cannot start on this KB)" if fit["resolve_error"] else
                   f"   referent written in {fit['referents']} of {fit['n']} rows")]
        if fit["column"] is not None:
            out.append(f"  column           {_fmt(fit['column'])}   (the sheet's rewrites, {p['columns']['rewrite']})")
    else:
        out.append("Teacher (no rows with gold documents in the KB to score on)")
    out += [f"  {r}" for r in t["reasons"]]
    out.append(f"  → teacher: {{provider: {t['provider']}}}")
    if p["exists"]:
        out += ["", f"Note: a tenant named {p['name']!r} is already in {p['config']}: --write refuses it"]
    out += ["", f"Tenant block (under `tenants:` in {p['config']}):", "",
            tenant_yaml(p["tenant"], 2, p["notes"]).rstrip("\n")]
    return "\n".join(out)
