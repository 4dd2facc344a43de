"""`qrewrite tenant init`: read a tenant's Excel test set and JSONL knowledge base, propose its config block.

Each proposal comes with the evidence it rests on, so a person can check it before the pipeline runs on it; each
has its module:

* columns (tenants[].columns, columns.py): the sheet's header names against Chinese and English synonyms
  (names.py); where no header says, the cells (a gold column: cells made of KB doc ids; the query column: the text
  column with the most rows);
* KB fields (tenants[].kb.fields, kb_fields.py): key names of the JSONL's first lines, else their values (the id:
  unique short strings or integers; the content: the longest text);
* the rows (rows.py): made by ingest's own row builder, so what the pipeline will drop (max_query_chars) is dropped
  here too; language: the queries' CJK share, the rule ingest checks the setting against (qrewrite.data.ingest);
* teacher (teachers.py): the embedded `resolve` teacher run in process on a seeded sample of rows with gold and
  scored through the tenant's local BM25 (tie-aware Hit@1) beside the raw query and query + history, the training
  gate's comparison; where it falls below query + history, people's rewrites (columns.rewrite, scored alike) or an
  API.

The block and its text: block.py; adding it to the config file with its comments kept: config_file.py; the printed
report: report.py; the files read: inputs.py.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import QrewriteError
from .block import project_path, tenant_entry
from .columns import propose_columns
from .inputs import check_file, check_name, read_kb_sample, read_sheet_sample
from .kb_fields import propose_kb_fields
from .rows import DEFAULT_SAMPLE, detect_language, gold_coverage, max_query_chars, sheet_rows
from .teachers import block_notes, propose_teacher, scoring_config


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


def read_sheet(path: Path, sheet: str | None, kb_ids: set[str], name: str) -> dict:
    """The sheet's proposal: its columns with their evidence, then every row read under them as ingest reads
    them (read_excel's checks: merged cells, formulas) and made rows of tenant `name` by ingest's builder."""
    from ..data.excel import read_excel

    found = read_sheet_sample(path, sheet)
    columns, evidence = propose_columns(found["header"], found["rows"], kb_ids)
    if columns["query"] is None:
        raise QrewriteError(f"no column of sheet {found['title']!r} reads as the questions; columns found: "
                            f"{[h for h in found['header'] if h]}", file=str(path), row=1,
                            hint="name the question column 问题 / 用户问题 / query / question and rerun")
    rows, dropped = sheet_rows(read_excel(path, columns, sheet), kb_ids, name)
    too_long = dropped["dropped"]["query_too_long"]
    if not rows:
        raise QrewriteError("no data rows under the header", file=str(path), column=columns["query"],
                            hint="the test set has no questions" + (
                                f" ({too_long} over tenants[].thresholds.max_query_chars, {max_query_chars()} "
                                "characters: set it in the block to keep them)" if too_long else ""))
    return {"path": str(path), "sheet": found["title"], "sheets": found["sheets"], "header": found["header"],
            "sample_rows": len(found["rows"]), "rows": rows, "columns": columns, "evidence": evidence,
            "gold": gold_coverage(rows, dropped), "too_long": too_long}


def propose(name: str, excel: str | Path, kb: str | Path, *, sheet: str | None = None,
            config: str | Path = "config.yaml", sample: int = DEFAULT_SAMPLE) -> dict:
    """Everything `qrewrite tenant init` reports: each proposal with its evidence, and the tenant block."""
    from ..config import load_config

    check_name(name)
    excel, kb = check_file(excel, "Excel test set", "--excel"), check_file(kb, "knowledge base", "--kb")
    config = Path(config)
    cfg = load_config(config)
    kb_found = read_kb(kb)
    sheet_found = read_sheet(excel, sheet, kb_found["ids"], name)
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
            "excel": {**{k: v for k, v in sheet_found.items() if k not in ("rows", "columns", "evidence", "gold")},
                      "rows": len(rows), "inside": not Path(tenant["raw_excel"]).is_absolute()},
            "kb": {k: v for k, v in kb_found.items() if k not in ("ids", "fields", "evidence")},
            "columns": sheet_found["columns"], "column_evidence": sheet_found["evidence"],
            "fields": kb_found["fields"], "field_evidence": kb_found["evidence"], "gold": sheet_found["gold"],
            "language": language, "teacher": teacher, "tenant": tenant, "notes": block_notes(teacher["fit"])}
