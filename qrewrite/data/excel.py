"""Read a tenant's raw Excel test set; build the demo Excel from its reviewable JSONL source."""

from __future__ import annotations

import datetime as dt
import re
import zipfile
from pathlib import Path

import openpyxl
from openpyxl.utils.exceptions import InvalidFileException

from ..errors import QrewriteError
from ..io_utils import atomic_path, read_jsonl

# The fields a tenant's sheet may have (tenants[].columns): query is required, the rest optional.
COLUMN_KEYS = ("query", "profile", "history", "gold", "difficulty", "rewrite")
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # encrypted .xlsx and legacy .xls are OLE containers
_FIXED_TIME = dt.datetime(2020, 1, 1)


def _open_workbook(path: Path):
    if not path.exists():
        raise QrewriteError("raw Excel file not found", file=str(path),
                            hint="check tenants[].raw_excel in config.yaml")
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head[:8] == _OLE_MAGIC:
        raise QrewriteError("file is password-protected or a legacy .xls, not an .xlsx workbook", file=str(path),
                            hint="remove the password / save as .xlsx in Excel, then rerun")
    if not head.startswith(b"PK"):
        # Text (any encoding, e.g. a UTF-8 or GBK CSV) has no control bytes besides tab and newlines.
        kind = "is empty" if not head else "looks like text (a CSV?)" \
            if all(b >= 32 and b != 127 or b in (9, 10, 13) for b in head) else "is not a zip archive"
        raise QrewriteError(f"not an Excel .xlsx file (the file {kind})", file=str(path),
                            hint="export the sheet as .xlsx; a CSV renamed to .xlsx is not a workbook")
    try:
        # Not read-only: merged-cell ranges are only available on a normal worksheet.
        return openpyxl.load_workbook(path, data_only=False)
    except (InvalidFileException, zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise QrewriteError(f"cannot read workbook ({type(exc).__name__}: {exc})", file=str(path),
                            hint="open and re-save it as .xlsx") from None


def _cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def read_excel(path: str | Path, columns: dict, sheet: str | None = None) -> list[dict]:
    """Rows as dicts with keys query/profile/history/gold/difficulty/rewrite (those configured) and `row` (1-based Excel row number).

    Every configured column must be in the header (a column that is absent is configured as null); errors
    name the file, row and column. Rows whose cells are all empty are skipped silently (Excel
    often keeps formatted blank rows); everything else is returned for ingest to normalise or drop.
    """
    path = Path(path)
    wb = _open_workbook(path)
    try:
        if sheet is not None and sheet not in wb.sheetnames:
            raise QrewriteError(f"sheet {sheet!r} not found; sheets: {wb.sheetnames}", file=str(path),
                                hint="fix tenants[].sheet in config.yaml (null = first sheet)")
        ws = wb[sheet] if sheet else wb.worksheets[0]
        if ws.max_row < 1 or (ws.max_row == 1 and ws.max_column == 1 and ws.cell(1, 1).value is None):
            raise QrewriteError(f"sheet {ws.title!r} is empty", file=str(path),
                                hint="the first row must hold the column headers")
        header = [_cell_text(c.value) for c in ws[1]]
        wanted = {key: columns.get(key) for key in COLUMN_KEYS}
        index: dict[str, int] = {}
        for key, name in wanted.items():
            if name is None:
                continue  # configured as absent (columns.<key>: null)
            if name not in header:
                found = [h for h in header if h]
                hint = f"rename the column in the sheet or set tenants[].columns.{key} to its name"
                if key != "query":
                    hint += f" (or to null if the sheet has no {key} column)"
                raise QrewriteError(f"missing column {name!r} ({key}); columns found: {found}", file=str(path),
                                    row=1, column=name, hint=hint)
            index[key] = header.index(name)
        for rng in ws.merged_cells.ranges:
            if rng.max_row >= 2 and any(rng.min_col - 1 <= i <= rng.max_col - 1 for i in index.values()):
                col = header[rng.min_col - 1] if rng.min_col - 1 < len(header) else rng.coord
                raise QrewriteError(f"merged cells {rng.coord} in the data area", file=str(path), row=rng.min_row,
                                    column=col, hint="unmerge the cells and fill each row's value")
        rows = []
        for r, cells in enumerate(ws.iter_rows(min_row=2), start=2):
            rec = {"row": r}
            for key, i in index.items():
                cell = cells[i] if i < len(cells) else None
                if cell is not None and cell.data_type == "f":
                    raise QrewriteError(f"cell {cell.coordinate} holds a formula ({cell.value}), not a value",
                                        file=str(path), row=r, column=header[i],
                                        hint="paste the column as values in Excel")
                rec[key] = _cell_text(cell.value if cell is not None else None)
            if not any(rec.get(k) for k in index):
                continue
            rows.append(rec)
        return rows
    finally:
        wb.close()


def build_excel(source: str | Path, out: str | Path, columns: dict) -> int:
    """Write the demo workbook from its JSONL source (query, profile, history, gold_doc_ids, underspecified):
    one column per configured (non-null) entry of `columns`.

    Timestamps are pinned so the same source always gives the same bytes (stable hashes for DVC/lineage).
    """
    rows = read_jsonl(source)
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "queries"
    keys = [k for k in COLUMN_KEYS if columns.get(k)]
    ws.append([columns[k] for k in keys])
    for i, r in enumerate(rows, 1):
        if not isinstance(r.get("query"), str):
            raise QrewriteError("missing or non-string field", file=str(source), row=i, column="query",
                                hint="every line of the demo source needs a \"query\" string")
        values = {"query": r["query"], "profile": r.get("profile", ""), "history": r.get("history", ""),
                  "gold": ",".join(r.get("gold_doc_ids", [])), "difficulty": _difficulty(r),
                  "rewrite": r.get("rewrite", "")}
        ws.append([values[k] for k in keys])
    wb.properties.created = wb.properties.modified = _FIXED_TIME
    with atomic_path(out) as tmp:
        wb.save(tmp)
        _pin_zip_times(tmp)
    return len(rows)


def _difficulty(row: dict) -> str:
    """A demo row's difficulty label: its `difficulty`, else from the `underspecified` flag."""
    if row.get("difficulty"):
        return str(row["difficulty"])
    if "underspecified" in row:
        return "underspecified" if row["underspecified"] else "specified"
    return ""


def _pin_zip_times(path: Path) -> None:
    """Pin the zip entries' times, and docProps/core.xml's `modified`, which openpyxl sets to now on save."""
    with zipfile.ZipFile(path) as zin:
        entries = [(info, zin.read(info.filename)) for info in zin.infolist()]
    stamp = _FIXED_TIME.strftime("%Y-%m-%dT%H:%M:%SZ").encode()
    entries = [(info, re.sub(rb"(<dcterms:modified[^>]*>)[^<]*(</dcterms:modified>)", rb"\g<1>" + stamp + rb"\g<2>",
                             data) if info.filename == "docProps/core.xml" else data) for info, data in entries]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zout:
        for info, data in entries:
            fixed = zipfile.ZipInfo(info.filename, date_time=_FIXED_TIME.timetuple()[:6])
            fixed.compress_type = zipfile.ZIP_DEFLATED
            fixed.external_attr = info.external_attr
            zout.writestr(fixed, data)
