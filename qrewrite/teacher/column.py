"""``teacher.provider: column``: the tenant's own reference rewrites (the Excel column ``tenants[].columns.rewrite``,
carried by ingest as ``reference``) as the teacher. For a tenant that already has rewrites written by people or an
earlier model (the CQR tenant's gold rewrites, docs/data.md); no calls, no cost. An empty cell is a
failed row (``status: error``), never the question passed off as its rewrite."""

from __future__ import annotations


class ColumnTeacher:
    provider = "column"
    model = "tenant-reference"

    def __init__(self, column: str):
        self.column = column

    @property
    def params(self) -> dict:
        return {"column": self.column}

    def rewrite_row(self, row: dict) -> str | None:
        return (row.get("reference") or "").strip() or None
