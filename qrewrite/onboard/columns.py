"""The sheet's column mapping (tenants[].columns): its header names against Chinese and English synonyms; where no
header says, its cells (a gold column: cells made of KB doc ids; the query column: the text column with the most
rows)."""

from __future__ import annotations

import re

from .names import match_names

GOLD_CELL_SHARE = 0.5     # a column whose cells' tokens are at least this share KB ids is the gold column

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


def column_cells(rows: list[list[str]], i: int) -> list[str]:
    return [r[i] for r in rows if i < len(r) and r[i]]


def gold_share(cells: list[str], kb_ids: set[str]) -> tuple[int, int]:
    """(ids that are KB doc ids, ids) over the cells, split as ingest splits gold cells."""
    from ..data.ingest import split_gold

    ids = [g for c in cells for g in split_gold(c)]
    return sum(1 for g in ids if g in kb_ids), len(ids)


def is_text_column(cells: list[str]) -> bool:
    """Cells that hold text, not numbers (a row number column, a score)."""
    numeric = sum(1 for c in cells if re.fullmatch(r"[-+]?\d+(\.\d+)?", c))
    return bool(cells) and numeric < len(cells) / 2


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
