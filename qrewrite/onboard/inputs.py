"""`qrewrite tenant init`'s inputs: the tenant's name, and a sample of the sheet and of the KB to propose from."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import QrewriteError

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")  # tenants[].name (the schema's pattern)
SHEET_SAMPLE_ROWS = 200   # data rows read to propose the columns
KB_SAMPLE_LINES = 500     # JSONL lines read to propose the KB fields


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
